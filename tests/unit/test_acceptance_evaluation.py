"""Held-out evaluation of acceptance models (speculative/evaluation.py), gradient-boosted
regressors (speculative/regressor.py), the training command (speculative/train_acceptance.py)
and reading profiling logs from files (speculative/profiling_log.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")

from simpy_llm.speculative.acceptance import acceptance_from_dict
from simpy_llm.speculative.curves import acceptance_model
from simpy_llm.speculative.evaluation import evaluate_acceptance, predicted_acceptance
from simpy_llm.speculative.profiling_log import read_profiling_log
from simpy_llm.speculative.regressor import load_acceptance_regressor, train_acceptance_regressor
from simpy_llm.speculative.train_acceptance import main

CURVE = acceptance_from_dict({
    "name": "hand", "drafter": "d", "verifier": "v", "method": "standard", "source": "a test",
    "curves": [{"temperature": 0.0, "context_len": [128, 512], "acceptance": [[0.9, 0.6, 0.3], [0.8, 0.5, 0.2]]}],
})
"""p = (0.9, 0.6, 0.3) at 128 tokens and (0.8, 0.5, 0.2) at 512 (grid points: read exactly)."""
HAND_LOG = pd.DataFrame({
    "context_len": [128, 128, 128, 128, 128, 128, 512, 512, 512, 512, 512],
    "position":    [1, 2, 3, 1, 1, 2, 1, 2, 1, 2, 3],
    "temperature": [0.0] * 11,
    "accepted":    [1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 1],
})
"""Five steps, eleven rows; the predictions are 0.9 0.6 0.3 0.9 0.9 0.6 | 0.8 0.5 0.8 0.5 0.2."""

TRUTH = acceptance_model("illustrative-mobile")
CONTEXTS, K = (128, 512, 2048), 6
META = {"name": "synthetic", "drafter": "d", "verifier": "v", "source": "simulated from illustrative-mobile"}


def chain_log(seed: int, steps: int) -> pd.DataFrame:
    """*steps* simulated steps of illustrative-mobile at temperature 0 (contexts drawn uniformly
    from CONTEXTS), one row per reached position, stopping at the first rejection."""
    rng = np.random.default_rng(seed)
    ctx = rng.choice(CONTEXTS, steps)
    p = np.array([TRUTH.position_probabilities(int(c), K, temperature=0.0) for c in ctx])
    accepted = rng.random((steps, K)) < p
    reached = np.ones_like(accepted)
    reached[:, 1:] = np.logical_and.accumulate(accepted[:, :-1], axis=1)
    step, pos = np.nonzero(reached)
    return pd.DataFrame({"context_len": ctx[step], "position": pos + 1, "temperature": 0.0,
                         "accepted": accepted[step, pos].astype(np.int64)})


@pytest.fixture(scope="module")
def train_log() -> pd.DataFrame:
    """30,000 steps (about 85,000 rows), seed 0."""
    return chain_log(0, 30_000)


@pytest.fixture(scope="module")
def boosted(train_log):
    """Gradient-boosted trees trained on train_log."""
    return train_acceptance_regressor(train_log, **META, estimator="gradient_boosting")


# --------------------------------------------------------------------------- evaluation


def test_figures_match_a_hand_computation() -> None:
    """MAE, Brier and ECE (5 bins) of a curve on eleven rows equal the sums worked out by hand."""
    e = evaluate_acceptance(CURVE, HAND_LOG, bins=5)
    # |y - p|: .1 .4 .3 .9 .1 .6 | .2 .5 .2 .5 .8  -> 4.6
    assert e.mae == pytest.approx(4.6 / 11, abs=1e-12)
    # (y - p)^2: .01 .16 .09 .81 .01 .36 | .04 .25 .04 .25 .64  -> 2.66
    assert e.brier == pytest.approx(2.66 / 11, abs=1e-12)
    # Bins [.2,.4): p .3 .2, y 0 1 -> 2 |.5 - .25|; [.4,.6): p .5 .5, y 0 1 -> 0;
    # [.6,.8): p .6 .6, y 1 0 -> 2 |.5 - .6|; [.8,1]: p .9 .9 .9 .8 .8, y 1 0 1 1 1 -> 5 |.8 - .86|.
    assert e.ece == pytest.approx((0.5 + 0.0 + 0.2 + 0.3) / 11, abs=1e-12)
    assert (e.rows, e.bins, e.model) == (11, 5, "hand")
    assert e.mean_predicted == pytest.approx(7.0 / 11, abs=1e-12) and e.observed_rate == pytest.approx(7 / 11, abs=1e-12)


def test_the_reliability_curve_has_the_non_empty_bins() -> None:
    """The reliability curve lists each non-empty bin with its edges, rows, mean prediction and observed rate."""
    curve = [(b.lower, b.upper, b.rows, round(b.mean_predicted, 12), b.observed_rate)
             for b in evaluate_acceptance(CURVE, HAND_LOG, bins=5).reliability]
    assert curve == [(0.2, 0.4, 2, 0.25, 0.5), (0.4, 0.6, 2, 0.5, 0.5), (0.6, 0.8, 2, 0.6, 0.5), (0.8, 1.0, 5, 0.86, 0.8)]


def test_each_row_is_predicted_by_its_position() -> None:
    """A row's prediction is p_position at its context: the conditional probability the row records."""
    expected = [0.9, 0.6, 0.3, 0.9, 0.9, 0.6, 0.8, 0.5, 0.8, 0.5, 0.2]
    assert predicted_acceptance(CURVE, HAND_LOG).tolist() == expected


def test_a_log_beyond_the_models_positions_is_refused() -> None:
    """A held-out position above the model's k_max is a ValueError naming both."""
    log = pd.DataFrame({"context_len": [128] * 4, "position": [1, 2, 3, 4], "temperature": 0.0, "accepted": [1, 1, 1, 0]})
    with pytest.raises(ValueError, match=r"'position' reaches 4, but the model 'hand' covers k up to 3"):
        evaluate_acceptance(CURVE, log)


def test_bad_bins_are_refused() -> None:
    """bins must be a whole number >= 1."""
    with pytest.raises(ValueError, match="bins must be a whole number >= 1"):
        evaluate_acceptance(CURVE, HAND_LOG, bins=0)


def test_the_truth_is_calibrated_on_its_own_log() -> None:
    """The generating curve's ECE on 20,000 of its steps is within sampling noise: each bin's gap
    is a proportion's error, sqrt(p (1 - p) / n_b) <= 0.5 / sqrt(n_b), so ECE <= sum_b (n_b / N) 4 * 0.5 / sqrt(n_b)."""
    log = chain_log(7, 20_000)
    e = evaluate_acceptance(TRUTH, log)
    bound = sum(b.rows / e.rows * 4 * 0.5 / math.sqrt(b.rows) for b in e.reliability)
    assert e.ece <= bound
    assert abs(e.mean_predicted - e.observed_rate) <= 4 * 0.5 / math.sqrt(e.rows)


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
    with pytest.raises(ValueError, match="estimator must be one of random_forest, gradient_boosting; got 'svm'"):
        train_acceptance_regressor(train_log, **META, estimator="svm")


# --------------------------------------------------------------------------- files and the command


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_a_log_file_reads_back(tmp_path, suffix) -> None:
    """A profiling log written as CSV, JSON lines or Parquet reads back with its columns and values."""
    path = tmp_path / f"log{suffix}"
    {".csv": lambda: HAND_LOG.to_csv(path, index=False), ".jsonl": lambda: HAND_LOG.to_json(path, orient="records", lines=True),
     ".parquet": lambda: HAND_LOG.to_parquet(path)}[suffix]()
    back = read_profiling_log(path)
    assert back[list(HAND_LOG.columns)].astype(float).equals(HAND_LOG.astype(float))


def test_another_file_type_is_refused(tmp_path) -> None:
    """A log file of another type is a ValueError naming the types read."""
    with pytest.raises(ValueError, match=r"a profiling log is a \.csv, \.jsonl, \.parquet file, got '\.txt'"):
        read_profiling_log(tmp_path / "log.txt")


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
