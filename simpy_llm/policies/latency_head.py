"""The latency-aware γ head (seed 003 §6.4.1): ``latency_head``, a γ policy reading the
telemetry vector :data:`LATENCY_HEAD_FEATURES` through a linear head (:class:`LatencyHead`) or a
small MLP (:class:`LatencyMlp`), with its memory per request or per target. Fitted offline by
:mod:`simpy_llm.explore.gamma_head`; the other γ policies are in :mod:`simpy_llm.policies.gamma`.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from typing import ClassVar, Protocol, TypedDict

import attrs
import numpy as np
import numpy.typing as npt

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.structure import converter
from simpy_llm.config.validators import at_least, greater_than, in_range, one_of
from simpy_llm.policies.gamma import GammaState, clamp_gamma, gamma_policies

__all__ = ["LATENCY_HEAD_FEATURES", "LatencyHead", "LatencyMlp", "MlpLayer"]


LATENCY_HEAD_FEATURES: tuple[str, ...] = (
    "verify_queue_wait_s",
    "kv_utilization",
    "rtt_s",
    "acceptance_ewma",
    "draft_step_s",
    "verify_step_s",
    "slo_tpot_s",
    "gamma",
)
"""The feature vector of :class:`LatencyHead`, in order: the :class:`GammaState` fields of the
same names (``slo_tpot_s`` is 0 when the request has no target; ``gamma`` is the last γ)."""


def _floats(value: Iterable[float]) -> tuple[float, ...]:
    """A vector as a tuple."""
    return tuple(value)


def _weights_length(_inst: object, attr: attrs.Attribute, value: tuple[float, ...]) -> None:
    if len(value) != len(LATENCY_HEAD_FEATURES):
        raise FieldValueError(
            attr.name,
            f"give one weight per feature ({len(LATENCY_HEAD_FEATURES)}: {', '.join(LATENCY_HEAD_FEATURES)}), "
            f"got {len(value)}",
        )
    for i, w in enumerate(value):
        if not (isinstance(w, (int, float)) and math.isfinite(w)):
            raise FieldValueError(f"{attr.name}[{i}]", f"must be a finite number, got {w!r}")


class _HeadMemory:
    """What a latency head carries from one decision to the next: the ring buffer of feature
    vectors, the last smoothed output (None before the first) and the count of consecutive
    evaluated rounds below ``fused_below``."""

    __slots__ = ("below", "buffer", "smoothed")

    def __init__(self, history: int) -> None:
        self.buffer: deque[tuple[float, ...]] = deque(maxlen=history)
        self.smoothed: float | None = None
        self.below = 0


class _Routed(Protocol):
    """What a head keyed by target reads of its request: the fleet index of its target."""

    replica: int


_TARGET_MEMORY: weakref.WeakKeyDictionary[object, dict[int, _HeadMemory]] = weakref.WeakKeyDictionary()
"""The memories of heads with ``history_scope: target``, by target replica, for each object the
mechanism binds them to (the simulation's draft fleet): one set per simulation, dropped with it."""


@attrs.define(kw_only=True)
class _HeadControl:
    """What the linear and the MLP latency heads share: the ring buffer, the cold-start fallback,
    the smoothing, the fused hysteresis and where the memory of all three lives."""

    reads_position_probabilities: ClassVar[bool] = False
    """The rule never reads ``state.position_probabilities`` (the mechanism may leave it empty)."""

    history: int = attrs.field(default=3, validator=at_least(1))
    """Rounds kept in the ring buffer whose features are averaged."""
    min_samples: int = attrs.field(default=2, validator=at_least(1))
    """Rounds in the buffer before the head is used (<= history)."""
    default_gamma: int = attrs.field(default=4, validator=at_least(1))
    """γ while the buffer holds fewer than min_samples rounds, tokens."""
    smoothing: float = attrs.field(default=0.5, validator=[greater_than(0.0), in_range(0.0, 1.0)])
    """Weight of the newest head output in the exponential smoothing, (0, 1] (1: none)."""
    fused_below: float = attrs.field(default=1.5, validator=greater_than(-math.inf))
    """Smoothed output below which a round counts towards fused, tokens."""
    fused_rounds: int = attrs.field(default=2, validator=at_least(1))
    """Consecutive rounds below fused_below before γ = 1 is chosen."""
    history_scope: str = attrs.field(default="request", validator=one_of(("request", "target")))
    """Whose memory (ring buffer, smoothed output, fused count) a decision reads and extends:
    ``request``, the request's own; ``target``, one per target replica, shared by every request
    verified there (seed 003 §6.4.1: "each target keeps a small history ring buffer")."""
    _memory: _HeadMemory | None = attrs.field(default=None, init=False, repr=False)
    _request: _Routed | None = attrs.field(default=None, init=False, repr=False)
    _shared: dict[int, _HeadMemory] | None = attrs.field(default=None, init=False, repr=False)

    @min_samples.validator
    def _min_samples_within_history(self, attr: attrs.Attribute, value: int) -> None:
        if value > self.history:
            raise FieldValueError(attr.name, f"must be <= history ({self.history}), got {value}")

    def __attrs_post_init__(self) -> None:
        if self.history_scope == "request":
            self._memory = _HeadMemory(self.history)

    def bind_request(self, request: _Routed, scope: object) -> None:
        """Called by the mechanism once, as the request this policy object serves starts.

        Under ``history_scope: target`` the head keeps *request* (whose ``replica`` names the
        target at each decision) and shares one memory per target replica with every head
        bound to the same *scope* (the mechanism passes the simulation's draft fleet, so
        memories never cross simulations). Under ``request`` there is nothing to do.
        """
        if self.history_scope == "target":
            self._request = request
            self._shared = _TARGET_MEMORY.setdefault(scope, {})

    def _target_memory(self) -> _HeadMemory:
        """The memory of the bound request's current target (made empty on its first use)."""
        request, shared = self._request, self._shared
        if request is None or shared is None:
            raise RuntimeError("history_scope: target needs bind_request(request, scope) before the first decision")
        memory = shared.get(request.replica)
        if memory is None:
            memory = shared[request.replica] = _HeadMemory(self.history)
        return memory

    @staticmethod
    def features(state: GammaState) -> tuple[float, ...]:
        """The feature vector of *state*, in the order of :data:`LATENCY_HEAD_FEATURES`."""
        return (
            state.verify_queue_wait_s,
            state.kv_utilization,
            state.rtt_s,
            state.acceptance_ewma,
            state.draft_step_s,
            state.verify_step_s,
            state.slo_tpot_s or 0.0,
            float(state.gamma),
        )

    def output(self, features: Sequence[float]) -> float:
        """The head's raw output on one feature vector, tokens (each form defines it)."""
        raise NotImplementedError

    def next_gamma(self, state: GammaState) -> int:
        """Append this state's features; before ``min_samples`` answer ``default_gamma``; then
        smooth :meth:`output` on the buffer's mean, count rounds below ``fused_below`` (fused after
        ``fused_rounds`` of them), else round the smoothed output half up, at least 2."""
        memory = self._memory or self._target_memory()
        buffer = memory.buffer
        buffer.append(self.features(state))
        n = len(buffer)
        if n < self.min_samples:
            return clamp_gamma(self.default_gamma, state)
        y = self.output([sum(column) / n for column in zip(*buffer, strict=True)])
        a = self.smoothing
        s = y if memory.smoothed is None else a * y + (1 - a) * memory.smoothed
        memory.smoothed = s
        memory.below = memory.below + 1 if s < self.fused_below else 0
        if memory.below >= self.fused_rounds:
            return clamp_gamma(1, state)
        rounded = math.floor(s + 0.5) if math.isfinite(s) else (state.k_max if s > 0 else state.k_min)
        return clamp_gamma(max(2, rounded), state)

    @property
    def smoothed_output(self) -> float | None:
        """The last smoothed head output, tokens (None before the head was first used; under
        ``history_scope: target``, that of the bound request's target, None while unbound)."""
        memory = self._memory
        if memory is None:
            if self._request is None:
                return None
            memory = self._target_memory()
        return memory.smoothed


@gamma_policies.register("latency_head")
@attrs.define(kw_only=True)
class LatencyHead(_HeadControl):
    """Linear latency-aware γ head (seed 003 §6.4.1, in small).

    Each call appends this state's feature vector (:data:`LATENCY_HEAD_FEATURES`)
    to a ring buffer of the last ``history`` rounds, and then:

    1. while the buffer holds fewer than ``min_samples`` rounds, returns
       ``default_gamma`` (the cold-start fallback; the head is not evaluated);
    2. otherwise the head's output is ``y = weights · mean(buffer) + bias``,
       smoothed as ``s = smoothing * y + (1 - smoothing) * s_prev`` (the first
       output is taken as is);
    3. fused hysteresis: γ = 1 ("run fused") only once ``s < fused_below`` has
       held for ``fused_rounds`` consecutive evaluated rounds; leaving fused
       needs just one round at or above it;
    4. otherwise γ = ``floor(s + 0.5)`` (round half up), at least 2 (γ = 1 is
       reserved for fused), clamped to ``[k_min, k_max]``. Fused also gives
       ``k_min`` when ``k_min > 1``.

    The weights and bias are parameters (§6.4.1 fits them offline on oracle labels
    from simulator sweeps: :mod:`simpy_llm.explore.gamma_head` does, with scikit-learn;
    no fitted weights ship). The ring buffer, the smoothed output and the fused count are
    the request's own (``history_scope: request``, the default: the mechanism builds one
    policy object per request) or its target's, shared by every request verified there
    (``history_scope: target``, as the seed places them; :meth:`bind_request`).
    :class:`LatencyMlp` is the same policy with a small MLP in place of the linear head.

    Examples
    --------
    >>> head = LatencyHead(weights=(0, 0, -20, 0, 0, 0, 0, 0), bias=5.0, history=2, min_samples=1,
    ...                    smoothing=1.0, fused_below=1.5, fused_rounds=2)
    >>> [head.next_gamma(GammaState(gamma=4, k_min=1, k_max=6, rtt_s=r)) for r in (0.05, 0.2, 0.2, 0.2)]
    [4, 3, 2, 1]
    """

    weights: tuple[float, ...] = attrs.field(converter=_floats, validator=_weights_length)
    """One coefficient per feature of :data:`LATENCY_HEAD_FEATURES`, tokens per feature unit."""
    bias: float = attrs.field(default=0.0, validator=greater_than(-math.inf))  # i.e. finite
    """Intercept of the head, tokens."""

    @classmethod
    def from_params(cls, params: dict[str, object]) -> LatencyHead | LatencyMlp:
        """The head a scenario's ``params:`` describe: this linear head (``weights``, ``bias``)
        or, when ``layers`` is given, the MLP head :class:`LatencyMlp` (``layers``,
        ``activation``); the other keys are the same for both.

        >>> type(LatencyHead.from_params({"layers": [{"weights": [[0.0] * 8], "bias": [3.0]}]})).__name__
        'LatencyMlp'
        >>> LatencyHead.from_params({"layers": [{"weights": [[0.0] * 8], "bias": [3.0]}], "bias": 1.0})
        Traceback (most recent call last):
        ...
        simpy_llm.config.errors.FieldValueError: bias: a linear head's key; an MLP head (layers) has its biases in its layers
        """
        if "layers" in params:
            linear = [key for key in ("weights", "bias") if key in params]
            if linear:
                raise FieldValueError(linear[0], "a linear head's key; an MLP head (layers) has its biases in its layers")
            return converter.structure(params, LatencyMlp)
        if "activation" in params:
            raise FieldValueError("activation", "applies to an MLP head only: give layers (or drop activation for the linear head)")
        return converter.structure(params, cls)

    def output(self, features: Sequence[float]) -> float:
        """The head's raw output on one feature vector, ``weights · features + bias``, tokens.

        >>> LatencyHead(weights=(0, 0, -20, 0, 0, 0, 0, 0), bias=5.0).output((0, 0, 0.1, 0, 0, 0, 0, 4))
        3.0
        """
        return sum(w * x for w, x in zip(self.weights, features, strict=True)) + self.bias

    def next_gamma(self, state: GammaState) -> int:
        # The steps of _HeadControl written out here, not shared through calls: this runs once per round.
        memory = self._memory or self._target_memory()
        buffer = memory.buffer
        buffer.append(self.features(state))
        n = len(buffer)
        if n < self.min_samples:
            return clamp_gamma(self.default_gamma, state)
        mean = [sum(column) / n for column in zip(*buffer, strict=True)]
        y = sum(w * x for w, x in zip(self.weights, mean, strict=True)) + self.bias
        a = self.smoothing
        s = y if memory.smoothed is None else a * y + (1 - a) * memory.smoothed
        memory.smoothed = s
        memory.below = memory.below + 1 if s < self.fused_below else 0
        if memory.below >= self.fused_rounds:
            return clamp_gamma(1, state)
        rounded = math.floor(s + 0.5) if math.isfinite(s) else (state.k_max if s > 0 else state.k_min)
        return clamp_gamma(max(2, rounded), state)


def _rows(value: Iterable[Iterable[float]]) -> tuple[tuple[float, ...], ...]:
    """A weight matrix as a tuple of rows."""
    return tuple(tuple(row) for row in value)


@attrs.frozen(kw_only=True)
class MlpLayer:
    """One dense layer of :class:`LatencyMlp`: ``out_j = sum_k weights[j][k] in_k + bias[j]``.

    >>> MlpLayer(weights=[[1, 2], [3, 4]], bias=[0, 1]).weights
    ((1, 2), (3, 4))
    """

    weights: tuple[tuple[float, ...], ...] = attrs.field(converter=_rows)
    """One row per unit of the layer, one entry per input (a feature, or a unit of the layer before)."""
    bias: tuple[float, ...] = attrs.field(converter=_floats)
    """One intercept per unit of the layer."""


class MlpLayerData(TypedDict):
    """An :class:`MlpLayer` as plain data (``{weights: [[...], ...], bias: [...]}``)."""

    weights: Iterable[Iterable[float]]
    bias: Iterable[float]


def _layers(value: Iterable[MlpLayer | MlpLayerData]) -> tuple[MlpLayer, ...]:
    """Layers given as :class:`MlpLayer` or as ``{weights, bias}`` mappings (in Python)."""
    return tuple(layer if isinstance(layer, MlpLayer) else MlpLayer(**layer) for layer in value)


def _finite(path: str, value: object) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)):
        raise FieldValueError(path, f"must be a finite number, got {value!r}")


def _layer_shapes(_inst: object, attr: attrs.Attribute, layers: tuple[MlpLayer, ...]) -> None:
    """Each layer takes the previous one's units (the first: the features); the last has one unit."""
    if not layers:
        raise FieldValueError(attr.name, "give at least one layer; the last has one unit (the head's output)")
    width, source = len(LATENCY_HEAD_FEATURES), "feature"
    for i, layer in enumerate(layers):
        path = f"{attr.name}[{i}]"
        if not layer.weights:
            raise FieldValueError(f"{path}.weights", "give at least one row (one per unit)")
        for j, row in enumerate(layer.weights):
            if len(row) != width:
                raise FieldValueError(f"{path}.weights[{j}]", f"must have {width} entries (one per {source}), got {len(row)}")
            for k, w in enumerate(row):
                _finite(f"{path}.weights[{j}][{k}]", w)
        if len(layer.bias) != len(layer.weights):
            raise FieldValueError(f"{path}.bias", f"must have one entry per row of weights ({len(layer.weights)}), got {len(layer.bias)}")
        for j, b in enumerate(layer.bias):
            _finite(f"{path}.bias[{j}]", b)
        width, source = len(layer.weights), f"unit of {attr.name}[{i}]"
    if width != 1:
        raise FieldValueError(f"{attr.name}[{len(layers) - 1}].weights", f"the last layer must have one row (the head's output), got {width}")


@attrs.define(kw_only=True)
class LatencyMlp(_HeadControl):
    """The latency-aware γ head of :class:`LatencyHead` with a small MLP for the linear head
    (seed 003 §6.4.1: "a single hidden-layer MLP (<16 hidden units)"): ``kind: latency_head``
    with ``layers`` (and ``activation``) in its params in place of ``weights`` and ``bias``
    (:meth:`LatencyHead.from_params`).

    Every step is :class:`LatencyHead`'s (ring buffer, cold start, smoothing, fused
    hysteresis, rounding, ``history_scope``) except the head's output on the buffer's
    mean feature vector ``x``: ``h_0 = x``, ``h_i = act(W_i h_{i-1} + b_i)`` for each
    layer but the last, and ``y = W_L h_{L-1} + b_L`` (the last layer is linear, with one
    unit), ``act`` being ``relu`` (``max(z, 0)``) or ``tanh``. The first layer reads raw
    features, as :class:`LatencyHead` does: :func:`simpy_llm.explore.gamma_head.fit_head`
    folds its standardisation into that layer. The output is evaluated with numpy, one
    small matrix-vector product per layer and decision.

    Examples
    --------
    One hidden unit ``relu(-20 rtt + 4)`` plus 1: γ falls with the round trip.

    >>> mlp = LatencyMlp(layers=[{"weights": [[0, 0, -20, 0, 0, 0, 0, 0]], "bias": [4.0]},
    ...                          {"weights": [[1.0]], "bias": [1.0]}], activation="relu", history=1, min_samples=1, smoothing=1.0)
    >>> mlp.output((0, 0, 0.05, 0, 0, 0, 0, 4)), mlp.output((0, 0, 0.5, 0, 0, 0, 0, 4))
    (4.0, 1.0)
    >>> [mlp.next_gamma(GammaState(gamma=4, k_min=1, k_max=6, rtt_s=r)) for r in (0.0, 0.05)]
    [5, 4]
    """

    layers: tuple[MlpLayer, ...] = attrs.field(converter=_layers, validator=_layer_shapes)
    """The dense layers, first to last: ``{weights: [[...], ...], bias: [...]}`` each, one weight
    row per unit; the first layer's rows have one entry per feature of
    :data:`LATENCY_HEAD_FEATURES`, each later layer's one per unit of the layer before; the last
    layer has one unit (the output, tokens) and no activation."""
    activation: str = attrs.field(default="relu", validator=one_of(("relu", "tanh")))
    """Activation of every layer but the last: ``relu`` or ``tanh``."""
    _hidden: tuple[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]], ...] = attrs.field(init=False, repr=False)
    _out_weights: npt.NDArray[np.float64] = attrs.field(init=False, repr=False)
    _out_bias: float = attrs.field(init=False, repr=False)
    _relu: bool = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # As float arrays once: a decision is then one small matrix-vector product per layer.
        self._hidden = tuple(
            (np.array(layer.weights, dtype=np.float64), np.array(layer.bias, dtype=np.float64)) for layer in self.layers[:-1]
        )
        self._out_weights = np.array(self.layers[-1].weights[0], dtype=np.float64)
        self._out_bias = float(self.layers[-1].bias[0])
        self._relu = self.activation == "relu"

    def output(self, features: Sequence[float]) -> float:
        """The MLP's raw output on one feature vector (in :data:`LATENCY_HEAD_FEATURES` order), tokens."""
        h = np.array(features, dtype=np.float64)
        relu = self._relu
        for weights, bias in self._hidden:
            h = weights @ h
            h += bias
            if relu:
                np.maximum(h, 0.0, out=h)
            else:
                np.tanh(h, out=h)
        return float(self._out_weights @ h) + self._out_bias
