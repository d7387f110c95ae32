"""The latency head's offline fit: oracle labels from simulator sweeps, and the regression."""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simpy_llm import scenario_from_dict
from simpy_llm.explore.gamma_head import LABEL_COLUMNS, fit_head, oracle_labels
from simpy_llm.policies.gamma import gamma_policies
from simpy_llm.policies.latency_head import LATENCY_HEAD_FEATURES, LatencyHead
from tests.spec_helpers import flat_curve, spec_scenario

TRUE_WEIGHTS = np.array([-10.0, -2.0, -8.0, 3.0, -40.0, -15.0, 5.0, 0.5])
TRUE_BIAS = 2.5
SCALES = np.array([0.1, 1.0, 0.5, 1.0, 0.02, 0.05, 0.2, 6.0])
"""Rough ranges of the features (s, share, s, share, s, s, s, tokens)."""


def _linear_labels() -> pd.DataFrame:
    """200 rows of random features whose ``gamma_label`` is exactly ``x @ TRUE_WEIGHTS + TRUE_BIAS``."""
    rng = np.random.default_rng(0)
    x = rng.random((200, len(LATENCY_HEAD_FEATURES))) * SCALES
    frame = pd.DataFrame(x, columns=list(LATENCY_HEAD_FEATURES))
    frame["gamma_label"] = x @ TRUE_WEIGHTS + TRUE_BIAS
    return frame


def _scenario_data(tmp_path: Path) -> dict[str, Any]:
    """A small speculative scenario: drafting nearly free on the devices, 1 ms per fused
    draft token on the target, a 40 ms round trip, γ up to 6."""
    curve = flat_curve(tmp_path, [0.8] * 6)
    return spec_scenario(
        curve, requests=20, output=30, draft_token_ms=0.01, network={"rtt_ms": 40},
        speculation={"k_max": 6, "mode": "fused", "fused": {"draft_token_ms": 1.0, "acceptance": curve}},
    )


def test_fit_head_recovers_known_weights() -> None:
    """On labels that are an exact linear function of the features, least squares returns its
    weights and bias (to 1e-6) and the Huber fit comes close."""
    pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")
    labels = _linear_labels()
    exact = fit_head(labels, loss="l2")
    assert np.allclose(exact["weights"], TRUE_WEIGHTS, rtol=0, atol=1e-6)
    assert exact["bias"] == pytest.approx(TRUE_BIAS, abs=1e-6)
    robust = fit_head(labels, loss="huber")
    assert np.allclose(robust["weights"], TRUE_WEIGHTS, rtol=0, atol=1e-2)
    assert robust["bias"] == pytest.approx(TRUE_BIAS, abs=1e-2)


def test_fitted_params_build_a_latency_head_and_load_in_a_scenario(tmp_path: Path) -> None:
    """The fitted params are plain floats that build a LatencyHead and a scenario naming it loads."""
    pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")
    params = fit_head(_linear_labels(), loss="huber")
    assert set(params) == {"weights", "bias"}
    assert all(type(w) is float for w in params["weights"]) and type(params["bias"]) is float
    head = gamma_policies.get("latency_head")(**params)
    assert isinstance(head, LatencyHead)
    data = _scenario_data(tmp_path)
    data["speculation"]["gamma_policy"] = {"kind": "latency_head", "params": params}
    scenario = scenario_from_dict(data)
    assert scenario.speculation.gamma_policy.kind == "latency_head"


def test_oracle_labels_fused_at_long_rtt_distributed_at_short(tmp_path: Path) -> None:
    """One row per condition with the label columns; labels are candidates; a 400 ms round trip
    makes fused best, a 0.4 ms one with near-free drafting makes distributed best."""
    scenario = scenario_from_dict(_scenario_data(tmp_path))
    labels = oracle_labels(scenario, rtt_multipliers=(0.01, 10.0), load_multipliers=(0.5, 1.5))
    assert list(labels.columns) == list(LABEL_COLUMNS)
    assert len(labels) == 4
    assert list(zip(labels["rtt_multiplier"], labels["load_multiplier"], strict=True)) == [
        (0.01, 0.5), (0.01, 1.5), (10.0, 0.5), (10.0, 1.5)
    ]
    assert set(labels["gamma_label"]) <= {1, 2, 3, 4, 6}
    short = labels[labels["rtt_multiplier"] == 0.01]
    long = labels[labels["rtt_multiplier"] == 10.0]
    assert (short["gamma_label"] > 1).all()
    assert (long["gamma_label"] == 1).all()
    assert long["rtt_s"].to_numpy() == pytest.approx([0.4, 0.4])
    assert (labels["gamma"] == 4.0).all() and (labels["slo_tpot_s"] == 0.0).all()
    assert labels["slo_met"].all()  # no SLO: every run meets it


def test_oracle_labels_serial_equals_process_pool(tmp_path: Path) -> None:
    """Running the sweep through a process pool gives exactly the serial table."""
    scenario = scenario_from_dict(_scenario_data(tmp_path))
    sweep = {"rtt_multipliers": (0.5, 5.0), "load_multipliers": (1.0,), "gammas": (2, 4)}
    serial = oracle_labels(scenario, **sweep)
    with ProcessPoolExecutor(max_workers=2) as pool:
        parallel = oracle_labels(scenario, **sweep, executor=pool)
    pd.testing.assert_frame_equal(serial, parallel)


def test_oracle_labels_requires_a_fused_section(tmp_path: Path) -> None:
    """A scenario without ``speculation.fused`` cannot run the fused action: ValueError naming the key."""
    data = _scenario_data(tmp_path)
    data["speculation"]["mode"] = "distributed"
    del data["speculation"]["fused"]
    with pytest.raises(ValueError, match=r"speculation\.fused"):
        oracle_labels(scenario_from_dict(data))


def test_fit_head_without_scikit_learn_names_the_learn_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without scikit-learn, fit_head raises ImportError pointing at the ``learn`` extra."""
    monkeypatch.setitem(sys.modules, "sklearn.linear_model", None)
    with pytest.raises(ImportError, match="learn"):
        fit_head(_linear_labels())
