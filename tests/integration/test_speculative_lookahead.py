"""Under a static γ a draft device plans its next round when the target sends the verdict
(``Link.put_ahead``): one event fewer per round and not one figure changed."""

from __future__ import annotations

import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.network.link import Link
from tests.spec_helpers import flat_curve, spec_scenario

NETWORK = {"rtt_ms": 30, "bandwidth_mbps": 2, "rtt_jitter_ms": 3, "bandwidth_jitter": 0.2}


def _scenario(tmp_path, **simulation):
    data = spec_scenario(
        flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5]), requests=120, rate=20.0, devices=6, network=NETWORK, replicas=2,
        speculation={"gamma_policy": {"kind": "static", "params": {"gamma": 3}}},
    )
    data.setdefault("simulation", {}).update(simulation)
    return scenario_from_dict(data)


def _figures(results):
    summary = results.summary()
    summary.pop("run", None)
    return (
        results.to_dataframe().to_csv(index=False),
        results.spec_rounds().to_csv(index=False),
        results.links().to_csv(index=False),
        repr(summary),
    )


@pytest.mark.parametrize("until_s", [None, 4.0], ids=["to the end", "stopped mid-run"])
def test_the_lookahead_changes_no_figure(tmp_path, monkeypatch, until_s):
    """Records, rounds, link figures and the summary (drafting time included) are identical
    with the lookahead and without it, run to the end or stopped with rounds in flight."""
    settings = {"until_s": until_s} if until_s is not None else {}
    ahead = Simulation(_scenario(tmp_path, **settings)).run(progress=False)
    monkeypatch.setattr(Link, "put_ahead", lambda self, payload, size_bytes: None)
    plain = Simulation(_scenario(tmp_path, **settings)).run(progress=False)
    assert _figures(ahead) == _figures(plain)
    assert ahead.summary()["speculation"]["rounds"] > 300


def test_the_lookahead_saves_the_verdicts_event(tmp_path, monkeypatch):
    """With the lookahead a round costs one event fewer: one per verdict that continues its
    request (the prefill's, and every round's but the last)."""
    ahead = Simulation(_scenario(tmp_path)).run(progress=False)
    monkeypatch.setattr(Link, "put_ahead", lambda self, payload, size_bytes: None)
    plain = Simulation(_scenario(tmp_path)).run(progress=False)
    # Each request's verdicts that continue it: the prefill's, and every round's but its last.
    assert plain.events - ahead.events == len(ahead.spec_rounds())
