"""The Vidur-profile latency model (serving/profiled.py): table lookups and its analytic terms."""

from __future__ import annotations

import csv

import attrs
import pytest

from simpy_llm.config.errors import FieldValueError
from simpy_llm.serving.hardware import model_spec
from simpy_llm.serving.latency import latency_models, profiles_dir
from simpy_llm.serving.profiled import OPERATORS, ProfiledLatency, operator_table, vidur_models

OPS = ["input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
       "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]


def _csv_layer_ms(gpu: str, model: str, tp: int) -> dict[int, float]:
    """Per token count: the mean over its rows of the summed operator medians (ms), read independently."""
    path = profiles_dir() / "vidur" / "compute" / gpu / "meta-llama" / model / "mlp.csv"
    sums: dict[int, list[float]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if int(row["num_tensor_parallel_workers"]) == tp:
                total = sum(float(row[f"time_stats.{op}.median"]) for op in OPS)
                sums.setdefault(int(row["num_tokens"]), []).append(total)
    return {n: sum(v) / len(v) for n, v in sums.items()}


def test_sums_the_operators_vidur_sums() -> None:
    """The operators summed are Vidur's nine per-layer non-attention operators."""
    assert list(OPERATORS) == OPS


@pytest.mark.parametrize(("gpu", "model", "tp"), [("a100", "Meta-Llama-3-8B", 1), ("a100", "Meta-Llama-3-8B", 2),
                                                  ("h100", "Llama-2-7b-hf", 4)])
def test_reproduces_every_measured_point(gpu: str, model: str, tp: int) -> None:
    """At every measured token count, the non-attention time is layers x the CSV's operator sum."""
    m = ProfiledLatency(model=model, gpu=gpu, tp=tp)
    measured = _csv_layer_ms(gpu, model, tp)
    assert len(measured) > 250
    for tokens, layer_ms in measured.items():
        assert m.non_attention_time_s(tokens) == pytest.approx(32 * layer_ms * 1e-3, rel=1e-12), tokens


def test_interpolates_linearly_between_measured_points() -> None:
    """Between the measured 24 and 32 tokens, 26 tokens take a quarter of the way from one to the other."""
    measured = _csv_layer_ms("a100", "Meta-Llama-3-8B", 1)
    assert 26 not in measured
    expected = measured[24] + (measured[32] - measured[24]) * 2 / 8
    m = ProfiledLatency(model="Meta-Llama-3-8B", gpu="a100")
    assert m.non_attention_time_s(26) == pytest.approx(32 * expected * 1e-3, rel=1e-12)


def test_extrapolates_from_the_last_two_points() -> None:
    """Beyond the last measured count (4096 for Llama 2 on H100), time continues the last segment's line."""
    measured = _csv_layer_ms("h100", "Llama-2-7b-hf", 1)
    assert max(measured) == 4096 and 4064 in measured
    slope = (measured[4096] - measured[4064]) / 32
    m = ProfiledLatency(model="Llama-2-7b-hf", gpu="h100")
    assert m.non_attention_time_s(5000) == pytest.approx(32 * (measured[4096] + slope * 904) * 1e-3, rel=1e-12)


def test_step_adds_analytic_attention_allreduce_and_lm_head() -> None:
    """A step is layers x (table + roofline attention) + roofline all-reduce + LM head."""
    m = ProfiledLatency(model="Llama-2-7b-hf", gpu="h100", tp=2)
    r = m.roofline
    p, d, c, a = 100, 8, 8 * 1000, 100 * 101 // 2
    expected = (
        32 * (m.table.layer_time_s(108) + r.attention_layer_time_s(p, d, c, a))
        + r.all_reduce_time_s(108)
        + r.lm_head_time_s(p, d)
    )
    assert m.step_time_s(p, d, decode_context_tokens=c, prefill_attention_pairs=a) == pytest.approx(expected, rel=1e-12)
    assert r.all_reduce_time_s(108) > 0 and m.step_time_s(0, 0) == 0.0


def test_decode_context_lengthens_the_step() -> None:
    """The analytic attention term makes a decode step over a long context slower than over none."""
    m = ProfiledLatency(model="Meta-Llama-3-8B", gpu="a100")
    assert m.step_time_s(0, 64, decode_context_tokens=64 * 4096) > m.step_time_s(0, 64) * 1.2


@pytest.mark.parametrize(("model", "config"), [("Meta-Llama-3-8B", "llama-3.1-8b-instruct"),
                                               ("Meta-Llama-3-70B", "llama-3.1-70b-instruct"),
                                               ("Llama-2-7b-hf", "llama-2-7b-hf")])
def test_profile_shape_matches_the_shipped_config(model: str, config: str) -> None:
    """The shape read from a profile's columns (and layer count) equals the shipped config of that model."""
    from_profile = operator_table("a100", model, 1).model
    assert attrs.evolve(model_spec(config), name=model) == from_profile


def test_gpus_and_their_models() -> None:
    """The A100 has four Llama models profiled, the H100 only the two Llama 2 models."""
    assert vidur_models() == {
        "a100": ("Llama-2-70b-hf", "Llama-2-7b-hf", "Meta-Llama-3-70B", "Meta-Llama-3-8B"),
        "h100": ("Llama-2-70b-hf", "Llama-2-7b-hf"),
    }


def test_unknown_model_names_model_and_lists_the_gpus_models() -> None:
    """A model not profiled on that GPU is a FieldValueError on model, listing what the GPU has."""
    with pytest.raises(FieldValueError) as info:
        ProfiledLatency(model="Meta-Llama-3-8B", gpu="h100")
    assert info.value.field == "model" and "Llama-2-7b-hf" in info.value.message


def test_unknown_gpu_names_gpu() -> None:
    """A GPU without profiles is a FieldValueError on gpu, listing a100 and h100."""
    with pytest.raises(FieldValueError) as info:
        ProfiledLatency(model="Llama-2-7b-hf", gpu="v100")
    assert info.value.field == "gpu" and "a100, h100" in info.value.message


def test_unprofiled_tp_names_tp() -> None:
    """A TP degree without rows is a FieldValueError on tp, listing the degrees profiled."""
    with pytest.raises(FieldValueError) as info:
        ProfiledLatency(model="Llama-2-7b-hf", gpu="h100", tp=3)
    assert info.value.field == "tp" and "1, 2, 4, 8" in info.value.message


def test_registered_as_profile_with_context() -> None:
    """`profile` is registered, asks the engine for context, and maps a100 to the A100-80 GPU."""
    m = latency_models.get("profile")(model="Meta-Llama-3-8B", gpu="A100", alpha2_us=10.0)
    assert ProfiledLatency.uses_context and m.hardware.gpu.name == "A100-80"
    assert m.output_token_overhead_s == pytest.approx(10e-6)
