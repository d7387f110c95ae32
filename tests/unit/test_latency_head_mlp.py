"""The latency head as a small MLP: its forward pass, its params' checks, and its offline fit."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simpy_llm import scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from simpy_llm.explore.gamma_head import fit_head, main
from simpy_llm.policies.gamma import GammaState
from simpy_llm.policies.latency_head import LATENCY_HEAD_FEATURES, LatencyHead, LatencyMlp
from tests.spec_helpers import flat_curve, spec_scenario

SCALES = np.array([0.1, 1.0, 0.5, 1.0, 0.02, 0.05, 0.2, 6.0])
"""Rough ranges of the features (s, share, s, share, s, s, s, tokens)."""


def _random_layers(rng: np.random.Generator, hidden: tuple[int, ...]) -> list[dict[str, Any]]:
    """Plain-data layers of random weights: 8 inputs, *hidden* units, one output."""
    sizes = (len(LATENCY_HEAD_FEATURES), *hidden, 1)
    return [
        {"weights": rng.normal(size=(units, inputs)).tolist(), "bias": rng.normal(size=units).tolist()}
        for inputs, units in itertools.pairwise(sizes)
    ]


def _numpy_forward(layers: list[dict[str, Any]], activation: str, x: np.ndarray) -> float:
    """The MLP written out in numpy from the plain-data layers (shares no code with the policy)."""
    h = np.asarray(x, dtype=np.float64)
    for i, layer in enumerate(layers):
        h = np.asarray(layer["weights"]) @ h + np.asarray(layer["bias"])
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0) if activation == "relu" else np.tanh(h)
    return float(h[0])


@pytest.mark.parametrize(("hidden", "activation"), [((16,), "relu"), ((16,), "tanh"), ((8, 4), "relu"), ((5, 3), "tanh")])
def test_mlp_output_equals_an_independent_numpy_forward_pass(hidden: tuple[int, ...], activation: str) -> None:
    """For random weights and 200 random feature vectors, the head's output equals a numpy forward pass to 1e-12."""
    rng = np.random.default_rng(7)
    layers = _random_layers(rng, hidden)
    head = LatencyHead.from_params({"layers": copy.deepcopy(layers), "activation": activation})
    assert isinstance(head, LatencyMlp)
    for x in rng.random((200, len(LATENCY_HEAD_FEATURES))) * SCALES:
        assert head.output(tuple(x)) == pytest.approx(_numpy_forward(layers, activation, x), rel=0, abs=1e-12)


def test_mlp_next_gamma_rounds_the_forward_pass_on_the_buffer_mean() -> None:
    """With smoothing 1 and a buffer of 2, each γ is the forward pass on the mean of the last two
    feature vectors, rounded half up, at least 2, within [k_min, k_max]."""
    rng = np.random.default_rng(3)
    layers = _random_layers(rng, (6,))
    head = LatencyHead.from_params({"layers": layers, "activation": "tanh", "history": 2, "min_samples": 1,
                                    "smoothing": 1.0, "fused_below": -1e9})
    states = [GammaState(gamma=4, k_min=1, k_max=8, rtt_s=float(r), verify_queue_wait_s=float(w), kv_utilization=float(k))
              for r, w, k in rng.random((30, 3)) * (0.5, 0.1, 1.0)]
    vectors = [np.array(LatencyHead.features(s)) for s in states]
    for i, state in enumerate(states):
        mean = np.mean(vectors[max(0, i - 1): i + 1], axis=0)
        expected = min(8, max(2, int(np.floor(_numpy_forward(layers, "tanh", mean) + 0.5))))
        assert head.next_gamma(state) == expected


def _scenario_with_head(tmp_path: Path, params: dict[str, Any]) -> dict[str, Any]:
    data = spec_scenario(flat_curve(tmp_path, [0.8] * 4), requests=5, network={"rtt_ms": 20})
    data["speculation"]["gamma_policy"] = {"kind": "latency_head", "params": params}
    return data


def test_mlp_params_load_in_a_scenario_and_run(tmp_path: Path) -> None:
    """``latency_head`` with ``layers`` loads from a scenario, builds the MLP head, and the run completes."""
    from simpy_llm.simulation import Simulation

    layers = _random_layers(np.random.default_rng(0), (4,))
    scenario = scenario_from_dict(_scenario_with_head(tmp_path, {"layers": layers, "activation": "tanh", "min_samples": 1}))
    assert scenario.speculation is not None
    frame = Simulation(scenario).run(progress=False).to_dataframe()
    assert len(frame) == 5 and frame["completion_s"].notna().all()


_GOOD = [{"weights": [[0.0] * 8, [0.0] * 8], "bias": [0.0, 0.0]}, {"weights": [[1.0, 1.0]], "bias": [2.0]}]


def _with(change: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {"layers": copy.deepcopy(_GOOD)}
    for key, value in change.items():
        if key.startswith("layers"):
            i, field = key.split(".")[1:]
            params["layers"][int(i)][field] = value
        else:
            params[key] = value
    return params


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        ({"layers.0.weights": [[0.0] * 7, [0.0] * 8]}, "layers[0].weights[0]", "must have 8 entries (one per feature), got 7"),
        ({"layers.1.weights": [[1.0, 1.0, 1.0]]}, "layers[1].weights[0]", "must have 2 entries (one per unit of layers[0]), got 3"),
        ({"layers.0.bias": [0.0]}, "layers[0].bias", "one entry per row of weights (2), got 1"),
        ({"layers.1.weights": [[1.0, 1.0], [1.0, 1.0]], "layers.1.bias": [0.0, 0.0]}, "layers[1].weights", "the last layer must have one row"),
        ({"layers.0.weights": []}, "layers[0].weights", "at least one row"),
        ({"layers.1.bias": [float("nan")]}, "layers[1].bias[0]", "finite"),
        ({"activation": "sigmoid"}, "activation", "relu, tanh"),
        ({"weights": [0.0] * 8}, "weights", "an MLP head (layers) has its biases in its layers"),
    ],
)
def test_bad_mlp_params_are_refused_at_their_key_path(tmp_path: Path, change: dict[str, Any], path: str, words: str) -> None:
    """A wrong shape or value in the MLP's params is refused, naming its key path and what is allowed."""
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(_scenario_with_head(tmp_path, _with(change)))
    problems = dict(err.value.problems)
    key = f"speculation.gamma_policy.params.{path}"
    assert key in problems, problems
    assert words in problems[key]


def test_empty_layers_and_a_lone_activation_are_refused(tmp_path: Path) -> None:
    """``layers: []`` and ``activation`` without ``layers`` (a linear head) are refused at their keys."""
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(_scenario_with_head(tmp_path, {"layers": []}))
    assert "speculation.gamma_policy.params.layers" in err.value.paths
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(_scenario_with_head(tmp_path, {"weights": [0.0] * 8, "activation": "relu"}))
    assert "speculation.gamma_policy.params.activation" in err.value.paths


def _nonlinear_labels(seed: int, rows: int) -> pd.DataFrame:
    """Random features whose label is a bump in the round trip plus a hinge in acceptance."""
    rng = np.random.default_rng(seed)
    x = rng.random((rows, len(LATENCY_HEAD_FEATURES))) * SCALES
    frame = pd.DataFrame(x, columns=list(LATENCY_HEAD_FEATURES))
    frame["gamma_label"] = 1 + 5 * np.exp(-((x[:, 2] / 0.15) ** 2)) + 2 * np.maximum(0.0, x[:, 3] - 0.5)
    return frame


def _rmse(head: LatencyHead | LatencyMlp, frame: pd.DataFrame) -> float:
    predicted = np.array([head.output(tuple(row)) for row in frame[list(LATENCY_HEAD_FEATURES)].to_numpy()])
    return float(np.sqrt(np.mean((predicted - frame["gamma_label"].to_numpy()) ** 2)))


def test_fit_head_mlp_beats_the_linear_head_on_a_nonlinear_label() -> None:
    """On a label that is a nonlinear function of the features, the fitted MLP head (standardisation
    folded into its first layer) has a lower error than the least-squares linear head, on the
    400 rows it was fitted on and on 200 held-out rows."""
    pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")
    train, held_out = _nonlinear_labels(1, 400), _nonlinear_labels(2, 200)
    linear = LatencyHead.from_params(fit_head(train, loss="l2"))
    mlp = LatencyHead.from_params(fit_head(train, loss="mlp", hidden=(16,)))
    assert isinstance(mlp, LatencyMlp)
    assert _rmse(mlp, train) < 0.5 * _rmse(linear, train)
    assert _rmse(mlp, held_out) < 0.5 * _rmse(linear, held_out)


def test_fit_head_mlp_is_deterministic_and_ignores_a_constant_feature() -> None:
    """The same table gives the same MLP params; a feature constant in the table gets first-layer weight 0."""
    pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")
    labels = _nonlinear_labels(4, 120)
    labels["gamma"] = 4.0
    first, second = fit_head(labels, loss="mlp", hidden=(6,)), fit_head(labels, loss="mlp", hidden=(6,))
    assert first == second
    column = LATENCY_HEAD_FEATURES.index("gamma")
    assert all(row[column] == 0.0 for row in first["layers"][0]["weights"])
    assert [len(layer["bias"]) for layer in first["layers"]] == [6, 1]


@pytest.mark.parametrize(("kwargs", "words"), [({"hidden": ()}, "hidden"), ({"hidden": (0,)}, "hidden"),
                                                ({"activation": "silu"}, "activation"), ({"alpha": -1.0}, "alpha")])
def test_fit_head_mlp_refuses_bad_settings(kwargs: dict[str, Any], words: str) -> None:
    """An invalid MLP setting is refused by name before any fit."""
    with pytest.raises(ValueError, match=words):
        fit_head(_nonlinear_labels(0, 10), loss="mlp", **kwargs)


def test_cli_model_mlp_writes_an_mlp_latency_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--model mlp --hidden 4`` writes ``{kind: latency_head, params: {layers, activation}}`` that builds the MLP head."""
    pytest.importorskip("sklearn", reason="needs the learn extra (scikit-learn): pip install -e '.[learn]'")
    import yaml

    import simpy_llm.explore.gamma_head as module

    monkeypatch.setattr(module, "load_scenario", lambda path: path)
    monkeypatch.setattr(module, "oracle_labels", lambda *args, **kwargs: _nonlinear_labels(5, 60))
    out = tmp_path / "head.yaml"
    main(["ignored.yaml", "--model", "mlp", "--hidden", "4", "--activation", "tanh", "--out", str(out)])
    policy = yaml.safe_load(out.read_text())
    assert policy["kind"] == "latency_head" and policy["params"]["activation"] == "tanh"
    head = LatencyHead.from_params(policy["params"])
    assert isinstance(head, LatencyMlp) and [len(layer.bias) for layer in head.layers] == [4, 1]
