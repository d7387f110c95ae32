"""Gradient-boosted acceptance regressors (speculative/regressor.py) and the training command
(speculative/train_acceptance.py), judged with speculative/evaluation.py."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")

from simpy_llm.speculative.evaluation import evaluate_acceptance
from simpy_llm.speculative.regressor import load_acceptance_regressor, train_acceptance_regressor
from simpy_llm.speculative.train_acceptance import main
from tests.unit.test_acceptance_evaluation import CONTEXTS, HAND_LOG, META, TRUTH, K, chain_log


@pytest.fixture(scope="module")
def train_log() -> pd.DataFrame:
    """30,000 steps (about 85,000 rows), seed 0."""
    return chain_log(0, 30_000)


@pytest.fixture(scope="module")
def boosted(train_log):
    """Gradient-boosted trees trained on train_log."""
    return train_acceptance_regressor(train_log, **META, estimator="gradient_boosting")


# --------------------------------------------------------------------------- gradient boosting


def test_gradient_boosting_recovers_the_truth(boosted, train_log) -> None:
    """At each profiled context and position, the boosted prediction is within 4 standard errors
    of the true p_i, sqrt(p (1 - p) / n) over the cell's n rows (each cell >= 750 rows; 100
    rounds of depth-3 trees at learning rate 0.1 fit the 18 cells' shares to well within that)."""
    counts = train_log.groupby(["context_len", "position"]).size()
    for c in CONTEXTS:
        for i, (got, want) in enumerate(zip(boosted.position_probabilities(c, K), TRUTH.position_probabilities(c, K, 0.0), strict=True), 1):
            assert abs(got - want) <= 4 * math.sqrt(want * (1 - want) / counts[(c, i)]), (c, i, got, want)


def test_gradient_boosting_is_a_regressor_like_the_forest(boosted, tmp_path) -> None:
    """The boosted bundle says its kind, saves and loads with the same answers, and is deterministic."""
    assert boosted.kind == "gradient_boosting"
    loaded = load_acceptance_regressor(boosted.save(tmp_path / "gb.joblib"))
    assert loaded.kind == "gradient_boosting"
    assert loaded.position_probabilities(700, K, 0.0) == boosted.position_probabilities(700, K, 0.0)
    again = train_acceptance_regressor(chain_log(0, 30_000), **META, estimator="gradient_boosting")
    assert again.position_probabilities(700, K, 0.0) == boosted.position_probabilities(700, K, 0.0)


def test_boosted_and_forest_models_score_alike_held_out(boosted, train_log) -> None:
    """On a held-out log (seed 1), both ensembles' Brier scores are within 0.002 of the truth's
    (the sampling noise of a Brier score over ~28,000 rows is about 0.0006 between models that
    predict alike)."""
    held = chain_log(1, 10_000)
    forest = train_acceptance_regressor(train_log, **META, n_estimators=30)
    truth = evaluate_acceptance(TRUTH, held).brier
    assert forest.kind == "random_forest"
    for model in (forest, boosted):
        assert evaluate_acceptance(model, held).brier == pytest.approx(truth, abs=0.002)


def test_an_unknown_estimator_is_refused(train_log) -> None:
    """estimator names one of the ensembles."""
    with pytest.raises(ValueError, match="estimator must be one of random_forest, gradient_boosting, mixture_of_experts; got 'svm'"):
        train_acceptance_regressor(train_log, **META, estimator="svm")


# --------------------------------------------------------------------------- the command


def test_the_command_trains_and_prints_held_out_figures(tmp_path, capsys, train_log) -> None:
    """The command writes the bundle and prints, and writes as JSON, the held-out figures that
    evaluate_acceptance gives for it."""
    train, held, out, metrics = tmp_path / "train.csv", tmp_path / "held.csv", tmp_path / "pair.joblib", tmp_path / "m.json"
    train_log.to_csv(train, index=False)
    chain_log(1, 3_000).to_csv(held, index=False)
    status = main([str(train), "--out", str(out), "--drafter", "d", "--verifier", "v", "--source", "simulated",
                   "--estimator", "gradient_boosting", "--held-out", str(held), "--bins", "5", "--metrics-json", str(metrics)])
    assert status == 0
    model = load_acceptance_regressor(out)
    assert (model.name, model.kind) == ("pair", "gradient_boosting")
    expected = evaluate_acceptance(model, pd.read_csv(held), bins=5)
    printed = capsys.readouterr().out
    assert f"held-out: pair on {expected.rows} rows: MAE {expected.mae:.4f}, Brier {expected.brier:.4f}, ECE {expected.ece:.4f}" in printed
    figures = json.loads(metrics.read_text())
    assert figures["held_out"]["brier"] == pytest.approx(expected.brier, abs=1e-15)
    assert set(figures) == {"in_sample", "held_out"}


def test_the_command_reports_a_bad_log(tmp_path, capsys) -> None:
    """A log with an invalid column exits with status 2 and an error naming it; no bundle is written."""
    bad = tmp_path / "bad.csv"
    HAND_LOG.assign(accepted=2).to_csv(bad, index=False)
    status = main([str(bad), "--out", str(tmp_path / "x.joblib"), "--drafter", "d", "--verifier", "v", "--source", "s"])
    assert status == 2
    assert "column 'accepted' must be 0 or 1" in capsys.readouterr().err
    assert not (tmp_path / "x.joblib").exists()


def test_the_command_turns_per_step_logs_into_rows(tmp_path, capsys) -> None:
    """With --per-step, a per-step log (k, accepted_count) trains on the rows it implies."""
    steps = pd.DataFrame({"context_len": [256] * 400, "temperature": [0.0] * 400, "k": [2] * 400, "accepted_count": [0, 1, 2, 2] * 100})
    path = tmp_path / "steps.csv"
    steps.to_csv(path, index=False)
    assert main([str(path), "--out", str(tmp_path / "s.joblib"), "--drafter", "d", "--verifier", "v", "--source", "s", "--per-step"]) == 0
    assert "trained random_forest on 700 rows" in capsys.readouterr().out
