"""Fairness cohorts (``metrics.fairness.cohorts``): the summary's groups, counted by hand from
the records table (latencies from the raw times, SLO judged in the test), equal the summary's."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from tests.helpers import tiny_scenario
from tests.spec_helpers import flat_curve, spec_scenario

SLO = {"chat": {"ttft_s": 0.05, "e2e_s": 0.4}, "batch": {"ttft_s": 0.2, "e2e_s": 1.0}}
EDGES = [0, 64, 128]


def scenario(cohorts: list[dict[str, Any]]) -> dict[str, Any]:
    """Two clients (short chat prompts and long batch ones) on one small replica, loaded so
    that some requests miss their SLO; *cohorts* as the fairness cohorts."""
    data = tiny_scenario(seed=3)
    base = data["workload"]["clients"][0]
    data["workload"].update({"aggregate_rate": 60.0, "num_requests": 400})
    data["workload"]["clients"] = [
        {**copy.deepcopy(base), "id": "chat", "tenant_id": "t1", "rate_fraction": 0.6, "slo_class": "chat",
         "input_distribution": {"type": "exponential", "params": {"mean": 40}}},
        {**copy.deepcopy(base), "id": "batch", "tenant_id": "t2", "rate_fraction": 0.4, "slo_class": "batch",
         "input_distribution": {"type": "exponential", "params": {"mean": 150}}},
    ]
    data["slo"] = copy.deepcopy(SLO)
    data["metrics"] = {"fairness": {"cohorts": cohorts}}
    return data


def by_hand(frame: pd.DataFrame, labels: pd.Series, slo: dict[str, dict[str, float]] | None) -> dict[str, dict[str, Any]]:
    """Per group of *labels*: measured requests, completions, SLO-meeting completions (from the raw
    times: TTFT = first token - arrival, E2E = completion - arrival), shares, and the gap."""
    measured = frame["warm_up"] == 0
    done = frame["status"] == "completed"
    ttft = frame["first_token_s"] - frame["arrival_s"]
    e2e = frame["completion_s"] - frame["arrival_s"]
    met = done.copy()
    if slo:
        limits = frame["slo_class"].map({k: v["ttft_s"] for k, v in slo.items()})
        e2e_limits = frame["slo_class"].map({k: v["e2e_s"] for k, v in slo.items()})
        met = done & (ttft <= limits) & (e2e <= e2e_limits)
    groups = {}
    for name in sorted(set(labels[measured])):
        rows = measured & (labels == name)
        n, c, m = int(rows.sum()), int((rows & done).sum()), int((rows & met).sum())
        groups[name] = {"requests": n, "completed": c, "met": m, "completed_share": c / n,
                        "slo_attainment": (m / c if c else None) if slo else None}
    attainment = [g["slo_attainment"] for g in groups.values() if g["slo_attainment"] is not None]
    return {"groups": groups, "attainment_gap": max(attainment) - min(attainment) if attainment else None}


def assert_cohort(summary: dict[str, Any], hand: dict[str, Any]) -> None:
    """The summary's cohort equals the hand count: the same groups, counts and shares (1e-12)."""
    assert set(summary["groups"]) == set(hand["groups"])
    for name, want in hand["groups"].items():
        got = summary["groups"][name]
        assert (got["requests"], got["completed"], got["met"]) == (want["requests"], want["completed"], want["met"]), name
        assert got["completed_share"] == pytest.approx(want["completed_share"], abs=1e-12)
        assert (got["slo_attainment"] is None) == (want["slo_attainment"] is None)
        if want["slo_attainment"] is not None:
            assert got["slo_attainment"] == pytest.approx(want["slo_attainment"], abs=1e-12)
    if hand["attainment_gap"] is None:
        assert summary["attainment_gap"] is None
    else:
        assert summary["attainment_gap"] == pytest.approx(hand["attainment_gap"], abs=1e-12)


def test_cohorts_by_client_tenant_class_and_prompt_bins_equal_the_hand_count():
    """Cohorts by client, tenant, SLO class and prompt-length bins report, per group, the
    measured requests, completions, SLO-meeting completions, completed share, attainment and
    the attainment gap that the records table gives when counted by hand."""
    results = Simulation(scenario_from_dict(scenario([
        {"by": "client"}, {"by": "tenant"}, {"by": "slo_class"},
        {"name": "prompt_length", "by": "prompt_tokens", "bins": EDGES},
    ]))).run(progress=False)
    frame = results.to_dataframe()
    cohorts = results.summary()["fairness"]["cohorts"]
    assert list(cohorts) == ["client", "tenant", "slo_class", "prompt_length"]
    bins = pd.Series(np.select([frame["prompt_tokens"] < 64, frame["prompt_tokens"] < 128], ["0-63", "64-127"], "128+"), index=frame.index)
    for name, labels in (("client", frame["client_id"]), ("tenant", frame["tenant_id"]),
                         ("slo_class", frame["slo_class"]), ("prompt_length", bins)):
        hand = by_hand(frame, labels.astype(object), SLO)
        assert_cohort(cohorts[name], hand)
    # The load makes the cohorts differ (the check above is not of equal groups only).
    assert cohorts["client"]["attainment_gap"] > 0.05
    assert list(cohorts["prompt_length"]["groups"]) == ["0-63", "64-127", "128+"]  # edge order
    assert cohorts["prompt_length"]["by"] == "prompt_tokens"


def test_cohorts_by_draft_group_and_device_equal_the_hand_count(tmp_path):
    """With speculation, cohorts by draft group and by draft device (``<group>/<index>``) equal the
    hand count; without SLOs the attainment and the gap are None."""
    data = spec_scenario(flat_curve(tmp_path, [0.7] * 4), requests=60, rate=10.0, output=30, devices=3)
    data["metrics"] = {"fairness": {"cohorts": [{"by": "draft_group"}, {"by": "draft_device"}]}}
    results = Simulation(scenario_from_dict(data)).run(progress=False)
    frame = results.to_dataframe()
    cohorts = results.summary()["fairness"]["cohorts"]
    assert_cohort(cohorts["draft_group"], by_hand(frame, frame["draft_group"].astype(object), None))
    devices = frame["draft_group"].astype(str) + "/" + frame["draft_device"].astype(str)
    assert_cohort(cohorts["draft_device"], by_hand(frame, devices.astype(object), None))
    assert set(cohorts["draft_device"]["groups"]) == {"phones/0", "phones/1", "phones/2"}
    assert cohorts["draft_device"]["attainment_gap"] is None


def test_without_cohorts_the_fairness_summary_is_as_before():
    """A scenario without ``metrics`` reports no ``cohorts`` key: the fairness summary is the
    per-tenant one only."""
    data = scenario([])
    del data["metrics"]
    fairness = Simulation(scenario_from_dict(data)).run(progress=False).summary()["fairness"]
    assert set(fairness) == {"tenants", "completed_share", "inverse_normalized_e2e"}
    assert not math.isnan(fairness["completed_share"]["jain"])


@pytest.mark.parametrize(
    ("cohorts", "path", "words"),
    [
        ([{"by": "prompt_tokens"}], "metrics.fairness.cohorts[0].bins", r"required with by: prompt_tokens"),
        ([{"by": "client", "bins": [0, 10]}], "metrics.fairness.cohorts[0].bins", r"applies only with by"),
        ([{"by": "output_tokens", "bins": [0, 64, 64]}], "metrics.fairness.cohorts[0].bins[2]", r"increase strictly"),
        ([{"by": "device"}], "metrics.fairness.cohorts[0].by", r"one of"),
        ([{"by": "client"}, {"by": "client"}], "metrics.fairness.cohorts", r"unique"),
        ([{"by": "draft_group"}], "metrics.fairness.cohorts[0].by", r"needs speculation"),
        ([{"by": "cluster"}], "metrics.fairness.cohorts[0].by", r"needs serving.clusters"),
    ],
)
def test_bad_cohorts_are_refused_at_their_key_path(cohorts, path, words):
    """Missing or misplaced bins, edges out of order, an unknown key, a repeated name and a key
    the scenario's records cannot tell apart are refused, naming the key path."""
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(scenario(cohorts), source="s.yaml")
    assert info.value.paths == [path], info.value.problems
    assert re.search(words, info.value.problems[0][1]), info.value.problems[0][1]
