"""Validation of the ``speculation`` section: each mistake is a :class:`ScenarioError` whose
message names the file, the exact key path and what is allowed."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from simpy_llm import scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from tests.spec_helpers import flat_curve, spec_scenario

P4 = [0.8, 0.7, 0.6, 0.5]
"""Position probabilities of a curve covering k up to 4 (the helper's ``k_max``)."""


@pytest.fixture
def curve(tmp_path: Path) -> str:
    """A flat acceptance curve file covering 4 positions."""
    return flat_curve(tmp_path, P4)


def fused(curve: str) -> dict[str, Any]:
    return {"draft_token_ms": 1.0, "acceptance": curve}


def drafter(data: dict[str, Any]) -> dict[str, Any]:
    """The first drafter of the first draft group of *data* (to edit in place)."""
    return data["speculation"]["drafts"][0]["drafters"][0]


def error_of(data: dict[str, Any]) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, source="s.yaml")
    return info.value


def assert_problem(data: dict[str, Any], path: str, words: str) -> str:
    """Loading *data* fails with exactly one problem, at *path*, and the message (which
    names the file and the path) matches the regex *words*; returns the message."""
    exc = error_of(data)
    text = str(exc)
    assert exc.paths == [path], exc.problems
    assert text.startswith("s.yaml:"), text
    assert f"  {path}: " in text, text
    assert re.search(words, exc.problems[0][1]), exc.problems[0][1]
    return text


def test_base_speculation_scenario_is_valid(curve):
    """The scenario the mutations start from loads (so each failure below is its mutation's)."""
    spec = scenario_from_dict(spec_scenario(curve), source="s.yaml").speculation
    assert spec is not None
    assert spec.mode == "distributed" and spec.k_max == 4
    assert [g.name for g in spec.drafts] == ["phones"]


# --- modes ----------------------------------------------------------------------------
def test_hybrid_needs_a_mode_selector(curve):
    """``mode: hybrid`` without ``mode_selector`` names speculation.mode_selector as required with hybrid."""
    data = spec_scenario(curve, speculation={"mode": "hybrid", "fused": fused(curve)})
    assert_problem(data, "speculation.mode_selector", r"required with mode: hybrid")


def test_mode_selector_refused_when_distributed(curve):
    """A ``mode_selector`` with ``mode: distributed`` is refused: it applies only with hybrid."""
    data = spec_scenario(curve, speculation={"mode": "distributed", "mode_selector": {"kind": "latency"}})
    assert_problem(data, "speculation.mode_selector", r"applies only with mode: hybrid")


def test_fused_mode_needs_a_fused_section(curve):
    """``mode: fused`` without a ``fused`` section names speculation.fused as required with fused."""
    data = spec_scenario(curve, speculation={"mode": "fused"})
    assert_problem(data, "speculation.fused", r"required with mode: fused")


def test_fused_section_refused_when_distributed(curve):
    """A ``fused`` section with ``mode: distributed`` (and no fused KV spill) is refused, saying
    when it applies."""
    data = spec_scenario(curve, speculation={"mode": "distributed", "fused": fused(curve)})
    assert_problem(data, "speculation.fused", r"applies only with mode fused or hybrid.*kv_spill: fused")


# --- curves ---------------------------------------------------------------------------
def test_k_max_above_the_curve_is_refused(curve):
    """``k_max`` above what a drafter's curve covers names that drafter's acceptance, the
    curve's reach and k_max."""
    data = spec_scenario(curve, speculation={"k_max": 5})
    assert_problem(data, "speculation.drafts[0].drafters[0].acceptance", r"covers k up to 4, below k_max \(5\)")


def test_k_max_above_the_fused_curve_is_refused(tmp_path, curve):
    """The fused draft model's curve must cover k_max too: a shorter one names speculation.fused.acceptance."""
    short = flat_curve(tmp_path, [0.9, 0.8], name="short")
    data = spec_scenario(curve, speculation={"mode": "fused", "fused": fused(short)})
    assert_problem(data, "speculation.fused.acceptance", r"covers k up to 2, below k_max \(4\)")


# --- drafters and draft groups --------------------------------------------------------
def test_drafter_with_both_speeds_is_refused(curve):
    """A drafter giving both ``draft_token_ms`` and ``weights_gb`` is told to give exactly one."""
    data = spec_scenario(curve)
    drafter(data)["weights_gb"] = 1.0
    assert_problem(data, "speculation.drafts[0].drafters[0].draft_token_ms", r"exactly one of draft_token_ms and weights_gb")


def test_drafter_with_neither_speed_is_refused(curve):
    """A drafter giving neither ``draft_token_ms`` nor ``weights_gb`` is told to give exactly one."""
    data = spec_scenario(curve)
    del drafter(data)["draft_token_ms"]
    assert_problem(data, "speculation.drafts[0].drafters[0].draft_token_ms", r"exactly one of draft_token_ms and weights_gb")


def test_weights_gb_needs_the_group_device(curve):
    """``weights_gb`` without the group's ``device`` names speculation.drafts[0].device as required,
    saying the speed needs the device's memory bandwidth."""
    data = spec_scenario(curve)
    del drafter(data)["draft_token_ms"]
    drafter(data)["weights_gb"] = 1.0
    assert_problem(data, "speculation.drafts[0].device", r"required.*weights_gb.*memory bandwidth")


def test_draft_group_on_a_target_device_is_refused(curve):
    """A draft group whose ``device`` is a target device (h100-sxm) is refused, naming the device
    and saying a draft group runs on a draft (or any) device."""
    data = spec_scenario(curve, group={"device": "h100-sxm"})
    assert_problem(data, "speculation.drafts[0].device", r"'h100-sxm' is a target device.*draft \(or any\) device")


def test_draft_group_naming_an_unknown_client_is_refused(curve):
    """A draft group naming a client the workload does not have names its clients key, the
    unknown client and the clients there are."""
    data = spec_scenario(curve, group={"clients": ["nope"]})
    assert_problem(data, "speculation.drafts[0].clients", r"no workload client 'nope'; clients: c0")


def test_two_groups_naming_the_same_client_is_refused(curve):
    """A client claimed by two draft groups names the second group's clients and the group that
    already runs it."""
    data = spec_scenario(curve, group={"clients": ["c0"]})
    second = copy.deepcopy(data["speculation"]["drafts"][0])
    second["name"] = "laptops"
    data["speculation"]["drafts"].append(second)
    assert_problem(data, "speculation.drafts[1].clients", r"client 'c0' is already run by draft group 'phones'")


# --- what speculation cannot run with -------------------------------------------------
def test_client_network_refused_with_speculation(curve):
    """A workload client with its own ``network`` while speculation is on is refused: the
    message says to give the network to the draft group."""
    data = spec_scenario(curve)
    data["workload"]["clients"][0]["network"] = {"rtt_ms": 10.0, "bandwidth_mbps": 10.0}
    assert_problem(data, "workload.clients[0].network", r"give the network to the draft group")


def test_verify_prefix_caching_refused_with_disaggregation(curve):
    """Speculation runs on a disaggregated fleet, but not with ``verify.prefix_caching``: a
    decode-pool verify server receives each prompt's KV whole."""
    data = spec_scenario(curve, replicas=2, speculation={"verify": {"prefix_caching": True}})
    data["serving"]["disaggregation"] = {"prefill_replicas": 1, "kv_transfer": {"bytes_per_token": 1000.0}}
    assert_problem(data, "speculation.verify.prefix_caching", r"receives each prompt's KV whole")


# --- verify ---------------------------------------------------------------------------
def test_sample_rate_needs_sampled_partial_verification(curve):
    """``verify.sample_rate`` without ``partial: sampled`` is refused, saying where it applies."""
    data = spec_scenario(curve, speculation={"verify": {"sample_rate": 0.5}})
    assert_problem(data, "speculation.verify.sample_rate", r"applies only with partial: sampled")


def test_rollback_penalty_refused_with_full_verification(curve):
    """``rollback_penalty_ms`` with ``partial: all`` is refused: it applies only with partial verification."""
    data = spec_scenario(curve, speculation={"verify": {"partial": "all", "rollback_penalty_ms": 2.0}})
    assert_problem(data, "speculation.verify.rollback_penalty_ms", r"applies only with partial verification \(sampled or first_token\)")


def test_unknown_verify_order_lists_the_orders(curve):
    """An unknown ``verify.order`` lists the orders there are."""
    data = spec_scenario(curve, speculation={"verify": {"order": "random"}})
    assert_problem(data, "speculation.verify.order", r"one of fcfs, edf, least_slack")


# --- keys and policies ----------------------------------------------------------------
def test_unknown_key_under_speculation_lists_the_allowed_keys(curve):
    """An unknown key under ``speculation`` names speculation.bogus and lists the allowed keys."""
    data = spec_scenario(curve, speculation={"bogus": 1})
    text = assert_problem(data, "speculation.bogus", r"unknown key; allowed: ")
    for key in ("mode", "drafts", "k_max", "gamma_policy", "mode_selector", "fused", "verify"):
        assert key in text


def test_unknown_mode_lists_the_modes(curve):
    """An unknown ``speculation.mode`` lists distributed, fused and hybrid."""
    data = spec_scenario(curve, speculation={"mode": "weird"})
    assert_problem(data, "speculation.mode", r"one of distributed, fused, hybrid")


def test_unknown_gamma_policy_lists_the_policies(curve):
    """An unknown γ policy kind names speculation.gamma_policy.kind and lists the registered policies."""
    data = spec_scenario(curve, speculation={"gamma_policy": {"kind": "nosuch"}})
    text = assert_problem(data, "speculation.gamma_policy.kind", r"unknown gamma policy 'nosuch'; one of: ")
    for kind in ("static", "acceptance_backoff", "specpp"):
        assert kind in text


def test_unknown_mode_selector_lists_the_selectors(curve):
    """An unknown mode selector kind names speculation.mode_selector.kind and lists the selectors."""
    data = spec_scenario(curve, speculation={"mode": "hybrid", "mode_selector": {"kind": "nosuch"}, "fused": fused(curve)})
    text = assert_problem(data, "speculation.mode_selector.kind", r"unknown mode selector 'nosuch'; one of: ")
    for kind in ("latency", "rtt_load_adaptive", "gamma_head"):
        assert kind in text
