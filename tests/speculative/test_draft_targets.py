"""Draft groups bound to targets (``docs/speculative.md``, "Draft groups bound to targets").

Every expectation is counted from the records or computed here from the curves' numbers and
the latency model's coefficients, never by the code under test.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from tests.spec_helpers import flat_curve, spec_scenario

BETA0_S, BETA2_S = 5e-3, 200e-6
"""The default latency model of ``spec_scenario``: 5 ms per step, 200 µs per decode token."""


def _run(data: dict[str, Any]):
    return Simulation(scenario_from_dict(data)).run(progress=False)


def two_targets(data: dict[str, Any], *, clusters: bool = False) -> dict[str, Any]:
    """*data* with its fleet as two one-replica groups, ``near`` (fleet index 0) and ``far`` (1),
    round robin (each in a cluster of its own, ``east`` and ``west``, with *clusters*)."""
    data = copy.deepcopy(data)
    serving = data["serving"]
    group = {"count": 1, "engine": serving.pop("engine"), "latency_model": serving.pop("latency_model")}
    serving.pop("replicas")
    groups = [{"name": "near", **group}, {"name": "far", **copy.deepcopy(group)}]
    if clusters:
        serving["clusters"] = [{"name": "east", "replica_groups": [groups[0]]}, {"name": "west", "replica_groups": [groups[1]]}]
        serving["cluster_router"] = {"kind": "round_robin"}
    else:
        serving["replica_groups"] = groups
        serving["router"] = {"kind": "round_robin"}
    return data


def two_groups(tmp_path: Path, targets: tuple[list[str], list[str]], *, clusters: bool = False) -> dict[str, Any]:
    """Two clients, ``a`` and ``b``, each drafted by its own group (``A``, ``B``) bound to *targets*."""
    curve = flat_curve(tmp_path, [0.7] * 4)
    data = spec_scenario(curve, requests=80, rate=20.0, output=30, devices=4)
    client = data["workload"]["clients"][0]
    data["workload"]["clients"] = [{**copy.deepcopy(client), "id": "a", "rate_fraction": 0.5},
                                   {**copy.deepcopy(client), "id": "b", "rate_fraction": 0.5}]
    group = data["speculation"]["drafts"][0]
    data["speculation"]["drafts"] = [
        {**copy.deepcopy(group), "name": "A", "clients": ["a"], **({"targets": targets[0]} if targets[0] else {})},
        {**copy.deepcopy(group), "name": "B", "clients": ["b"], **({"targets": targets[1]} if targets[1] else {})},
    ]
    return two_targets(data, clusters=clusters)


def test_each_group_is_verified_on_its_targets_only(tmp_path):
    """With group A bound to ``near`` and B to ``far``, every request of A is prefilled and
    verified on ``near`` only and every request of B on ``far`` (counted from the records and the
    rounds), where the same fleet unbound spreads both groups over both targets."""
    results = _run(two_groups(tmp_path, (["near"], ["far"])))
    records = results.to_dataframe()
    assert (records["status"] == "completed").all()
    assert sorted(set(records["draft_group"])) == ["A", "B"]
    assert (records.loc[records["draft_group"] == "A", "replica"] == 0).all()
    assert (records.loc[records["draft_group"] == "B", "replica"] == 1).all()
    rounds = results.spec_rounds()
    assert len(rounds) > 500
    assert (rounds["replica"] == np.where(rounds["draft_group"] == "A", 0, 1)).all()
    unbound = _run(two_groups(tmp_path, ([], []))).to_dataframe()
    assert unbound.groupby("draft_group")["replica"].nunique().to_dict() == {"A": 2, "B": 2}


def test_a_group_bound_to_a_cluster_is_routed_into_it_only(tmp_path):
    """Targets naming clusters hold at both levels of routing: A bound to ``east`` and B to
    ``west`` run every request on that cluster's replica."""
    records = _run(two_groups(tmp_path, (["east"], ["west"]), clusters=True)).to_dataframe()
    assert (records["status"] == "completed").all()
    assert records.groupby("draft_group")["replica"].agg(lambda r: sorted(set(r))).to_dict() == {"A": [0], "B": [1]}


def test_a_per_target_round_trip_shows_exactly_in_each_round(tmp_path):
    """One device, a 10 ms round trip and 50 ms to ``far`` (unlimited bandwidth, one request at a
    time): every round's TVT is the sum of its parts, ``γ d + rtt(target) + beta0 + beta2 (γ + 1)``
    (drafting, the trip up and down, and the verify pass), with the round trip of the target
    that verified it; each request's download time is half that round trip, and the bundles to
    ``far`` go up a link of their own (one message per round there)."""
    d_s = 0.002
    data = spec_scenario(flat_curve(tmp_path, [0.7] * 4), requests=20, rate=2.0, output=40, devices=1,
                         draft_token_ms=d_s * 1e3, network={"rtt_ms": 10.0},
                         group={"rtt_ms_by_target": {"far": 50.0}})
    results = _run(two_targets(data))
    rtt = np.array([0.010, 0.050])
    rounds = results.spec_rounds()
    assert set(rounds["replica"]) == {0, 1} and len(rounds) > 200
    gamma = rounds["gamma"].to_numpy()
    expected = gamma * d_s + rtt[rounds["replica"].to_numpy()] + BETA0_S + BETA2_S * (gamma + 1)
    assert np.abs(rounds["tvt_s"].to_numpy() - expected).max() < 1e-9
    records = results.to_dataframe()
    assert np.abs(records["download_s"].to_numpy() - rtt[records["replica"].to_numpy()] / 2).max() < 1e-12
    # Bundles to ``far`` take its own uplink; the prompts and the bundles to ``near``, the device's.
    links = results.links()
    links = links.set_index("link") if "link" in links.columns else links
    on_far = int((rounds["replica"] == 1).sum())
    assert links.loc["draft/phones/0/far/up", "messages"] == on_far
    assert links.loc["draft/phones/0/up", "messages"] == len(records) + len(rounds) - on_far


@pytest.mark.parametrize("sampling", ["bernoulli", "expected"])
def test_each_drafter_target_pair_accepts_as_its_own_curve(tmp_path, sampling):
    """A drafter with a 0.5 curve and, on ``far``, a 0.9 one: the mean drafts accepted per round of
    γ = 4 on each target is that pair's ``sum_{i<=4} p^i`` (0.9375 and 3.0951), exactly with
    ``expected`` sampling and within 4 standard errors of the rounds' own spread with draws."""
    poor, good = flat_curve(tmp_path, [0.5] * 4, "poor"), flat_curve(tmp_path, [0.9] * 4, "good")
    data = spec_scenario(poor, requests=200, rate=40.0, output=120, devices=20,
                         speculation={"gamma_policy": {"kind": "static", "params": {"gamma": 4}}, "acceptance_sampling": sampling},
                         group={"drafters": [{"name": "d0", "acceptance": poor, "draft_token_ms": 5.0,
                                              "acceptance_by_target": {"far": good}}]})
    rounds = _run(two_targets(data)).spec_rounds()
    full = rounds[rounds["gamma"] == 4]
    for replica, p in ((0, 0.5), (1, 0.9)):
        accepted = full.loc[full["replica"] == replica, "accepted"].to_numpy()
        assert len(accepted) > 2000
        closed_form = sum(p**i for i in range(1, 5))
        if sampling == "expected":
            assert np.abs(accepted - closed_form).max() < 1e-12
        else:
            se = accepted.std(ddof=1) / math.sqrt(len(accepted))
            assert abs(accepted.mean() - closed_form) < 4 * se


def test_without_per_target_settings_targets_change_nothing_but_routing(tmp_path):
    """A group bound to every target runs as an unbound one: records and rounds byte for byte."""
    bound, unbound = _run(two_groups(tmp_path, (["near", "far"], ["far", "near"]))), _run(two_groups(tmp_path, ([], [])))
    assert bound.to_dataframe().to_csv() == unbound.to_dataframe().to_csv()
    assert bound.spec_rounds().to_csv() == unbound.spec_rounds().to_csv()


def _refusal(data: dict[str, Any]) -> tuple[list[str], str]:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, source="s.yaml")
    return info.value.paths, info.value.problems[0][1]


@pytest.mark.parametrize(
    ("group", "path", "words"),
    [
        ({"targets": ["near", "nowhere"]}, "speculation.drafts[0].targets[1]", r"unknown target 'nowhere'.*near, far"),
        ({"network": {"rtt_ms": 5}, "rtt_ms_by_target": {"faraway": 50}}, "speculation.drafts[0].rtt_ms_by_target.faraway",
         r"unknown target 'faraway'"),
        ({"rtt_ms_by_target": {"far": 50}}, "speculation.drafts[0].rtt_ms_by_target", r"needs network"),
        ({"network": {"rtt_ms": 5}, "rtt_ms_by_target": {"far": -1}}, "speculation.drafts[0].rtt_ms_by_target.far", r"round trip in ms"),
        ({"targets": ["near"], "network": {"rtt_ms": 5}, "rtt_ms_by_target": {"far": 50}},
         "speculation.drafts[0].rtt_ms_by_target.far", r"none of the group's targets"),
        ({"targets": ["near", "near"]}, "speculation.drafts[0].targets", r"at most once"),
    ],
)
def test_bad_targets_are_refused_at_their_key_path(tmp_path, group, path, words):
    """Unknown target names, a per-target round trip without a network or out of range, one for a
    target the group may not use, and a repeated target are each refused at their key path."""
    data = two_targets(spec_scenario(flat_curve(tmp_path, [0.7] * 4), group=group))
    paths, message = _refusal(data)
    assert paths == [path]
    assert re.search(words, message), message


def test_a_per_target_curve_for_an_unknown_target_or_short_curve_is_refused(tmp_path):
    """A drafter's ``acceptance_by_target`` naming no target, or giving a curve shorter than
    ``k_max``, is refused at that key."""
    curve, short = flat_curve(tmp_path, [0.7] * 4), flat_curve(tmp_path, [0.7] * 2, "short")
    for by_target, path, words in (({"elsewhere": curve}, "acceptance_by_target.elsewhere", r"unknown target"),
                                   ({"far": short}, "acceptance_by_target.far", r"covers k up to 2, below k_max \(4\)")):
        data = two_targets(spec_scenario(curve, group={"drafters": [
            {"name": "d0", "acceptance": curve, "draft_token_ms": 5.0, "acceptance_by_target": by_target}]}))
        paths, message = _refusal(data)
        assert paths == [f"speculation.drafts[0].drafters[0].{path}"], paths
        assert re.search(words, message), message


def test_the_manifest_pins_per_target_curves_by_name(tmp_path):
    """A shipped curve named under ``acceptance_by_target`` is pinned in the run's manifest with
    its file and hash, as the drafter's own ``acceptance`` is."""
    import hashlib

    from simpy_llm.metrics.manifest import input_files
    from simpy_llm.speculative.curves import acceptance_model

    curve = flat_curve(tmp_path, [0.5] * 4)
    data = spec_scenario(curve, group={"drafters": [{"name": "d0", "acceptance": "illustrative-mobile", "draft_token_ms": 5.0,
                                                     "acceptance_by_target": {"far": "illustrative-laptop"}}]})
    files = input_files(scenario_from_dict(two_targets(data)))
    drafter = "speculation.drafts[0].drafters[0]"
    for key, name in ((f"{drafter}.acceptance", "illustrative-mobile"), (f"{drafter}.acceptance_by_target.far", "illustrative-laptop")):
        file = Path(acceptance_model(name).path)
        assert files[key]["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest(), key
