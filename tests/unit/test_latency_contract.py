"""The latency-model contract (serving/latency_base.py): every built-in kind has every member
its callers read, and the optional capabilities have their documented defaults."""

from __future__ import annotations

from typing import Any

import pytest

from simpy_llm import Simulation
from simpy_llm.config.errors import FieldValueError
from simpy_llm.loading import scenario_from_dict
from simpy_llm.serving.latency import LatencyModel, LatencyModelBase, RequestOverheads, latency_models, profiles_dir
from tests.helpers import tiny_scenario

BUILT = {
    "blis_linear": {"beta0_us": 1000.0, "beta2_us": 10.0, "cache_restore_us": 70.0},
    "batch_table": {"decode_step_us": (13_000.0, 45_000.0), "prefill_token_us": 3_000.0, "cache_restore_us": 70_000.0},
    "roofline": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 1},
    "profile": {"model": "Meta-Llama-3-8B", "gpu": "a100", "tp": 1},
    "lut": {"path": str(profiles_dir() / "luts" / "example_small.csv"), "model": "example-8b", "hardware": "example-gpu"},
}
"""One instance's parameters per built-in kind."""

PROTOCOL_MEMBERS = sorted(name for name in vars(LatencyModel) if not name.startswith("_"))
"""What the Protocol declares (its properties and methods)."""


def _model(kind: str) -> Any:
    return latency_models.get(kind)(**BUILT[kind])


def test_every_built_in_kind_is_listed_here() -> None:
    """The registry holds exactly the kinds this file builds (a new kind is checked too)."""
    assert sorted(latency_models.names()) == sorted(BUILT)


def test_the_protocol_declares_what_callers_read() -> None:
    """The Protocol names the required members and every optional capability."""
    assert PROTOCOL_MEMBERS == [
        "cache_restore_s", "fused_time_s", "hardware", "mean_step_time_s", "output_token_overhead_s",
        "queueing_time_s", "step_energy_j", "step_time_s", "uses_context", "verify_time_s",
    ]


@pytest.mark.parametrize("kind", sorted(BUILT))
def test_every_built_in_kind_has_every_member(kind: str) -> None:
    """Each built-in model derives from LatencyModelBase and answers every member of the
    Protocol with a value of the documented kind."""
    m = _model(kind)
    assert isinstance(m, RequestOverheads) and isinstance(m, LatencyModelBase)
    for name in PROTOCOL_MEMBERS:
        assert hasattr(m, name), name
    assert isinstance(m.uses_context, bool)
    assert isinstance(m.cache_restore_s, float)
    assert m.verify_time_s is None or callable(m.verify_time_s)
    assert m.step_energy_j is None or callable(m.step_energy_j)
    assert m.fused_time_s is None or callable(m.fused_time_s)
    assert m.mean_step_time_s(512, 0) == m.step_time_s(512, 0) > 0
    assert isinstance(type(m).needs_rng, bool)


def test_optional_capabilities_as_the_kinds_state_them() -> None:
    """The kinds override the defaults they have: the restore cost of blis_linear and
    batch_table, the attention terms of the context-aware kinds, LUT's verify table and
    random stream, the hardware of the kinds that name a model and GPU."""
    got = {kind: _model(kind) for kind in BUILT}
    assert {k: m.cache_restore_s for k, m in got.items()} == pytest.approx(
        {"blis_linear": 70e-6, "batch_table": 0.07, "roofline": 0.0, "profile": 0.0, "lut": 0.0}
    )
    assert {k: m.uses_context for k, m in got.items()} == {
        "blis_linear": False, "batch_table": False, "roofline": True, "profile": True, "lut": True,
    }
    assert {k for k, m in got.items() if m.verify_time_s is not None} == {"lut"}
    assert {k for k in got if latency_models.get(k).needs_rng} == {"lut"}
    assert {k for k, m in got.items() if m.hardware is not None} == {"roofline", "profile"}
    with_context = latency_models.get("batch_table")(**BUILT["batch_table"], decode_context_us=1.0)
    assert with_context.uses_context is True


class _Recording(LatencyModelBase):
    """A model of one's own: the required members only, recording each step_time_s call."""

    output_token_overhead_s = 0.0

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def step_time_s(self, prefill_tokens: int, decode_tokens: int, **attention: float) -> float:
        self.calls.append(((prefill_tokens, decode_tokens), attention))
        return 0.5

    def queueing_time_s(self, prompt_tokens: int) -> float:
        return 0.0


def test_a_model_of_ones_own_gets_the_defaults() -> None:
    """Deriving from LatencyModelBase gives the documented defaults; its mean step time is its
    step time, passed the attention terms only when they are given."""
    m = _Recording()
    assert (m.uses_context, m.cache_restore_s, m.hardware, m.verify_time_s, type(m).needs_rng) == (False, 0.0, None, None, False)
    assert m.mean_step_time_s(8, 2) == 0.5
    assert m.mean_step_time_s(8, 2, decode_context_tokens=100) == 0.5
    assert m.calls == [((8, 2), {}), ((8, 2), {"decode_context_tokens": 100, "prefill_attention_pairs": 0})]


def test_a_model_without_a_step_time_cannot_be_built() -> None:
    """The required members are abstract: a subclass missing one fails when built, not mid-run."""

    class NoStep(LatencyModelBase):
        output_token_overhead_s = 0.0

        def queueing_time_s(self, prompt_tokens: int) -> float:
            return 0.0

    with pytest.raises(TypeError, match="step_time_s"):
        NoStep()



def test_a_model_of_ones_own_that_lacks_a_member_is_refused_before_the_run() -> None:
    """A duck-typed latency model with only ``step_time_s`` is refused when the fleet is built,
    naming what it lacks and the base class that would give the defaults."""
    class OnlyStep:
        def step_time_s(self, prefill_tokens: int, decode_tokens: int) -> float:
            return 0.01

    with pytest.raises(FieldValueError, match=r"OnlyStep lacks cache_restore_s, fused_time_s, hardware, mean_step_time_s, output_token_overhead_s, "
                                               r"queueing_time_s, step_energy_j, uses_context, verify_time_s: derive it from .*LatencyModelBase"):
        Simulation(scenario_from_dict(tiny_scenario()), latency_model=OnlyStep())
