"""A mixture of acceptance experts by regime (speculative/regressor.py, ``mixture_of_experts``):
each regime's expert is fitted on that regime's rows alone and answers its queries alone."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")

from simpy_llm.speculative.regressor import load_acceptance_regressor, train_acceptance_regressor
from simpy_llm.speculative.train_acceptance import main
from tests.unit.test_acceptance_evaluation import META, K, chain_log


def flat_log(seed: int, steps: int, contexts: tuple[int, ...], p: float, temperature: float = 0.0) -> pd.DataFrame:
    """*steps* steps whose every position is accepted with probability *p* (rows up to the first rejection)."""
    rng = np.random.default_rng(seed)
    ctx = rng.choice(contexts, steps)
    accepted = rng.random((steps, K)) < p
    reached = np.ones_like(accepted)
    reached[:, 1:] = np.logical_and.accumulate(accepted[:, :-1], axis=1)
    step, pos = np.nonzero(reached)
    return pd.DataFrame({"context_len": ctx[step], "position": pos + 1, "temperature": temperature,
                         "accepted": accepted[step, pos].astype(np.int64)})


@pytest.fixture(scope="module")
def two_regimes() -> pd.DataFrame:
    """Short contexts (128, 512) from the illustrative curve; long ones (4096, 8192) accepting 30 %."""
    short = chain_log(0, 8_000)
    short = short[short["context_len"] < 1024]
    return pd.concat([short, flat_log(1, 6_000, (4096, 8192), 0.3)], ignore_index=True)


def test_each_expert_answers_from_its_own_regime_alone(two_regimes) -> None:
    """Below the edge, the mixture answers exactly as boosted trees trained on the short rows
    alone (same settings: boosting draws nothing at random), whatever the long rows hold."""
    moe = train_acceptance_regressor(two_regimes, **META, estimator="mixture_of_experts", edges=(1024,),
                                     expert="gradient_boosting", n_estimators=40)
    short = two_regimes[two_regimes["context_len"] < 1024]
    alone = train_acceptance_regressor(short, **META, estimator="gradient_boosting", n_estimators=40)
    assert moe.kind == "mixture_of_experts"
    for c in (128, 512, 1023):
        assert moe.position_probabilities(c, K, 0.0) == alone.position_probabilities(c, K, 0.0)


def test_the_long_regime_recovers_its_own_acceptance(two_regimes) -> None:
    """Above the edge every position's prediction is within 4 standard errors of 0.3, the long
    rows' truth, over that position's rows."""
    moe = train_acceptance_regressor(two_regimes, **META, estimator="mixture_of_experts", edges=(1024,), n_estimators=30)
    long = two_regimes[two_regimes["context_len"] >= 1024]
    for c in (4096, 8192):
        counts = long[long["context_len"] == c].groupby("position").size()
        for i, got in enumerate(moe.position_probabilities(c, K, 0.0), 1):
            assert abs(got - 0.3) <= 4 * np.sqrt(0.3 * 0.7 / counts[i]), (c, i, got)


def test_a_temperature_gate_routes_by_temperature() -> None:
    """Gated by temperature at 0.5: greedy rows (p 0.8) and sampled rows (p 0.4) get their own experts."""
    log = pd.concat([flat_log(2, 4_000, (256, 1024), 0.8, 0.0), flat_log(3, 4_000, (256, 1024), 0.4, 1.0)], ignore_index=True)
    moe = train_acceptance_regressor(log, **META, estimator="mixture_of_experts", gate="temperature", edges=(0.5,),
                                     n_estimators=20)
    assert moe.estimator.regime(256, 0.0) == 0 and moe.estimator.regime(256, 1.0) == 1
    assert moe.position_probabilities(256, 1, 0.0)[0] == pytest.approx(0.8, abs=0.03)
    assert moe.position_probabilities(256, 1, 1.0)[0] == pytest.approx(0.4, abs=0.03)


def test_a_mixture_saves_and_loads(two_regimes, tmp_path) -> None:
    """A mixture bundle loads back with its kind and the same answers on both sides of the edge."""
    moe = train_acceptance_regressor(two_regimes, **META, estimator="mixture_of_experts", edges=(1024,), n_estimators=10)
    loaded = load_acceptance_regressor(moe.save(tmp_path / "moe.joblib"))
    assert loaded.kind == "mixture_of_experts"
    for c in (512, 4096):
        assert loaded.position_probabilities(c, K, 0.0) == moe.position_probabilities(c, K, 0.0)


def test_a_regime_without_rows_is_refused(two_regimes) -> None:
    """Edges that leave a regime empty are refused, naming the regime."""
    with pytest.raises(ValueError, match=r"the context_len regime \[1024, 2048\) has no rows"):
        train_acceptance_regressor(two_regimes, **META, estimator="mixture_of_experts", edges=(1024, 2048, 4096))


@pytest.mark.parametrize(("settings", "message"), [
    ({"edges": (1024,)}, "belong to estimator='mixture_of_experts'"),
    ({"estimator": "mixture_of_experts", "edges": ()}, "edges must be a non-empty ascending list"),
    ({"estimator": "mixture_of_experts", "edges": (2048, 1024)}, "edges must be a non-empty ascending list"),
    ({"estimator": "mixture_of_experts", "edges": (0,)}, r"distinct numbers > 0"),
    ({"estimator": "mixture_of_experts", "edges": (1024,), "gate": "prompt"}, "gate must be one of context_len, temperature"),
    ({"estimator": "mixture_of_experts", "edges": (1024,), "expert": "svm"}, "expert must be one of"),
])
def test_bad_mixture_settings_are_refused(two_regimes, settings, message) -> None:
    """A mixture's settings are checked, and refused without a mixture."""
    with pytest.raises(ValueError, match=message):
        train_acceptance_regressor(two_regimes, **META, **settings)


def test_the_command_trains_a_mixture(two_regimes, tmp_path, capsys) -> None:
    """``--estimator mixture_of_experts --edges 1024`` writes a mixture bundle."""
    path = tmp_path / "log.csv"
    two_regimes.to_csv(path, index=False)
    out = tmp_path / "m.joblib"
    assert main([str(path), "--out", str(out), "--drafter", "d", "--verifier", "v", "--source", "s",
                 "--estimator", "mixture_of_experts", "--edges", "1024", "--n-estimators", "10"]) == 0
    assert "trained mixture_of_experts" in capsys.readouterr().out
    assert load_acceptance_regressor(out).estimator.edges == (1024.0,)
