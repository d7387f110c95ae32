"""The target chooses the next round's γ as it sends the verdict, so a draft device can plan
that round then (``Link.put_ahead``): one event fewer per round and not one figure changed."""

from __future__ import annotations

from typing import ClassVar

import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.network.link import Link
from simpy_llm.policies.gamma import gamma_policies
from simpy_llm.speculative.draft import DraftDevice, DraftFleet
from tests.spec_helpers import flat_curve, spec_scenario

NETWORK = {"rtt_ms": 30, "bandwidth_mbps": 2, "rtt_jitter_ms": 3, "bandwidth_jitter": 0.2}


POLICIES = {
    "static": {"kind": "static", "params": {"gamma": 3}},
    "backpressure": {"kind": "backpressure", "params": {"wait_high_s": 0.02, "wait_low_s": 0.005}},
}


def _scenario(tmp_path, policy="static", **simulation):
    data = spec_scenario(
        flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5]), requests=120, rate=20.0, devices=6, network=NETWORK, replicas=2,
        speculation={"gamma_policy": POLICIES[policy]},
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


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("until_s", [None, 4.0], ids=["to the end", "stopped mid-run"])
def test_the_lookahead_changes_no_figure(tmp_path, monkeypatch, until_s, policy):
    """Records, rounds, link figures and the summary (drafting time included) are identical
    with the lookahead and without it, run to the end or stopped with rounds in flight,
    under a static γ and under one that reads the target's telemetry."""
    settings = {"until_s": until_s} if until_s is not None else {}
    ahead = Simulation(_scenario(tmp_path, policy, **settings)).run(progress=False)
    monkeypatch.setattr(Link, "put_ahead", lambda self, payload, size_bytes: None)
    plain = Simulation(_scenario(tmp_path, policy, **settings)).run(progress=False)
    assert _figures(ahead) == _figures(plain)
    assert ahead.summary()["speculation"]["rounds"] > 250


@pytest.mark.parametrize("policy", list(POLICIES))
def test_the_lookahead_saves_the_verdicts_event(tmp_path, monkeypatch, policy):
    """With the lookahead a round costs one event fewer: one per verdict that continues its
    request (the prefill's, and every round's but the last), whatever the γ policy."""
    ahead = Simulation(_scenario(tmp_path, policy)).run(progress=False)
    monkeypatch.setattr(Link, "put_ahead", lambda self, payload, size_bytes: None)
    plain = Simulation(_scenario(tmp_path, policy)).run(progress=False)
    # Each request's verdicts that continue it: the prefill's, and every round's but its last.
    assert plain.events - ahead.events == len(ahead.spec_rounds())


class _Probe:
    """Answers γ from the target's queue wait and logs the wait it was shown (test only)."""

    seen: ClassVar[list[float]] = []

    def next_gamma(self, state):
        _Probe.seen.append(state.verify_queue_wait_s)
        return 1 + int(state.verify_queue_wait_s / 0.004) % 4


def test_gamma_reads_the_targets_telemetry_as_the_verdict_leaves(tmp_path, monkeypatch):
    """The policy sees the target's verify queue wait as the target sends the verdict (it
    chooses γ there), not as it is a download later when the verdict reaches the device;
    with a slow downlink the two differ for most rounds, so the test tells them apart."""
    gamma_policies.register("probe_test")(_Probe)
    monkeypatch.setattr(_Probe, "seen", [])
    at_send: list[float] = []
    at_delivery: list[float] = []
    send_verdict, next_round = DraftFleet.send_verdict, DraftDevice.next_round

    def logged_send(self, req, tokens):
        if req.completion_s != req.completion_s and not req.dropped_reason:
            at_send.append(self.servers[req.replica].queue_wait_s)
        send_verdict(self, req, tokens)

    def logged_round(self, req, at_s):
        at_delivery.append(self.fleet.servers[req.replica].queue_wait_s)
        next_round(self, req, at_s)

    monkeypatch.setattr(DraftFleet, "send_verdict", logged_send)
    monkeypatch.setattr(DraftDevice, "next_round", logged_round)
    monkeypatch.setattr(Link, "put_ahead", lambda self, payload, size_bytes: None)  # rounds start on delivery
    data = spec_scenario(
        flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5]), requests=80, rate=20.0, devices=8,
        network={"rtt_ms": 200, "bandwidth_mbps": 1}, speculation={"gamma_policy": {"kind": "probe_test"}},
    )
    try:
        results = Simulation(scenario_from_dict(data)).run(progress=False)
    finally:
        gamma_policies._items.pop("probe_test")  # noqa: SLF001 - undo the registration
    assert len(_Probe.seen) == len(at_send) == len(at_delivery) > 500
    assert _Probe.seen == at_send
    assert sum(a != b for a, b in zip(at_send, at_delivery, strict=True)) > len(at_send) / 2
    assert len(results.spec_rounds()) == len(at_send)  # one verdict before each round: the prefill's, then the rounds'
