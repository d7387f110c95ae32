"""Oracle γ labels per arrival: each request labelled with the action that gave it the least TPOT."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pandas as pd
import pytest

from simpy_llm import scenario_from_dict
from simpy_llm.config.schema import Scenario
from simpy_llm.explore.gamma_head import ARRIVAL_LABEL_COLUMNS, _simulate, oracle_labels
from simpy_llm.loading import scenario_to_dict
from simpy_llm.policies.gamma import GammaState, gamma_policies
from simpy_llm.policies.latency_head import LATENCY_HEAD_FEATURES
from simpy_llm.simulation import Simulation
from tests.spec_helpers import flat_curve, spec_scenario

RTT = (0.0, 1.0)
GAMMAS = (2, 4)
BASE = 3


def _scenario(tmp_path: Path) -> Scenario:
    """Twenty requests from four phones 40 ms from one target (drafting nearly free on the phones,
    1 ms per fused draft token on the target); acceptance drawn per position, so requests differ."""
    curve = flat_curve(tmp_path, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    return scenario_from_dict(spec_scenario(
        curve, requests=20, output=30, draft_token_ms=0.01, network={"rtt_ms": 40},
        speculation={"k_max": 6, "mode": "fused", "fused": {"draft_token_ms": 1.0, "acceptance": curve}},
    ))


def _run(scenario: Scenario, rtt_multiplier: float, mode: str, gamma: int | dict[str, Any]) -> pd.DataFrame:
    """The request table of *scenario* with its round trip scaled, in *mode* at a static γ (or the policy given)."""
    policy = gamma if isinstance(gamma, dict) else {"kind": "static", "params": {"gamma": gamma}}
    changes: dict[str, Any] = {
        "speculation.drafts.0.network.rtt_ms": 40 * rtt_multiplier, "speculation.mode": mode,
        "speculation.mode_selector": None, "speculation.gamma_policy": policy,
    }
    if mode == "distributed":
        changes["speculation.fused"] = None
    return Simulation(scenario.replace(**changes)).run(progress=False).to_dataframe()


def test_per_arrival_labels_are_each_requests_argmin_of_tpot(tmp_path: Path) -> None:
    """Each row's label and latency are, for its request id, the action (fused = 1, or a distributed γ)
    of least TPOT over separate runs of each action, ties to the smaller γ; one row per condition and request."""
    scenario = _scenario(tmp_path)
    labels = oracle_labels(scenario, rtt_multipliers=RTT, load_multipliers=(1,), gammas=GAMMAS, base_gamma=BASE, per="arrival")
    assert list(labels.columns) == list(ARRIVAL_LABEL_COLUMNS)
    expected = []
    for r in RTT:
        tables = {1: _run(scenario, r, "fused", BASE)} | {g: _run(scenario, r, "distributed", g) for g in GAMMAS}
        tpot = pd.DataFrame({label: t.set_index("request_id")["tpot_s"] for label, t in tables.items()}).fillna(math.inf)
        for request_id, row in tpot.iterrows():
            best = min(row.index)
            for label in sorted(row.index):  # strictly less: a tie keeps the smaller γ
                if row[label] < row[best]:
                    best = label
            expected.append((r, request_id, best, row[best]))
    got = list(zip(labels["rtt_multiplier"], labels["request_id"], labels["gamma_label"], labels["latency_label_s"], strict=True))
    assert got == expected
    assert set(labels["gamma_label"]) == {1, 2, 4}  # the case is not trivial: every action wins some request


@attrs.define
class _Logged:
    """A static γ that logs each request's features at its first decision (written for this test)."""

    gamma: int = 4
    request: int | None = attrs.field(default=None, init=False)
    reads_position_probabilities = False

    def bind_request(self, request: Any, scope: object) -> None:
        self.request = request.id

    def next_gamma(self, state: GammaState) -> int:
        if self.request is not None and self.request not in _LOG:
            _LOG[self.request] = (state.verify_queue_wait_s, state.kv_utilization, state.rtt_s, state.acceptance_ewma,
                                  state.draft_step_s, state.verify_step_s, state.slo_tpot_s or 0.0, float(state.gamma))
        return min(max(self.gamma, state.k_min), state.k_max)


_LOG: dict[int, tuple[float, ...]] = {}


@pytest.fixture
def logged_policy() -> Iterator[None]:
    """``first_decision_log`` registered for one test."""
    gamma_policies.register("first_decision_log")(_Logged)
    yield
    gamma_policies._items.pop("first_decision_log")


@pytest.mark.parametrize("gammas", [(2, 4), (2, 3)])
def test_per_arrival_features_are_what_a_policy_saw_at_each_requests_first_decision(
    tmp_path: Path, gammas: tuple[int, ...], logged_policy: None,
) -> None:
    """The feature columns of each row equal what a logging policy records at that request's first
    γ decision in the distributed run at the base γ (a run of its own when the base γ is not a
    candidate, (2, 3); one of the candidates' runs otherwise, (2, 4))."""
    scenario = _scenario(tmp_path)
    labels = oracle_labels(scenario, rtt_multipliers=RTT, load_multipliers=(1,), gammas=gammas, base_gamma=4, per="arrival")
    for r in RTT:
        _LOG.clear()
        _run(scenario, r, "distributed", {"kind": "first_decision_log", "params": {"gamma": 4}})
        rows = labels[labels["rtt_multiplier"] == r]
        assert sorted(_LOG) == rows["request_id"].tolist()
        for _, row in rows.iterrows():
            assert tuple(row[list(LATENCY_HEAD_FEATURES)]) == _LOG[row["request_id"]]


def test_recording_the_first_decisions_leaves_the_run_unchanged(tmp_path: Path) -> None:
    """The base run with its decisions recorded gives the same per-request outcomes and telemetry as without."""
    scenario = _scenario(tmp_path).replace(**{"speculation.mode": "distributed", "speculation.fused": None,
                                              "speculation.gamma_policy": {"kind": "static", "params": {"gamma": 4}}})
    data = scenario_to_dict(scenario)
    plain, recorded = _simulate((data, None, True, False)), _simulate((data, None, True, True))
    assert len(recorded.pop("first")) == 20
    assert recorded == plain


def test_per_must_be_condition_or_arrival(tmp_path: Path) -> None:
    """``per`` other than condition or arrival is refused by name."""
    with pytest.raises(ValueError, match="per: must be 'condition' or 'arrival'"):
        oracle_labels(_scenario(tmp_path), rtt_multipliers=(1,), load_multipliers=(1,), per="request")


def test_cli_per_arrival_writes_the_label_table(tmp_path: Path) -> None:
    """``--per arrival --labels FILE`` writes one row per condition and request, with a scenario_id
    column first, and fits the head on those rows."""
    pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")
    import yaml

    from simpy_llm.explore.gamma_head import main

    file = tmp_path / "oracle.yaml"
    file.write_text(yaml.safe_dump(scenario_to_dict(_scenario(tmp_path).replace(name="oracle"))))
    table, out = tmp_path / "labels.csv", tmp_path / "head.yaml"
    main([str(file), "--rtt", "0,1", "--load", "1", "--gammas", "2,4", "--per", "arrival", "--labels", str(table), "--out", str(out)])
    written = pd.read_csv(table)
    assert list(written.columns) == ["scenario_id", *ARRIVAL_LABEL_COLUMNS]
    assert len(written) == 40 and set(written["scenario_id"]) == {"oracle"}
    assert yaml.safe_load(out.read_text())["kind"] == "latency_head"
