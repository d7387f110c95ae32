"""Held-out evaluation of acceptance models (speculative/evaluation.py) and reading profiling
logs from files (speculative/profiling_log.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from simpy_llm.speculative.curve_files import acceptance_from_dict
from simpy_llm.speculative.curves import acceptance_model
from simpy_llm.speculative.evaluation import evaluate_acceptance, predicted_acceptance
from simpy_llm.speculative.profiling_log import read_profiling_log

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


# --------------------------------------------------------------------------- log files


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_a_log_file_reads_back(tmp_path, suffix) -> None:
    """A profiling log written as CSV, JSON lines or Parquet reads back with its columns and values."""
    if suffix == ".parquet":
        pytest.importorskip("pyarrow", reason="needs the parquet extra (pyarrow): pip install -e '.[parquet]'")
    path = tmp_path / f"log{suffix}"
    {".csv": lambda: HAND_LOG.to_csv(path, index=False), ".jsonl": lambda: HAND_LOG.to_json(path, orient="records", lines=True),
     ".parquet": lambda: HAND_LOG.to_parquet(path)}[suffix]()
    back = read_profiling_log(path)
    assert back[list(HAND_LOG.columns)].astype(float).equals(HAND_LOG.astype(float))


def test_another_file_type_is_refused(tmp_path) -> None:
    """A log file of another type is a ValueError naming the types read."""
    with pytest.raises(ValueError, match=r"a profiling log is a \.csv, \.jsonl, \.parquet file, got '\.txt'"):
        read_profiling_log(tmp_path / "log.txt")
