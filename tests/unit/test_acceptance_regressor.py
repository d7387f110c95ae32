"""Acceptance regressors (speculative/regressor.py): a RandomForest trained on a per-token
profiling log recovers a known chain of conditional acceptance probabilities; log
validation; bundles; the shared chain methods; the memo."""

from __future__ import annotations

import bisect
import math

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")

import joblib  # installed with scikit-learn

from simpy_llm.config.errors import ScenarioError
from simpy_llm.speculative.curves import acceptance_model
from simpy_llm.speculative.regressor import (
    AcceptanceRegressor,
    load_acceptance_regressor,
    profiling_rows_from_steps,
    train_acceptance_regressor,
)

TRUTH = acceptance_model("illustrative-mobile")
"""The known chain: its T = 0 rows at contexts 128, 512 and 2048 (grid points, so exact)."""
CONTEXTS = (128, 512, 2048)
K = 6
STEPS = 30_000
META = {"name": "synthetic", "drafter": "d", "verifier": "v", "source": "simulated from illustrative-mobile"}


def chain_log(rng: np.random.Generator, steps: int, contexts, temperatures, k: int, p) -> pd.DataFrame:
    """A per-token profiling log of *steps* simulated steps: each draws a context and a
    temperature uniformly, walks positions 1..k with ``accepted ~ Bernoulli(p(c, t)[i - 1])``
    and stops at the first rejection, one row per reached position."""
    contexts, temperatures = np.asarray(contexts), np.asarray(temperatures, dtype=float)
    probs = np.array([[p(c, t) for t in temperatures] for c in contexts])
    ci = rng.integers(len(contexts), size=steps)
    ti = rng.integers(len(temperatures), size=steps)
    accepted = rng.random((steps, k)) < probs[ci, ti]
    reached = np.ones_like(accepted)
    reached[:, 1:] = np.logical_and.accumulate(accepted[:, :-1], axis=1)
    step, pos = np.nonzero(reached)
    return pd.DataFrame({
        "context_len": contexts[ci[step]], "position": pos + 1,
        "temperature": temperatures[ti[step]], "accepted": accepted[step, pos].astype(np.int64),
    })


def truth_p(c: int, t: float) -> tuple[float, ...]:
    """``p_1 .. p_K`` of the known chain."""
    return TRUTH.position_probabilities(c, K, temperature=t)


@pytest.fixture(scope="module")
def truth_log() -> pd.DataFrame:
    """30,000 steps at temperature 0 (about 89,000 rows), numpy seed 0."""
    return chain_log(np.random.default_rng(0), STEPS, CONTEXTS, [0.0], K, truth_p)


@pytest.fixture(scope="module")
def model(truth_log) -> AcceptanceRegressor:
    """The regressor trained on :func:`truth_log` (30 trees)."""
    return train_acceptance_regressor(truth_log, **META, n_estimators=30)


@pytest.fixture(scope="module")
def small_log() -> pd.DataFrame:
    """A small log at two temperatures (2,000 steps, k_max 3)."""
    return chain_log(np.random.default_rng(1), 2_000, [256, 1024], [0.0, 0.7], 3, lambda c, t: truth_p(c, t)[:3])


def test_position_probabilities_match_the_truth(model, truth_log):
    """At each profiled context and position, the prediction is within 4 standard errors
    of the true p_i, the standard error being that of a proportion over the cell's rows,
    sqrt(p (1 - p) / n): the forest's leaves are the (context, position) cells (each has
    >= 750 rows, far above min_samples_leaf), so its prediction is the cell's accepted
    fraction (bagging adds a variance ~1/30 of that). With n from ~10,000 (position 1) to
    ~760 (position 6 at 2048 tokens) the tolerance runs from 0.016 to 0.07."""
    counts = truth_log.groupby(["context_len", "position"]).size()
    for c in CONTEXTS:
        predicted = model.position_probabilities(c, K, temperature=0.0)
        for i, (got, want) in enumerate(zip(predicted, truth_p(c, 0.0), strict=True), start=1):
            n = counts[(c, i)]
            assert abs(got - want) <= 4 * math.sqrt(want * (1 - want) / n), (c, i, got, want, n)


def test_expected_tokens_within_two_percent(model):
    """Expected tokens per step at k = 1..K are within 2 % of the truth's."""
    for c in CONTEXTS:
        for k in range(1, K + 1):
            got, want = model.expected_tokens(c, k, temperature=0.0), TRUTH.expected_tokens(c, k, temperature=0.0)
            assert got == pytest.approx(want, rel=0.02), (c, k)


def test_metadata_and_properties(model, truth_log):
    """The bundle keeps its provenance; k_max defaults to the largest position; temperatures
    are the distinct training ones; a regressor is not illustrative; no file yet."""
    assert (model.name, model.drafter, model.verifier, model.method) == ("synthetic", "d", "v", "standard")
    assert model.source == META["source"] and model.notes == ""
    assert model.k_max == K and model.temperatures == (0.0,)
    assert model.illustrative is False and model.path == ""
    assert model.n_rows == len(truth_log)


def test_one_temperature_answers_every_temperature(model):
    """Trained on one temperature: None is allowed and every temperature gives the same answer."""
    at_none = model.position_probabilities(512, K)
    assert at_none == model.position_probabilities(512, K, temperature=0.0)
    assert at_none == model.position_probabilities(512, K, temperature=1.3)


def test_several_temperatures_need_one(small_log):
    """Trained on two temperatures: ``temperatures`` lists both, None is an error naming
    them, and the colder (more accepting) temperature predicts a higher p_1."""
    m = train_acceptance_regressor(small_log, **META, n_estimators=20)
    assert m.temperatures == (0.0, 0.7) and m.k_max == 3
    with pytest.raises(ValueError, match=r"has temperatures \[0.0, 0.7\]: pass temperature="):
        m.position_probabilities(256, 2)
    assert m.position_probabilities(256, 1, temperature=0.0)[0] > m.position_probabilities(256, 1, temperature=0.7)[0]


@pytest.mark.parametrize(("args", "error", "match"), [
    ((512, K + 1, 0.0), ValueError, r"k = 7 is outside the regressor 'synthetic': it covers k from 0 to 6"),
    ((512, -1, 0.0), ValueError, r"k = -1 is outside"),
    ((512, 2.0, 0.0), TypeError, r"k must be a whole number"),
    ((512, True, 0.0), TypeError, r"k must be a whole number"),
    ((0, 2, 0.0), ValueError, r"context_len must be a finite number > 0, got 0"),
    ((-5, 2, 0.0), ValueError, r"context_len must be a finite number > 0"),
    ((math.nan, 2, 0.0), ValueError, r"context_len must be a finite number > 0"),
    ((512, 2, -0.1), ValueError, r"temperature must be a finite number >= 0, got -0.1"),
    ((512, 2, math.inf), ValueError, r"temperature must be a finite number >= 0"),
])
def test_argument_errors(model, args, error, match):
    """Arguments are checked as AcceptanceModel checks them, with the same messages."""
    with pytest.raises(error, match=match):
        model.position_probabilities(*args)


def test_k_zero_needs_no_forest(model, monkeypatch):
    """k = 0 is no speculation: no probabilities, one token per step, no forest call."""
    monkeypatch.setattr(model.estimator, "predict", lambda x: pytest.fail("forest called"))
    assert model.position_probabilities(999, 0, temperature=0.0) == ()
    assert model.expected_tokens(999, 0, temperature=0.0) == 1.0
    assert model.accepted_distribution(999, 0, temperature=0.0) == (1.0,)


def good_log() -> pd.DataFrame:
    """A tiny valid log: two steps at 100 tokens (accepted 1 then rejected; rejected)."""
    return pd.DataFrame({"context_len": [100, 100, 100], "position": [1, 2, 1],
                         "temperature": [0.0, 0.0, 0.0], "accepted": [1, 0, 0]})


def test_a_tiny_valid_log_trains():
    """The reference log of the validation tests is itself valid."""
    m = train_acceptance_regressor(good_log(), **META, n_estimators=5, min_samples_leaf=1)
    assert m.k_max == 2 and m.n_rows == 3


def _set(column, values):
    def change(log):
        log[column] = values
        return log
    return change


@pytest.mark.parametrize(("change", "match"), [
    (lambda log: log.drop(columns=["position", "accepted"]),
     r"missing column\(s\) 'position', 'accepted' \(required: context_len, position, temperature, accepted\)"),
    (lambda log: log.iloc[:0], r"profiling log is empty"),
    (_set("position", [1.0, 2.5, 1.0]), r"column 'position' must hold whole numbers in \[1, 64\].*index 1.*2.5"),
    (_set("position", [0, 1, 1]), r"column 'position' must hold whole numbers"),
    (_set("accepted", [1, 2, 0]), r"column 'accepted' must be 0 or 1: 1 row\(s\), first at index 1"),
    (_set("accepted", [1.0, math.nan, 0.0]), r"column 'accepted' has missing or non-finite values"),
    (_set("context_len", [100, 100, 0]), r"column 'context_len' must hold whole numbers in \[1, .*index 2"),
    (_set("context_len", [-5, -5, 100]), r"column 'context_len' must hold whole numbers"),
    (_set("temperature", [0.0, 0.0, -1.0]), r"column 'temperature' must be >= 0: 1 row\(s\), first at index 2"),
    (_set("temperature", ["hot", "hot", "hot"]), r"column 'temperature' must be numeric, got dtype"),
    (_set("drafter", ["d", "d", "other"]), r"column 'drafter' holds \['other'\] besides drafter='d'"),
    (_set("verifier", ["w", "w", "w"]), r"column 'verifier' holds \['w'\] besides verifier='v'"),
    (_set("accepted", [0, 0, 0]),
     r"column 'position': 1 row\(s\) at position 2 but only 0 accepted at position 1 .*first rejection"),
])
def test_log_validation_errors(change, match):
    """A bad log is refused with a ValueError naming the column and the problem."""
    with pytest.raises(ValueError, match=match):
        train_acceptance_regressor(change(good_log()), **META)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"name": " "}, r"name must be non-blank text"),
    ({"method": "beam"}, r"method must be one of standard, greedy, eagle, medusa, ngram; got 'beam'"),
    ({"k_max": 3}, r"k_max must be a whole number in \[1, 2\] \(the log's largest position\), got 3"),
    ({"k_max": 0}, r"k_max must be a whole number in \[1, 2\]"),
])
def test_training_argument_errors(kwargs, match):
    """Blank metadata, an unknown method and a k_max beyond the logged positions are refused."""
    with pytest.raises(ValueError, match=match):
        train_acceptance_regressor(good_log(), **{**META, **kwargs})


def test_log_must_be_a_dataframe():
    """A log that is not a DataFrame is a TypeError."""
    with pytest.raises(TypeError, match="must be a pandas DataFrame, got dict"):
        train_acceptance_regressor(good_log().to_dict(), **META)


def test_k_max_below_the_largest_position(small_log):
    """An explicit k_max below the log's largest position limits the queries."""
    m = train_acceptance_regressor(small_log, **META, k_max=2, n_estimators=5)
    assert m.k_max == 2
    with pytest.raises(ValueError, match="covers k from 0 to 2"):
        m.position_probabilities(256, 3, temperature=0.0)


def test_training_is_reproducible(small_log):
    """The same log and random_state give the same predictions."""
    a = train_acceptance_regressor(small_log, **META, n_estimators=10, random_state=3)
    b = train_acceptance_regressor(small_log, **META, n_estimators=10, random_state=3)
    assert a.position_probabilities(700, 3, 0.35) == b.position_probabilities(700, 3, 0.35)


def test_save_load_round_trip(model, tmp_path):
    """A saved bundle loads with the same metadata and identical predictions, also at
    contexts and temperatures it was not trained at; ``path`` names the file."""
    path = model.save(tmp_path / "pair.joblib")
    loaded = load_acceptance_regressor(path)
    assert loaded.path == str(path)
    for attr in ("name", "drafter", "verifier", "method", "source", "notes", "k_max", "temperatures", "n_rows",
                 "sklearn_version"):
        assert getattr(loaded, attr) == getattr(model, attr), attr
    for c in (*CONTEXTS, 1, 300, 100_000):
        for t in (0.0, 0.5):
            assert loaded.position_probabilities(c, K, t) == model.position_probabilities(c, K, t)


def test_load_warns_on_another_sklearn_version(model, tmp_path):
    """A bundle trained with another scikit-learn version loads with a UserWarning."""
    path = model.save(tmp_path / "old.joblib")
    bundle = joblib.load(path)
    bundle["sklearn_version"] = "0.0.1"
    joblib.dump(bundle, path)
    with pytest.warns(UserWarning, match=r"trained with scikit-learn 0.0.1, loaded with"):
        loaded = load_acceptance_regressor(path)
    assert loaded.sklearn_version == "0.0.1"


def test_load_refuses_other_files(tmp_path):
    """A missing file, a joblib file of something else, a non-joblib file, and a bundle with
    bad metadata are ScenarioErrors naming the file."""
    with pytest.raises(ScenarioError, match="no such file"):
        load_acceptance_regressor(tmp_path / "absent.joblib")
    other = tmp_path / "other.joblib"
    joblib.dump({"weights": [1, 2]}, other)
    with pytest.raises(ScenarioError, match=r"other.joblib: 1 problem\(s\) in acceptance regressor\n.*not an acceptance"):
        load_acceptance_regressor(other)
    text = tmp_path / "text.joblib"
    text.write_text("name: not a bundle\n")
    with pytest.raises(ScenarioError, match="cannot be read as a joblib bundle"):
        load_acceptance_regressor(text)


def test_load_checks_the_metadata(model, tmp_path):
    """A bundle whose metadata was tampered with lists each bad key."""
    path = model.save(tmp_path / "bad.joblib")
    bundle = joblib.load(path)
    bundle["metadata"].update(k_max=0, method="beam")
    joblib.dump(bundle, path)
    with pytest.raises(ScenarioError) as info:
        load_acceptance_regressor(path)
    assert info.value.paths == ["metadata.method", "metadata.k_max"]


def test_save_needs_a_joblib_suffix(model, tmp_path):
    """Bundles are .joblib files."""
    with pytest.raises(ValueError, match=r"is a .joblib file"):
        model.save(tmp_path / "pair.pkl")


def test_accepted_at_is_the_inverse_cdf(model):
    """accepted_at(u) is the smallest m with P(M <= m) > u, from accepted_distribution."""
    pmf = model.accepted_distribution(512, 4, temperature=0.0)
    cdf = np.cumsum(pmf)
    for u in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.999, float(cdf[1]), math.nextafter(float(cdf[1]), 0.0)):
        assert model.accepted_at(u, 512, 4, temperature=0.0) == bisect.bisect_right(list(cdf[:-1]), u), u


def test_sample_accepted_many_matches_the_distribution(model):
    """Empirical frequencies of 20,000 draws are within 5 standard errors of accepted_distribution."""
    n = 20_000
    pmf = model.accepted_distribution(2048, K, temperature=0.0)
    draws = model.sample_accepted_many(np.random.default_rng(2), 2048, K, n, temperature=0.0)
    assert draws.dtype == np.int64 and draws.min() >= 0 and draws.max() <= K
    freq = np.bincount(draws, minlength=K + 1) / n
    for m, (f, p) in enumerate(zip(freq, pmf, strict=True)):
        assert abs(f - p) <= 5 * math.sqrt(p * (1 - p) / n), (m, f, p)


def test_sample_accepted_uses_the_chain(model):
    """sample_accepted's draws (one uniform per reached position) average to expected_tokens - 1."""
    rng = np.random.default_rng(3)
    draws = np.array([model.sample_accepted(rng, 512, 3, temperature=0.0) for _ in range(5_000)])
    mean = model.expected_tokens(512, 3, temperature=0.0) - 1
    assert abs(draws.mean() - mean) <= 5 * draws.std() / math.sqrt(draws.size)


def test_memo_spares_the_forest(model, monkeypatch):
    """One forest call per (context, temperature): repeating the arguments, or another k at
    the same context, does not call it again; a new context does (with all k_max positions)."""
    calls = []
    real = model.estimator.predict

    def counting(x):
        calls.append(x.shape)
        return real(x)

    monkeypatch.setattr(model.estimator, "predict", counting)
    first = model.position_probabilities(777, 3, temperature=0.0)
    assert calls == [(K, 3)]
    assert model.position_probabilities(777, 3, temperature=0.0) == first
    assert model.position_probabilities(777, 5, temperature=0.0)[:3] == first
    assert model.expected_tokens(777, 4, temperature=0.0) > 1
    assert len(calls) == 1
    model.position_probabilities(778, 3, temperature=0.0)
    assert len(calls) == 2


def test_rows_from_steps():
    """A step with k drafts and m accepted gives rows 1..m accepted and row m + 1 rejected
    (when m < k); k = 0 gives none; other columns are copied."""
    steps = pd.DataFrame({"context_len": [100, 200, 300, 400], "temperature": 0.5, "k": [3, 2, 0, 4],
                          "accepted_count": [1, 2, 0, 0], "prompt_class": ["a", "b", "c", "d"]})
    rows = profiling_rows_from_steps(steps)
    assert rows[["context_len", "position", "accepted", "prompt_class"]].to_numpy().tolist() == [
        [100, 1, 1, "a"], [100, 2, 0, "a"], [200, 1, 1, "b"], [200, 2, 1, "b"], [400, 1, 0, "d"]]
    assert set(rows["temperature"]) == {0.5}


def test_rows_from_steps_refuses_impossible_counts():
    """accepted_count above k is refused."""
    steps = pd.DataFrame({"context_len": [100], "temperature": 0.0, "k": [2], "accepted_count": [3]})
    with pytest.raises(ValueError, match=r"0 <= accepted_count <= k"):
        profiling_rows_from_steps(steps)
