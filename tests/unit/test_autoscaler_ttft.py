"""The autoscaler's TTFT metrics (``docs/autoscaling.md``): the time to first token of the
requests whose first token came in a decision's window, seen with the lag."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from simpy_llm import Simulation, load_scenario
from simpy_llm.config import ScenarioError
from simpy_llm.loading import scenario_from_dict, scenario_to_dict

STEP = Path(__file__).resolve().parents[1] / "data" / "autoscaler" / "step.yaml"
"""Constant arrivals, 15/s throughout and 30/s more in [100, 400) s; 8 replicas, one active at first."""


def _run(metric: str, target: float):
    """The step scenario watching *metric* against *target* seconds, no tolerance."""
    data = scenario_to_dict(load_scenario(STEP))
    data["autoscaler"]["metric"] = metric
    data["autoscaler"]["policy"] = {"kind": "target", "params": {"target": target, "tolerance": 0.0}}
    return Simulation(scenario_from_dict(data)).run(progress=False)


@pytest.fixture(scope="module")
def p90_run():
    """The step scenario scaled on the p90 TTFT against 19 ms, run once."""
    return _run("ttft_p90", 0.019)


def _window_ttfts(frame, t: float, lag: float = 10.0, window: float = 30.0) -> np.ndarray:
    """The recorded TTFTs of the requests whose first token came in ``(t - lag - window, t - lag]``."""
    first = frame["first_token_s"].to_numpy()
    inside = (first > t - lag - window) & (first <= t - lag)
    return first[inside] - frame["arrival_s"].to_numpy()[inside]


def test_the_p90_ttft_seen_is_the_recorded_first_tokens_of_the_lagged_window(p90_run):
    """Each decision's ``seen`` is numpy's 90th percentile of the recorded TTFTs whose first
    token came in its lagged window, ``samples`` their count, and the recommendation is HPA's
    formula on it."""
    frame = p90_run.to_dataframe()
    decisions = p90_run.autoscaler_decisions()
    assert len(decisions) > 20
    for row in decisions.itertuples():
        ttfts = _window_ttfts(frame, row.time_s)
        assert row.samples == len(ttfts)
        assert row.seen == pytest.approx(float(np.percentile(ttfts, 90)), rel=1e-12, abs=0.0)
        assert row.recommended == math.ceil(row.current * row.seen / 0.019 - 1e-9)
    assert decisions["replicas"].max() > 1  # the surge's queueing moved the pool


def test_the_mean_ttft_seen_is_the_mean_of_the_window():
    """With ``ttft_mean``, ``seen`` is the mean of the same recorded TTFTs."""
    run = _run("ttft_mean", 0.018)
    frame = run.to_dataframe()
    for row in run.autoscaler_decisions().itertuples():
        ttfts = _window_ttfts(frame, row.time_s)
        assert row.samples == len(ttfts)
        assert row.seen == pytest.approx(float(ttfts.mean()), rel=1e-12, abs=0.0)


def test_a_window_without_first_tokens_changes_nothing():
    """A decision whose lagged window holds no first token sees NaN, counts 0 and keeps the
    pool: with a 20 s lag, the decision at 15 s looks before time 0."""
    data = scenario_to_dict(load_scenario(STEP))
    data["autoscaler"].update(metric="ttft_mean", lag_s=20, policy={"kind": "target", "params": {"target": 0.001}})
    decisions = Simulation(scenario_from_dict(data)).run(progress=False).autoscaler_decisions()
    first = decisions.iloc[0]
    assert first["time_s"] == 15.0 and math.isnan(first["seen"]) and first["samples"] == 0
    assert first["replicas"] == first["current"] == 1


def test_an_unknown_metric_names_the_ttft_ones():
    """A misspelt metric is refused by its key path, listing the TTFT metrics among those allowed."""
    data = scenario_to_dict(load_scenario(STEP))
    data["autoscaler"]["metric"] = "ttft_p99"
    with pytest.raises(ScenarioError, match=re.escape("autoscaler.metric") + ".*ttft_p90, ttft_mean"):
        scenario_from_dict(data)
