"""The LUT latency model (serving/lut.py): loading and validating LUT files, interpolation,
tail sampling, and a scenario run on it."""

from __future__ import annotations

import copy
import math
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simpy_llm.serving.lut  # noqa: F401 - registers the ``lut`` latency model
from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.paths import base_dir
from simpy_llm.serving.hardware import model_spec
from simpy_llm.serving.latency import latency_models, profiles_dir
from simpy_llm.serving.lut import REQUIRED_COLUMNS, Z95, LutLatency, LutSlice, load_lut, lognormal_sigma
from simpy_llm.serving.profiled import ProfiledLatency

LUTS = profiles_dir() / "luts"
EXAMPLE = LUTS / "example_small.csv"
VIDUR = LUTS / "meta-llama-3-8b_a100_tp1.csv"
CONTEXTS = (128, 256, 512, 1024, 2048, 4096, 8192)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def example(**params) -> LutLatency:
    """The ``lut`` model on the hand-written example table."""
    return LutLatency(path=str(EXAMPLE), model="example-8b", hardware="example-gpu", **params)


def vidur() -> LutLatency:
    return LutLatency(path=str(VIDUR), model="Meta-Llama-3-8B", hardware="A100-80")


def profile() -> ProfiledLatency:
    return ProfiledLatency(model="Meta-Llama-3-8B", gpu="a100", tp=1)


def example_frame() -> pd.DataFrame:
    """The example table's cells as strings."""
    return pd.read_csv(EXAMPLE, dtype=str, keep_default_na=False)


def write(frame: pd.DataFrame, folder: Path, name: str = "lut.csv") -> Path:
    path = folder / name
    frame.to_csv(path, index=False)
    return path


def problems_of(path: Path) -> list[tuple[str, str]]:
    with pytest.raises(ScenarioError) as info:
        load_lut(path)
    assert info.value.source == str(path)
    return info.value.problems


# --------------------------------------------------------------------------- registration


def test_registered_as_lut() -> None:
    """Importing the module registers the model as ``lut``."""
    assert latency_models.get("lut") is LutLatency


# --------------------------------------------------------------------------- interpolation


def test_grid_points_return_the_table_value() -> None:
    """At every grid point of the prefill and decode slices, a pure step takes exactly the row's latency_ms."""
    m = example()
    frame = example_frame()
    checked = 0
    for row in frame.itertuples():
        c, b, ms = int(row.context_len), int(row.microbatch), float(row.latency_ms)
        if row.phase == "prefill":
            assert m.step_time_s(c, 0) == ms / 1e3
        elif row.phase == "decode":
            assert m.step_time_s(0, b, decode_context_tokens=c * b) == ms / 1e3
        else:
            continue
        checked += 1
    assert checked == 12


def test_bilinear_between_grid_points() -> None:
    """Inside a grid cell the decode latency is the bilinear blend of its four corners."""
    # context 320 is halfway from 128 to 512; microbatch 10 halfway from 4 to 16
    corners = {(128, 4): 9.0, (128, 16): 12.0, (512, 4): 9.5, (512, 16): 14.0}
    hand = 0.5 * (0.5 * corners[128, 4] + 0.5 * corners[128, 16]) + 0.5 * (0.5 * corners[512, 4] + 0.5 * corners[512, 16])
    assert hand == 11.125
    assert example().step_time_s(0, 10, decode_context_tokens=320 * 10) == pytest.approx(hand / 1e3, rel=1e-15)
    # off-centre: context 224 is a quarter of the way, microbatch 7 a quarter of the way
    tc, tb = (224 - 128) / 384, (7 - 4) / 12
    hand2 = (1 - tc) * ((1 - tb) * 9.0 + tb * 12.0) + tc * ((1 - tb) * 9.5 + tb * 14.0)
    assert example().step_time_s(0, 7, decode_context_tokens=224 * 7) == pytest.approx(hand2 / 1e3, rel=1e-15)


def test_prefill_interpolates_linearly_in_prompt_length() -> None:
    """The prefill term at an off-grid prompt length is on the line between the two rows around it."""
    # 320 tokens: halfway between 128 (12 ms) and 512 (40 ms)
    assert example().step_time_s(320, 0) == pytest.approx(0.026, rel=1e-15)


def test_extrapolates_along_the_last_two_grid_points() -> None:
    """Beyond the grid, each axis continues the line through its last (or first) two grid points."""
    m = example()
    # context 3584 past 2048, microbatch 1: 9.0 + (9.0 - 8.2) / (2048 - 512) * 1536
    assert m.step_time_s(0, 1, decode_context_tokens=3584) == pytest.approx(9.8e-3, rel=1e-12)
    # microbatch 28 past 16, context 128: 12 + (12 - 9) / 12 * 12
    assert m.step_time_s(0, 28, decode_context_tokens=128 * 28) == pytest.approx(15e-3, rel=1e-12)
    # prompt of 64 tokens, before 128: 12 - (40 - 12) / 384 * 64
    assert m.step_time_s(64, 0) == pytest.approx((12 - 28 / 384 * 64) / 1e3, rel=1e-12)


def test_extrapolation_never_goes_below_zero(tmp_path: Path) -> None:
    """A line extrapolated below zero is held at zero."""
    frame = example_frame()
    frame.loc[frame.phase == "prefill", "latency_ms"] = ["10", "50", "200"]  # 128, 512, 2048 tokens
    m = LutLatency(path=str(write(frame, tmp_path)), model="example-8b", hardware="example-gpu")
    # slope 40/384 per token: at 16 tokens 10 - 112 * 40 / 384 < 0
    assert m.step_time_s(16, 0) == 0.0
    assert m.step_time_s(128, 0) == 0.01


def test_one_point_axis_is_constant() -> None:
    """An axis with one grid point is constant along it (no slope to extrapolate)."""
    s = LutSlice.from_points(("decode", "m", "g", 1, 1, "fp16", 1), [(512, 1, 7.0), (512, 8, 9.0)])
    assert s.latency_ms_at(100, 1) == s.latency_ms_at(5000, 1) == 7.0
    assert s.latency_ms_at(512, 4) == pytest.approx(7.0 + 2.0 * 3 / 7)


def test_zero_tokens_cost_nothing() -> None:
    """A part of the step with no tokens costs 0, so an empty step takes 0 s."""
    m = example()
    assert m.step_time_s(0, 0) == 0.0
    assert m.step_time_s(512, 0) == 0.04
    assert m.step_time_s(0, 4, decode_context_tokens=2048) == 0.0095


def test_mixed_step_is_prefill_plus_decode() -> None:
    """A step with prompt and decode tokens takes the sum of the two terms."""
    m = example()
    assert m.step_time_s(512, 4, decode_context_tokens=2048) == pytest.approx(0.04 + 0.0095, rel=1e-15)


def test_prefill_attention_pairs_are_not_read() -> None:
    """The prefill term depends on the prompt tokens of the step only (one sequence of their total length)."""
    m = example()
    assert m.step_time_s(512, 0, prefill_attention_pairs=1) == m.step_time_s(512, 0, prefill_attention_pairs=10**9)


def test_overheads_are_blis_alphas() -> None:
    """Queueing is alpha0 + alpha1 x prompt tokens and alpha2 is the per-token overhead (µs)."""
    m = example(alpha0_us=1000.0, alpha1_us=2.0, alpha2_us=30.0)
    assert m.queueing_time_s(512) == pytest.approx(2.024e-3)
    assert m.output_token_overhead_s == pytest.approx(30e-6)


@settings(max_examples=200, deadline=None)
@given(c=st.floats(1, 20_000), b=st.floats(1, 600))
def test_vectorised_interpolation_equals_the_scalar_one(c: float, b: float) -> None:
    """``LutSlice.interpolate`` (numpy searchsorted) gives the scalar lookup's value at any point."""
    s = example().decode
    assert s.interpolate([c], [b])[0] == s.latency_ms_at(c, b)
    assert s.interpolate([c], [b], column="latency_p95_ms")[0] == s.p95_ms_at(c, b)


# --------------------------------------------------------------------------- the Vidur-derived table


def test_vidur_lut_reproduces_the_profile_model_at_grid_points() -> None:
    """At every grid point the shipped table gives ProfiledLatency's step time, up to the
    ms -> s conversion (relative 1e-15, a few ulp)."""
    m, p = vidur(), profile()
    for c in CONTEXTS:
        assert m.step_time_s(c, 0) == pytest.approx(p.step_time_s(c, 0, prefill_attention_pairs=c * (c + 1) // 2), rel=1e-15)
        for b in BATCHES:
            want = p.step_time_s(0, b, decode_context_tokens=c * b)
            assert m.step_time_s(0, b, decode_context_tokens=c * b) == pytest.approx(want, rel=1e-15)


def test_vidur_lut_is_exact_along_context_at_grid_batches() -> None:
    """Off the grid in context but at a grid batch size, decode is still exact: the profile's
    decode step is linear in the context (memory-bound attention reads ``kv x C`` bytes, the
    rest does not depend on C), and linear interpolation reproduces a line."""
    m, p = vidur(), profile()
    for b in BATCHES:
        for c in range(128, 8193, 97):
            want = p.step_time_s(0, b, decode_context_tokens=c * b)
            assert m.step_time_s(0, b, decode_context_tokens=c * b) == pytest.approx(want, rel=1e-12)


def test_vidur_lut_off_grid_within_the_interpolation_error() -> None:
    """Anywhere inside the grid the table is within -25% / +7% of ProfiledLatency.

    The error is interpolation error of the profile model's non-smooth parts, bounded by
    what a power-of-two grid can see. Vidur's measured layer time jumps just past
    multiples of 128 tokens (GEMM tile and wave quantisation: 0.412 ms at 128 tokens, 0.565
    at 136; 0.609 at 256, 0.829 at 264, A100 Llama 3 8B), and the grid's powers of two sit at
    the bottoms of those steps, so a chord under-estimates just past each grid point: at
    most 24.1% (prefill of 264 tokens) and 20.6% (decode of 136 sequences at 128 tokens of
    context), measured on every prompt length and on 133 context lengths x 86 batch sizes of decode. It
    over-estimates where the profile is convex between grid points (prefill attention
    grows with the square of the prompt; the LM head switches from memory- to
    compute-bound): at most 5.9% (prompt of 760 tokens) and 4.4% (49 sequences). The
    bounds are those maxima rounded out to -25% and +7%.
    """
    m, p = vidur(), profile()
    prefill = [m.step_time_s(c, 0) / p.step_time_s(c, 0, prefill_attention_pairs=c * (c + 1) // 2) - 1
               for c in range(128, 8193)]
    decode = [m.step_time_s(0, b, decode_context_tokens=c * b) / p.step_time_s(0, b, decode_context_tokens=c * b) - 1
              for c in range(128, 8193, 61) for b in range(1, 257, 3)]
    for errors in (prefill, decode):
        assert -0.25 <= min(errors) and max(errors) <= 0.07, (min(errors), max(errors))
    assert min(prefill) < -0.2 and min(decode) < -0.2  # the sawtooth is really there (the bound is not loose)


def test_vidur_lut_has_the_profile_hardware() -> None:
    """The Vidur table's model and GPU resolve to a Hardware (for ``kv_num_blocks: auto``) with
    the profile's shape, which equals the shipped Llama 3.1 8B config; the example's do not."""
    hw = vidur().hardware
    assert hw.gpu.name == "A100-80" and hw.tp == 1
    assert hw.model.num_layers == model_spec("llama-3.1-8b-instruct").num_layers
    assert hw.model.num_kv_heads == model_spec("llama-3.1-8b-instruct").num_kv_heads
    assert example().hardware is None


# --------------------------------------------------------------------------- validation


def test_missing_column_is_named(tmp_path: Path) -> None:
    """A LUT without a required column is refused, naming the column."""
    path = write(example_frame().drop(columns=["dtype"]), tmp_path)
    (where, message), = problems_of(path)
    assert where == "dtype" and "required column is missing" in message


def test_context_must_not_lower_latency(tmp_path: Path) -> None:
    """A latency that falls as context_len grows (other keys fixed) is refused at its row and column."""
    frame = example_frame()
    frame.loc[4, "latency_ms"] = "7.5"  # decode (512, 1) below (128, 1) = 8.0; file row 6
    where_messages = problems_of(write(frame, tmp_path))
    assert ("row 6: latency_ms" in [w for w, _ in where_messages])
    message = dict(where_messages)["row 6: latency_ms"]
    assert "context_len 512" in message and "row 5" in message and "must not decrease as context_len grows" in message


def test_microbatch_must_not_lower_latency(tmp_path: Path) -> None:
    """A latency that falls as microbatch grows (other keys fixed) is refused at its row and column."""
    frame = example_frame()
    frame.loc[9, "latency_ms"] = "8.5"  # decode (128, 16) below (128, 4) = 9.0; file row 11
    (where, message), = problems_of(write(frame, tmp_path))
    assert where == "row 11: latency_ms" and "as microbatch grows" in message


def test_bad_dtype_is_named(tmp_path: Path) -> None:
    """A dtype outside fp16/bf16/fp8 is refused at its row, listing the allowed values."""
    frame = example_frame()
    frame.loc[2, "dtype"] = "fp32"
    (where, message), = problems_of(write(frame, tmp_path))
    assert where == "row 4: dtype" and "fp16, bf16, fp8" in message and "'fp32'" in message


def test_duplicate_key_is_named(tmp_path: Path) -> None:
    """A row repeating another's key is refused at its row, naming the row it repeats."""
    frame = example_frame()
    frame = pd.concat([frame, frame.iloc[[3]]], ignore_index=True)  # row 5 again, as row 16
    (where, message), = problems_of(write(frame, tmp_path))
    assert where == "row 16: context_len, microbatch" and "repeats row 5" in message


def test_unknown_phase_is_named(tmp_path: Path) -> None:
    """A phase outside the enumeration is refused at its row, listing the phases."""
    frame = example_frame()
    frame.loc[0, "phase"] = "decoding"
    (where, message), = problems_of(write(frame, tmp_path))
    assert where == "row 2: phase"
    assert "prefill, draft_decode, verify, fused_decode, decode" in message


def test_sparse_grid_is_refused(tmp_path: Path) -> None:
    """A slice that is not a full context_len x microbatch grid is refused, listing the missing points."""
    frame = example_frame().drop(index=[7])  # decode (512, 4)
    (where, message), = problems_of(write(frame, tmp_path))
    assert where.endswith(": context_len, microbatch") and "not a full grid" in message and "(512, 4)" in message


@pytest.mark.parametrize(
    ("column", "value", "fragment"),
    [
        ("context_len", "0", "whole number in [1,"),
        ("microbatch", "2.5", "whole number in [1,"),
        ("tensor_parallel", "two", "whole number in [1,"),
        ("latency_ms", "-1", "number in [0,"),
        ("latency_ms", "nan", "number in [0,"),
        ("latency_p95_ms", "-3", "number >= 0"),
        ("model", "", "must not be blank"),
    ],
)
def test_bad_cells_are_named(tmp_path: Path, column: str, value: str, fragment: str) -> None:
    """A cell outside its column's type or range is refused at its row and column, saying what is allowed."""
    frame = example_frame()
    frame.loc[1, column] = value
    (where, message), = problems_of(write(frame, tmp_path))
    assert where == f"row 3: {column}" and fragment in message


def test_unknown_column_is_refused(tmp_path: Path) -> None:
    """A column outside the schema is refused, listing the allowed columns."""
    frame = example_frame().assign(throughput="1")
    (where, message), = problems_of(write(frame, tmp_path))
    assert where == "throughput" and "unknown column" in message and "latency_p95_ms" in message


@pytest.mark.parametrize(("text", "fragment"), [("", "empty"), (",".join(REQUIRED_COLUMNS) + "\n", "no rows")])
def test_empty_files_are_refused(tmp_path: Path, text: str, fragment: str) -> None:
    """An empty file, or one with only a header, is refused with a ScenarioError."""
    path = tmp_path / "lut.csv"
    path.write_text(text)
    assert fragment in problems_of(path)[0][1]


def test_unreadable_path_is_a_field_error() -> None:
    """A path that names no file is reported on the ``path`` parameter."""
    with pytest.raises(FieldValueError) as info:
        LutLatency(path="/nonexistent/lut.csv", model="m", hardware="g")
    assert info.value.field == "path"


@pytest.mark.parametrize(
    ("change", "field"),
    [({"model": "other"}, "model"), ({"hardware": "H100"}, "hardware"),
     ({"tensor_parallel": 2}, "tensor_parallel"), ({"pipeline_parallel": 2}, "pipeline_parallel"),
     ({"dtype": "bf16"}, "dtype")],
)
def test_missing_slice_names_the_parameter(change: dict, field: str) -> None:
    """Asking for rows the file does not have blames the parameter and lists the file's slices."""
    params = {"path": str(EXAMPLE), "model": "example-8b", "hardware": "example-gpu", **change}
    with pytest.raises(FieldValueError) as info:
        LutLatency(**params)
    assert info.value.field == field
    assert "decode example-8b on example-gpu tp1 pp1 fp16 fanout_k 1" in info.value.message


def test_model_needs_prefill_and_decode_slices(tmp_path: Path) -> None:
    """A file with decode rows but no prefill rows for the requested configuration is refused on ``path``."""
    frame = example_frame()
    path = write(frame[frame.phase != "prefill"], tmp_path)
    with pytest.raises(FieldValueError) as info:
        LutLatency(path=str(path), model="example-8b", hardware="example-gpu")
    assert info.value.field == "path" and "no prefill rows" in info.value.message


def test_params_are_checked() -> None:
    """``from_params`` refuses unknown keys, a missing required key and an ``rng``."""
    base = {"path": str(EXAMPLE), "model": "example-8b", "hardware": "example-gpu"}
    assert LutLatency.from_params(base).hardware_name == "example-gpu"
    for params, field in (({**base, "gpu": "x"}, "gpu"), ({"path": str(EXAMPLE), "model": "m"}, "hardware"),
                          ({**base, "rng": 1}, "rng"), ({**base, "tail": "p99"}, "tail"),
                          ({**base, "tensor_parallel": 0}, "tensor_parallel")):
        with pytest.raises(FieldValueError) as info:
            LutLatency.from_params(params)
        assert info.value.field == field


def test_relative_path_resolves_against_the_scenario_directory(tmp_path: Path) -> None:
    """While a scenario is loaded, a relative path is taken from the scenario's directory."""
    (tmp_path / "tables").mkdir()
    write(example_frame(), tmp_path / "tables", "t.csv")
    with base_dir(tmp_path):
        m = LutLatency(path="tables/t.csv", model="example-8b", hardware="example-gpu")
    assert m.path == str(tmp_path / "tables" / "t.csv")


def test_edited_file_is_read_again(tmp_path: Path) -> None:
    """The loaded table is cached per file version: a changed file gives the new values."""
    frame = example_frame()
    path = write(frame, tmp_path)
    assert LutLatency(path=str(path), model="example-8b", hardware="example-gpu").step_time_s(512, 0) == 0.04
    frame.loc[1, "latency_ms"] = "41.0"
    write(frame, tmp_path)
    os.utime(path, ns=(0, 10**18))  # a different modification time even on a coarse clock
    assert LutLatency(path=str(path), model="example-8b", hardware="example-gpu").step_time_s(512, 0) == 0.041


# --------------------------------------------------------------------------- tail sampling


def test_lognormal_sigma_solves_mean_and_p95() -> None:
    """The lognormal with the returned sigma has the given mean and 95th percentile; p95 <= mean gives 0."""
    for mean, p95 in ((10.0, 10.5), (9.5, 11.875), (2.0, 7.0)):
        s = lognormal_sigma(mean, p95)
        mu = math.log(mean) - s * s / 2
        assert math.exp(mu + Z95 * s) == pytest.approx(p95, rel=1e-12)
    assert lognormal_sigma(10.0, 10.0) == lognormal_sigma(10.0, 8.0) == 0.0


def test_sampled_tail_matches_mean_and_p95() -> None:
    """With ``tail: sampled``, decode steps at a grid point have the row's mean and p95, to 4 standard errors.

    Row (context 512, microbatch 4): mean 9.5 ms, p95 11.875 ms. For n lognormal draws with
    sigma s the sample mean's standard error is ``mean sqrt(exp(s^2) - 1) / sqrt(n)``, and the
    sample 95th percentile's is ``sqrt(0.95 x 0.05 / n) / f(p95)`` with the lognormal density
    ``f(p95) = phi(z95) / (p95 s)``.
    """
    m = example(tail="sampled", rng=np.random.default_rng(20240601))
    n = 40_000
    draws = np.array([m.step_time_s(0, 4, decode_context_tokens=2048) for _ in range(n)]) * 1e3
    mean, p95 = 9.5, 11.875
    s = lognormal_sigma(mean, p95)
    se_mean = mean * math.sqrt(math.exp(s * s) - 1) / math.sqrt(n)
    density = statistics.NormalDist().pdf(Z95) / (p95 * s)
    se_p95 = math.sqrt(0.95 * 0.05 / n) / density
    assert abs(draws.mean() - mean) < 4 * se_mean, (draws.mean(), se_mean)
    assert abs(np.quantile(draws, 0.95) - p95) < 4 * se_p95, (np.quantile(draws, 0.95), se_p95)
    assert draws.std() > 0


def test_sampled_tail_is_reproducible() -> None:
    """The same seed gives the same sequence of step times."""
    def draws(seed: int) -> list[float]:
        m = example(tail="sampled", rng=np.random.default_rng(seed))
        return [m.step_time_s(300, 3, decode_context_tokens=900) for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_p95_not_above_mean_is_deterministic(tmp_path: Path) -> None:
    """Where latency_p95_ms <= latency_ms the sampled step takes its mean and draws nothing."""
    frame = example_frame()
    frame["latency_p95_ms"] = frame["latency_ms"]
    path = write(frame, tmp_path)
    rng = np.random.default_rng(1)
    m = LutLatency(path=str(path), model="example-8b", hardware="example-gpu", tail="sampled", rng=rng)
    state = copy.deepcopy(rng.bit_generator.state)
    assert m.step_time_s(512, 4, decode_context_tokens=2048) == pytest.approx(0.0495, rel=1e-15)
    assert rng.bit_generator.state == state


def test_sampled_without_rng_raises_on_use() -> None:
    """``tail: sampled`` with no random stream builds (the simulation injects one after building)
    but refuses to time a step."""
    m = example(tail="sampled")
    assert LutLatency.needs_rng
    with pytest.raises(RuntimeError, match="no random stream"):
        m.step_time_s(512, 0)
    assert m.mean_step_time_s(512, 0) == 0.04


def test_sampled_needs_p95_everywhere() -> None:
    """``tail: sampled`` on a table without latency_p95_ms is refused on ``tail``."""
    with pytest.raises(FieldValueError) as info:
        LutLatency(path=str(VIDUR), model="Meta-Llama-3-8B", hardware="A100-80", tail="sampled")
    assert info.value.field == "tail" and "latency_p95_ms" in info.value.message


def test_sampled_refuses_p95_no_lognormal_has(tmp_path: Path) -> None:
    """A p95 more than 3.87 times its mean (beyond any lognormal) is refused on ``tail``, naming the row."""
    frame = example_frame()
    frame.loc[0, "latency_p95_ms"] = "50"  # prefill 128: 12 ms mean
    path = write(frame, tmp_path)
    with pytest.raises(FieldValueError) as info:
        LutLatency(path=str(path), model="example-8b", hardware="example-gpu", tail="sampled")
    assert info.value.field == "tail" and "row 2" in info.value.message


# --------------------------------------------------------------------------- a scenario


def lut_scenario(prompt: int, path: str = str(EXAMPLE)) -> dict:
    """One request of *prompt* tokens and 4 output tokens on a replica timed by the example LUT."""
    return {
        "seed": 3,
        "workload": {
            "aggregate_rate": 1.0,
            "num_requests": 1,
            "clients": [{
                "id": "only",
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": prompt}},
                "output_distribution": {"type": "constant", "params": {"value": 4}},
            }],
        },
        "serving": {
            "replicas": 1,
            "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 4096, "kv_block_size": 16, "kv_num_blocks": 1000},
            "latency_model": {"kind": "lut", "params": {
                "path": path, "model": "example-8b", "hardware": "example-gpu", "alpha0_us": 1000.0, "alpha1_us": 2.0,
            }},
        },
    }


def test_scenario_ttft_is_queueing_plus_prefill_row() -> None:
    """An isolated request's TTFT is its queueing delay plus the prefill row of its prompt length."""
    res = Simulation(scenario_from_dict(lut_scenario(512))).run()
    cols = res.columns
    assert cols["status"][0] == "completed"
    ttft = cols["first_token_s"][0] - cols["arrival_s"][0]
    # abs: the engine's clock counts whole nanoseconds (the step starts at the enqueue time
    # rounded to the nanosecond, docs/model.md "Clock")
    assert ttft == pytest.approx((1000.0 + 2.0 * 512) * 1e-6 + 40.0e-3, rel=1e-9, abs=1e-9)


def test_a_relative_lut_path_is_read_against_the_scenario_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scenario file naming its LUT by a path relative to itself runs from another working
    directory: the loaded scenario keeps the path resolved."""
    import shutil

    import yaml

    from simpy_llm import load_scenario

    (tmp_path / "tables").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "tables" / "lut.csv")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(lut_scenario(512, path="tables/lut.csv")))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    scenario = load_scenario(tmp_path / "s.yaml")
    assert scenario.serving.latency_model.params["path"] == str(tmp_path / "tables" / "lut.csv")
    assert Simulation(scenario).run().columns["status"][0] == "completed"


def test_a_sampled_lut_draws_from_the_simulations_stream() -> None:
    """tail: sampled in a simulation: the same seed gives the same records, another seed
    other step times, and the scenario cannot set the stream itself."""
    def ttfts(seed: int) -> list[float]:
        data = lut_scenario(512)
        data["seed"] = seed
        data["workload"]["num_requests"] = 20
        data["serving"]["latency_model"]["params"]["tail"] = "sampled"
        res = Simulation(scenario_from_dict(data)).run()
        return (res.columns["first_token_s"] - res.columns["arrival_s"]).tolist()

    assert ttfts(1) == ttfts(1) != ttfts(2)
    data = lut_scenario(512)
    data["serving"]["latency_model"]["params"].update(tail="sampled", rng=3)
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    assert info.value.paths == ["serving.latency_model.params.rng"]


def test_scenario_reports_a_bad_lut_parameter() -> None:
    """A scenario naming rows the LUT lacks is refused at the parameter's key path."""
    data = lut_scenario(512)
    data["serving"]["latency_model"]["params"]["model"] = "other"
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    assert info.value.paths == ["serving.latency_model.params.model"]


# --------------------------------------------------------------------------- fuzz

_CELLS = st.one_of(
    st.sampled_from(["", "0", "1", "-1", "2.5", "1e400", "nan", "inf", "fp8", "bf16", "decode", "prefill",
                     "verify", "batched", "x", "16777217", " 4 ", "3.0"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8),
    st.integers(-5, 10_000).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
_MUTATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("cell"), st.integers(0, 13), st.integers(0, 12), _CELLS),
        st.tuples(st.just("drop_column"), st.integers(0, 12)),
        st.tuples(st.just("drop_row"), st.integers(0, 13)),
        st.tuples(st.just("duplicate_row"), st.integers(0, 13)),
        st.tuples(st.just("add_column"), st.sampled_from(["peak_mem_mb", "energy_mj", "attn_mode", "kv_delta_mb", "extra", ""])),
        st.tuples(st.just("rename_column"), st.integers(0, 12), st.sampled_from(["latency_ms", "phase", "notes", "Phase"])),
        st.tuples(st.just("shuffle_rows"), st.integers(0, 2**32 - 1)),
        st.tuples(st.just("shuffle_columns"), st.integers(0, 2**32 - 1)),
    ),
    max_size=5,
)


@settings(max_examples=100, deadline=None)
@given(mutations=_MUTATIONS)
def test_loader_loads_or_raises_scenario_error(mutations: list[tuple]) -> None:
    """A mutated LUT either loads (and then every slice is a monotone full grid) or raises
    ScenarioError; never another exception."""
    frame = example_frame()
    for op, *args in mutations:
        if op == "cell" and len(frame) and len(frame.columns):
            frame.iat[args[0] % len(frame), args[1] % len(frame.columns)] = args[2]
        elif op == "drop_column" and len(frame.columns):
            frame = frame.drop(columns=frame.columns[args[0] % len(frame.columns)])
        elif op == "drop_row" and len(frame):
            frame = frame.drop(index=frame.index[args[0] % len(frame)])
        elif op == "duplicate_row" and len(frame):
            frame = pd.concat([frame, frame.iloc[[args[0] % len(frame)]]], ignore_index=True)
        elif op == "add_column":
            frame[args[0] or "Unnamed"] = "1"
        elif op == "rename_column" and len(frame.columns):
            frame = frame.rename(columns={frame.columns[args[0] % len(frame.columns)]: args[1]})
        elif op == "shuffle_rows":
            frame = frame.sample(frac=1.0, random_state=args[0])
        elif op == "shuffle_columns":
            frame = frame[list(np.random.default_rng(args[0]).permutation(frame.columns))]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lut.csv"
        frame.to_csv(path, index=False)
        try:
            lut = load_lut(path)
        except ScenarioError as exc:
            assert exc.problems
            return
    for s in lut.slices.values():
        assert np.isfinite(s.latency_ms).all()
        assert (np.diff(s.latency_ms, axis=0) >= 0).all() and (np.diff(s.latency_ms, axis=1) >= 0).all()
