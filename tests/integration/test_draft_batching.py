"""Draft-side batching (``docs/speculative.md``, "Draft-side batching") against closed forms,
and the shipped speculative scenarios unchanged with it off.

The expectations are computed by hand from the drafter's latency coefficients, the device's
``max_batch`` and ``max_wait_ms`` and the request lengths; the targets verify in no time (a
latency model registered here), so the device's draft steps are the only clock.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.loading import load_scenario
from simpy_llm.serving.devices import device_profile, device_profile_to_dict
from simpy_llm.serving.latency_base import LatencyModelBase, latency_models
from simpy_llm.speculative.draft import DraftDevice
from tests.spec_helpers import flat_curve, spec_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

SHIPPED = [
    "speculative_mobile_cloud.yaml", "speculative_modes.yaml", "seed003_speculative_single_target.yaml",
    "seed003_speculative_heterogeneous_cluster.yaml", "seed003_speculative_multi_cluster.yaml",
]
"""The shipped speculative scenarios (none sets ``max_batch``)."""


class InstantTarget(LatencyModelBase):
    """A target whose every pass takes no time (test only): rounds come back at once."""

    __slots__ = ()
    output_token_overhead_s = 0.0

    def step_time_s(self, prefill_tokens, decode_tokens, decode_context_tokens=0, prefill_attention_pairs=0):
        return 0.0

    def queueing_time_s(self, prompt_tokens):
        return 0.0


@pytest.fixture
def instant_target():
    """Registers ``instant`` as a latency model kind for the test's duration."""
    latency_models.register("instant")(InstantTarget)
    yield {"kind": "instant"}
    latency_models._items.pop("instant")  # noqa: SLF001 - unregister the test's kind


def _closed(tmp_path: Path) -> str:
    """The shipped phone profile, out of service during [0, 1) s: every request bound before
    1 s starts at exactly 1 s."""
    data = device_profile_to_dict(device_profile("phone-snapdragon-8-gen-3"))
    data.update(id="test-phone", availability=[{"start_s": 0.0, "end_s": 1.0}])
    data.pop("thermal", None)
    path = tmp_path / "phone.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _scenario(tmp_path, target, *, requests, max_batch, drafter, output, gamma=4, max_wait_ms=0.0, device=True):
    """One device running *requests* requests that all arrive in the first millisecond, every
    draft accepted (each round of γ drafts makes γ + 1 tokens), an instant target."""
    curve = flat_curve(tmp_path, [1.0] * 4)
    group = {"max_batch": max_batch, "drafters": [{"name": "d0", "acceptance": curve, **drafter}]}
    if max_wait_ms:
        group["max_wait_ms"] = max_wait_ms
    if device:
        group["device"] = _closed(tmp_path)
    return spec_scenario(
        curve, requests=requests, rate=1e6, prompt=16, output=output, devices=1, latency=target, group=group,
        speculation={"gamma_policy": {"kind": "static", "params": {"gamma": gamma}}, "acceptance_sampling": "expected"},
    )


def _run(data):
    return Simulation(scenario_from_dict(data)).run(progress=False)


@pytest.mark.parametrize("name", SHIPPED)
def test_with_batching_off_the_shipped_scenarios_build_the_unbatched_devices(name):
    """With every group's ``max_batch`` at its default 1, each shipped speculative scenario's draft
    devices are the one-request-at-a-time kind (the code path the simulator had before draft-side
    batching), so their results are those it gave."""
    scenario = load_scenario(SCENARIOS / name)
    assert scenario.speculation is not None and all(group.max_batch == 1 for group in scenario.speculation.drafts)
    sim = Simulation(scenario)
    assert sim.draft_fleet is not None
    devices = [device for group in sim.draft_fleet.devices.values() for device in group]
    assert devices and all(type(device) is DraftDevice for device in devices)


@pytest.mark.parametrize(
    ("batch", "a_us", "b_us"),
    [(1, 3000.0, 500.0), (4, 3000.0, 500.0), (8, 3000.0, 500.0), (8, 1000.0, 2000.0), (5, 2500.0, 0.0)],
)
def test_a_saturated_device_drafts_batch_over_step_time_tokens_per_second(tmp_path, instant_target, batch, a_us, b_us):
    """Three cohorts of ``max_batch`` always-ready requests (every verdict comes back at once)
    on one device whose drafter's step is ``a + b n``: every step is full, so the device
    drafts ``B / (a + b B)`` tokens per second, counted from the rounds' γ over the span from
    the device's return to service (1 s) to the last completion."""
    gamma, rounds = 4, 6
    output = 1 + rounds * (gamma + 1)
    drafter = {"latency_model": {"kind": "blis_linear", "params": {"beta0_us": a_us, "beta2_us": b_us}}}
    results = _run(_scenario(tmp_path, instant_target, requests=3 * batch, max_batch=batch, drafter=drafter, output=output))
    frame = results.to_dataframe()
    assert (frame["status"] == "completed").all()
    drafted = int(results.spec_rounds()["gamma"].sum())
    assert drafted == 3 * batch * rounds * gamma
    step_s = (a_us + b_us * batch) / 1e6
    span = frame["completion_s"].max() - 1.0
    assert drafted / span == pytest.approx(batch / step_s, rel=1e-9)


def test_every_round_of_a_full_batch_takes_gamma_steps_of_the_batch(tmp_path, instant_target):
    """In a saturated device each round (from its previous verdict to its own) takes exactly
    γ steps at the full batch, ``γ (a + b B)``, for every round of every request."""
    gamma, batch = 3, 6
    drafter = {"latency_model": {"kind": "blis_linear", "params": {"beta0_us": 2000.0, "beta2_us": 250.0}}}
    data = _scenario(tmp_path, instant_target, requests=2 * batch, max_batch=batch, drafter=drafter, output=1 + 5 * (gamma + 1), gamma=gamma)
    results = _run(data)
    rounds = results.spec_rounds()
    first = results.to_dataframe().set_index("request_id")["first_token_s"]
    for rid, group in rounds.groupby("request_id"):
        ends = np.concatenate([[first[rid]], group["time_s"].to_numpy()])
        assert np.allclose(np.diff(ends), gamma * (2000.0 + 250.0 * batch) / 1e6, rtol=0, atol=1e-12), rid


def test_without_a_latency_model_a_step_costs_one_tokens_time_at_any_batch(tmp_path, instant_target):
    """A drafter given by ``draft_token_ms`` drafts a batch of B in one token's time: a
    saturated device drafts ``B / draft_token_ms`` tokens per second."""
    batch, d_ms, gamma, rounds = 4, 5.0, 4, 5
    data = _scenario(tmp_path, instant_target, requests=2 * batch, max_batch=batch, drafter={"draft_token_ms": d_ms},
                     output=1 + rounds * (gamma + 1))
    results = _run(data)
    drafted = int(results.spec_rounds()["gamma"].sum())
    span = results.to_dataframe()["completion_s"].max() - 1.0
    assert drafted == 2 * batch * rounds * gamma
    assert drafted / span == pytest.approx(batch / (d_ms / 1e3), rel=1e-9)


def test_a_lone_round_waits_max_wait_for_company(tmp_path, instant_target):
    """One request on a device with ``max_batch`` 2 and ``max_wait_ms`` w: each of its rounds
    opens a batch that never fills, so it drafts w after its verdict, in γ steps of one:
    every round takes ``w + γ (a + b)``."""
    gamma, w_ms = 4, 7.0
    drafter = {"latency_model": {"kind": "blis_linear", "params": {"beta0_us": 3000.0, "beta2_us": 500.0}}}
    data = _scenario(tmp_path, instant_target, requests=1, max_batch=2, drafter=drafter, output=1 + 6 * (gamma + 1),
                     max_wait_ms=w_ms, device=False)
    results = _run(data)
    times = results.spec_rounds()["time_s"].to_numpy()
    start = results.to_dataframe()["first_token_s"].iloc[0]
    gaps = np.diff(np.concatenate([[start], times]))
    assert len(gaps) == 6
    assert np.allclose(gaps, w_ms / 1e3 + gamma * 3.5e-3, rtol=0, atol=1e-12)


def test_a_full_batch_starts_without_waiting(tmp_path, instant_target):
    """With ``max_batch`` 2 and two requests in step, the batch is full as soon as both
    verdicts are in, so the long ``max_wait_ms`` never applies: a round takes ``γ (a + 2 b)``."""
    gamma = 4
    drafter = {"latency_model": {"kind": "blis_linear", "params": {"beta0_us": 3000.0, "beta2_us": 500.0}}}
    data = _scenario(tmp_path, instant_target, requests=2, max_batch=2, drafter=drafter, output=1 + 3 * (gamma + 1), max_wait_ms=500.0)
    results = _run(data)
    rounds = results.spec_rounds()
    first = results.to_dataframe().set_index("request_id")["first_token_s"]
    for rid, group in rounds.groupby("request_id"):
        gaps = np.diff(np.concatenate([[first[rid]], group["time_s"].to_numpy()]))
        assert np.allclose(gaps, gamma * 4e-3, rtol=0, atol=1e-12), rid


def test_a_device_runs_at_most_max_batch_requests_at_once(tmp_path, instant_target):
    """Ten requests on a device with ``max_batch`` 4: the fifth starts exactly when one of the
    first four ends (no think time), and no more than four are ever in progress."""
    drafter = {"latency_model": {"kind": "blis_linear", "params": {"beta0_us": 3000.0, "beta2_us": 500.0}}}
    frame = _run(_scenario(tmp_path, instant_target, requests=10, max_batch=4, drafter=drafter, output=21)).to_dataframe()
    starts = (frame["arrival_s"] - frame["upload_s"]).to_numpy()
    ends = frame["completion_s"].to_numpy()
    for t in starts:
        assert ((starts <= t) & (ends > t)).sum() <= 4
    assert (np.sort(starts)[:4] == 1.0).all()
    assert np.sort(starts)[4] == np.sort(ends)[0]


def test_batching_is_reproducible_and_takes_effect(tmp_path):
    """On a networked scenario, batching (``max_batch`` 4, ``max_wait_ms`` 2) gives the same
    records twice, and records other than those of the default one-at-a-time device."""
    curve = flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5])
    network = {"rtt_ms": 20.0, "bandwidth_mbps": 10.0, "rtt_jitter_ms": 2.0}

    def data(**group):
        return spec_scenario(curve, requests=60, rate=30.0, devices=3, network=network, group=group)

    first = _run(data(max_batch=4, max_wait_ms=2.0)).to_dataframe()
    second = _run(data(max_batch=4, max_wait_ms=2.0)).to_dataframe()
    alone = _run(data()).to_dataframe()
    assert first.to_csv() == second.to_csv()
    assert first.to_csv() != alone.to_csv()
    assert (first["status"] == "completed").all()
