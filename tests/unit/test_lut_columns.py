"""The LUT columns beyond latency (seed 003 §5.2-5.3): Parquet files, the drift check against a
previous version, the attention / non-attention split of prefill rows, ``kv_delta_mb`` sizing the
KV cache and ``energy_mj`` giving a replica's energy. Each figure is worked out in the test from
the table's numbers."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.cli import main as cli
from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.serving.hardware import DEFAULT_ACTIVATION_HEADROOM_BYTES, auto_kv_blocks
from simpy_llm.serving.latency import profiles_dir
from simpy_llm.serving.lut import LutLatency, load_lut
from simpy_llm.serving.lut_drift import LutDriftWarning

EXAMPLE = profiles_dir() / "luts" / "example_small.csv"
VIDUR = profiles_dir() / "luts" / "meta-llama-3-8b_a100_tp1.csv"
KV_BYTES_LLAMA3_8B = 131_072
"""Llama 3 8B's KV per token on one GPU: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes."""


def frame_of(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def write(frame: pd.DataFrame, folder: Path, name: str = "lut.csv") -> Path:
    path = folder / name
    frame.to_csv(path, index=False)
    return path


def example(path: Path, **params) -> LutLatency:
    return LutLatency(path=str(path), model="example-8b", hardware="example-gpu", **params)


# --------------------------------------------------------------------------- Parquet


def typed(frame: pd.DataFrame) -> pd.DataFrame:
    """The example's columns with the types a Parquet writer would give them."""
    out = frame.copy()
    for name in ("tensor_parallel", "pipeline_parallel", "context_len", "microbatch", "fanout_k"):
        out[name] = out[name].astype(np.int64)
    for name in ("latency_ms", "latency_p95_ms"):
        out[name] = out[name].astype(float)
    return out


def test_a_parquet_lut_reads_as_its_csv(tmp_path: Path) -> None:
    """The example table written as Parquet (typed columns) loads to the same rows, and the model
    built on it gives the same step times as on the CSV."""
    path = tmp_path / "lut.parquet"
    pq.write_table(pa.Table.from_pandas(typed(frame_of(EXAMPLE)), preserve_index=False), path)
    a, b = load_lut(EXAMPLE), load_lut(path)
    pd.testing.assert_frame_equal(a.frame, b.frame)
    assert sorted(a.slices) == sorted(b.slices)
    on_csv, on_parquet = example(EXAMPLE), example(path)
    for args in [(512, 0), (0, 4, 2048.0), (300, 16, 16 * 700.0)]:
        assert on_csv.step_time_s(*args) == on_parquet.step_time_s(*args)


def test_a_parquet_lut_is_checked_like_a_csv(tmp_path: Path) -> None:
    """A bad cell of a Parquet LUT is reported at its row and column, as in a CSV; a null in an
    optional column is a blank cell."""
    frame = typed(frame_of(EXAMPLE))
    frame.loc[2, "latency_ms"] = -1.0
    frame["latency_p95_ms"] = frame["latency_p95_ms"].astype(object)
    frame.loc[5, "latency_p95_ms"] = None
    path = tmp_path / "bad.pq"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    with pytest.raises(ScenarioError) as info:
        load_lut(path)
    assert [w for w, _ in info.value.problems] == ["row 4: latency_ms"]


def test_a_file_that_is_not_parquet_is_refused_by_name(tmp_path: Path) -> None:
    """A ``.parquet`` file that is not Parquet is refused, naming the file."""
    path = tmp_path / "lut.parquet"
    path.write_text("phase,model\n")
    with pytest.raises(ScenarioError, match="cannot read the file as Parquet") as info:
        load_lut(path)
    assert info.value.source == str(path)


# --------------------------------------------------------------------------- drift


def drifted(tmp_path: Path, factor: float, row: int = 4) -> Path:
    """The example table with the latency of file row *row* (the 512-token prefill: 40 ms) scaled."""
    frame = frame_of(EXAMPLE)
    frame.loc[row - 2, "latency_ms"] = repr(float(frame.loc[row - 2, "latency_ms"]) * factor)
    return write(frame, tmp_path, "new.csv")


def test_a_lut_that_drifted_from_its_previous_version_is_refused(tmp_path: Path) -> None:
    """A row 10 % slower than in the previous version is refused with its row, values and change."""
    with pytest.raises(FieldValueError) as info:
        example(drifted(tmp_path, 1.1, row=3), previous=str(EXAMPLE))
    assert info.value.field == "path"
    assert "row 3 (prefill example-8b on example-gpu tp1 pp1 fp16 fanout_k 1, context_len 512, microbatch 1): " \
           "latency_ms 40 -> 44 ms (+10.0%)" in info.value.message


def test_drift_within_the_tolerance_is_accepted(tmp_path: Path) -> None:
    """A 4 % change passes the default 5 %; a 10 % one passes a tolerance of 0.2."""
    example(drifted(tmp_path, 1.04, row=3), previous=str(EXAMPLE))
    example(drifted(tmp_path, 1.1, row=3), previous=str(EXAMPLE), drift_tolerance=0.2)


def test_drift_warn_accepts_with_a_warning(tmp_path: Path) -> None:
    """``drift: warn`` builds the model and issues a LutDriftWarning naming the row."""
    with pytest.warns(LutDriftWarning, match=r"row 3 .*\(\+10\.0%\)"):
        m = example(drifted(tmp_path, 1.1, row=3), previous=str(EXAMPLE), drift="warn")
    assert m.step_time_s(512, 0) == pytest.approx(0.044)


def test_drift_compares_only_the_rows_the_model_reads(tmp_path: Path) -> None:
    """A drifted row of another model does not concern this one."""
    frame = frame_of(EXAMPLE)
    other = frame.copy()
    other["model"] = "other-8b"
    old = write(pd.concat([frame, other]), tmp_path, "old.csv")
    other["latency_ms"] = (other["latency_ms"].astype(float) * 2).map(repr)
    new = write(pd.concat([frame, other]), tmp_path, "new.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        example(new, previous=str(old))
    with pytest.raises(FieldValueError, match="moved more than 5%"):
        LutLatency(path=str(new), model="other-8b", hardware="example-gpu", previous=str(old))


def test_drift_settings_without_a_previous_version_are_refused() -> None:
    """``drift`` or ``drift_tolerance`` without ``previous`` is refused, not ignored."""
    with pytest.raises(FieldValueError, match="needs previous") as info:
        example(EXAMPLE, drift="warn")
    assert info.value.field == "drift"
    with pytest.raises(FieldValueError, match="needs previous"):
        example(EXAMPLE, drift_tolerance=0.1)
    with pytest.raises(FieldValueError, match=r"in \(0, 1\]"):
        example(EXAMPLE, previous=str(EXAMPLE), drift_tolerance=0.0)


def test_the_lut_drift_command_exits_by_its_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``simpy-llm lut-drift NEW OLD`` exits 0 on no drift, 1 on drift (printing the row), 2 on a bad file."""
    assert cli(["lut-drift", str(EXAMPLE), str(EXAMPLE)]) == 0
    assert "no shared row moved more than 5%" in capsys.readouterr().out
    assert cli(["lut-drift", str(drifted(tmp_path, 0.9, row=3)), str(EXAMPLE)]) == 1
    assert "latency_ms 40 -> 36 ms (-10.0%)" in capsys.readouterr().out
    assert cli(["lut-drift", str(drifted(tmp_path, 0.9, row=3)), str(EXAMPLE), "--tolerance", "0.2"]) == 0
    assert cli(["lut-drift", str(tmp_path / "missing.csv"), str(EXAMPLE)]) == 2


# --------------------------------------------------------------------------- attention split


def split_example(tmp_path: Path, attn_share: float = 0.25) -> Path:
    """The example with its prefill rows split: *attn_share* of each latency is attention."""
    frame = frame_of(EXAMPLE)
    pre = frame["phase"] == "prefill"
    lat = frame["latency_ms"].astype(float)
    frame["cost_attn_ms"] = np.where(pre, (lat * attn_share).map(repr), "")
    frame["cost_nonatt_ms"] = np.where(pre, (lat * (1 - attn_share)).map(repr), "")
    return write(frame, tmp_path, "split.csv")


def test_a_fresh_prompt_costs_its_row_with_the_split(tmp_path: Path) -> None:
    """A prompt computed from an empty cache (its own causal pairs) costs the prefill row, as without the split."""
    m = example(split_example(tmp_path))
    assert m.split_prefill
    assert m.step_time_s(512, 0, prefill_attention_pairs=512 * 513 // 2) == pytest.approx(0.040, rel=1e-12)
    assert m.step_time_s(512, 0) == pytest.approx(0.040, rel=1e-12)  # no pairs given: a fresh prompt


def test_a_chunk_after_a_cached_prefix_pays_for_its_extra_attention(tmp_path: Path) -> None:
    """512 new tokens after 1,536 cached ones: the row at 512 plus the attention of the pairs
    beyond a fresh prompt's at the row's attention cost per pair."""
    m = example(split_example(tmp_path))
    fresh = 512 * 513 / 2
    pairs = 512 * 1536 + fresh
    expected_ms = 40.0 + (pairs - fresh) * (0.25 * 40.0) / fresh
    assert m.step_time_s(512, 0, prefill_attention_pairs=pairs) * 1e3 == pytest.approx(expected_ms, rel=1e-12)


def test_short_prompts_in_one_step_cost_their_own_attention(tmp_path: Path) -> None:
    """Four fresh 128-token prompts in one step (4 x 128 x 129 / 2 pairs) cost less than one
    512-token prompt, never less than the non-attention part."""
    m = example(split_example(tmp_path))
    pairs = 4 * 128 * 129 / 2
    fresh = 512 * 513 / 2
    expected_ms = max(40.0 + (pairs - fresh) * 10.0 / fresh, 30.0)
    assert m.step_time_s(512, 0, prefill_attention_pairs=pairs) * 1e3 == pytest.approx(expected_ms, rel=1e-12)
    assert expected_ms < 40.0


def test_a_split_that_does_not_add_up_is_refused(tmp_path: Path) -> None:
    """A row whose two parts differ from its latency by more than 1 % is refused at that row."""
    frame = frame_of(split_example(tmp_path))
    frame.loc[1, "cost_attn_ms"] = "20.0"
    with pytest.raises(ScenarioError) as info:
        load_lut(write(frame, tmp_path, "bad.csv"))
    assert [w for w, _ in info.value.problems] == ["row 3: cost_attn_ms"]


def test_a_column_given_on_part_of_a_slice_is_refused(tmp_path: Path) -> None:
    """The model reads a column from every grid point of a slice or not at all: a partial one is
    refused, naming the blank rows."""
    frame = frame_of(split_example(tmp_path))
    frame.loc[2, ["cost_attn_ms", "cost_nonatt_ms"]] = ""
    with pytest.raises(FieldValueError, match=r"cost_nonatt_ms is given on part of the prefill slice.*row\(s\) 4"):
        example(write(frame, tmp_path, "part.csv"))


# --------------------------------------------------------------------------- kv_delta_mb


def vidur_with_kv(tmp_path: Path, per_token_bytes: float) -> Path:
    """The shipped Llama 3 8B table with ``kv_delta_mb`` = one step's KV growth at *per_token_bytes*."""
    frame = frame_of(VIDUR)
    dec = frame["phase"] == "decode"
    mib = frame["microbatch"].astype(float) * per_token_bytes / 2**20
    frame["kv_delta_mb"] = np.where(dec, mib.map(repr), "")
    return write(frame, tmp_path, "kv.csv")


def test_kv_delta_sizes_the_kv_cache(tmp_path: Path) -> None:
    """With ``kv_delta_mb`` the KV bytes per token are the table's (twice the shape's here), and
    ``kv_num_blocks: auto`` holds half the blocks: floor(free / (16 x bytes))."""
    m = LutLatency(path=str(vidur_with_kv(tmp_path, 2 * KV_BYTES_LLAMA3_8B)), model="Meta-Llama-3-8B", hardware="A100-80")
    hw = m.hardware
    assert hw is not None and m.kv_bytes_per_token == hw.kv_bytes_per_token == 2 * KV_BYTES_LLAMA3_8B
    free = hw.gpu.memory_bytes * 0.9 - hw.weight_bytes_per_gpu - DEFAULT_ACTIVATION_HEADROOM_BYTES
    assert auto_kv_blocks(hw, 16) == int(free // (16 * 2 * KV_BYTES_LLAMA3_8B))
    shape = LutLatency(path=str(VIDUR), model="Meta-Llama-3-8B", hardware="A100-80").hardware
    assert shape is not None and shape.kv_bytes_per_token == KV_BYTES_LLAMA3_8B
    assert auto_kv_blocks(hw, 16) in (auto_kv_blocks(shape, 16) // 2, auto_kv_blocks(shape, 16) // 2 - 1)


def test_kv_delta_that_disagrees_across_rows_is_refused(tmp_path: Path) -> None:
    """A token's KV has one size: rows whose ``kv_delta_mb / microbatch`` differ by over 1 % are refused."""
    frame = frame_of(vidur_with_kv(tmp_path, KV_BYTES_LLAMA3_8B))
    first = frame.index[frame["phase"] == "decode"][0]
    frame.loc[first, "kv_delta_mb"] = repr(float(frame.loc[first, "kv_delta_mb"]) * 1.5)
    with pytest.raises(FieldValueError, match="a token's KV has one size"):
        LutLatency(path=str(write(frame, tmp_path, "bad.csv")), model="Meta-Llama-3-8B", hardware="A100-80")


# --------------------------------------------------------------------------- energy_mj


def energy_scenario(path: Path, device: str | None = None) -> dict:
    serving = {
        "replicas": 2,
        "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "kv_block_size": 16, "kv_num_blocks": 4000},
        "latency_model": {"kind": "lut", "params": {"path": str(path), "model": "example-8b", "hardware": "example-gpu"}},
    }
    return {
        "seed": 11,
        "workload": {
            "aggregate_rate": 40.0, "num_requests": 400,
            "clients": [{
                "id": "c", "arrival": {"process": "poisson"},
                "input_distribution": {"type": "uniform", "params": {"low": 64, "high": 1500}},
                "output_distribution": {"type": "uniform", "params": {"low": 4, "high": 200}},
            }],
        },
        "serving": serving,
    }


def constant_power(tmp_path: Path, watts: float) -> Path:
    """The example with ``energy_mj`` = *watts* x ``latency_ms`` on every row (a constant draw)."""
    frame = frame_of(EXAMPLE)
    frame["energy_mj"] = (frame["latency_ms"].astype(float) * watts).map(repr)
    return write(frame, tmp_path, "energy.csv")


def test_step_energy_at_constant_power_is_power_times_busy_time(tmp_path: Path) -> None:
    """A table drawing 300 W in every row gives each replica 300 W x its busy time (the steps'
    times to the nanosecond the engine rounds them to), with no device profile."""
    res = Simulation(scenario_from_dict(energy_scenario(constant_power(tmp_path, 300.0)))).run()
    summary = res.summary()
    devices, busy = summary["devices"], summary["engine"]["busy_s"]
    assert devices["energy_j_per_replica"] == pytest.approx([300.0 * b for b in busy], rel=1e-6)
    assert devices["energy_j"] == pytest.approx(300.0 * sum(busy), rel=1e-6)
    assert devices["cost_usd"] is None


def test_a_table_without_energy_leaves_the_devices_section_out(tmp_path: Path) -> None:
    """Without ``energy_mj`` (and no device profile) a run has no energy figures, as before."""
    res = Simulation(scenario_from_dict(energy_scenario(EXAMPLE))).run()
    assert "devices" not in res.summary()


def test_energy_on_only_one_slice_is_refused(tmp_path: Path) -> None:
    """A step's energy needs both of its terms: ``energy_mj`` on prefill rows alone is refused."""
    frame = frame_of(constant_power(tmp_path, 300.0))
    frame.loc[frame["phase"] != "prefill", "energy_mj"] = ""
    with pytest.raises(FieldValueError, match="energy_mj must be given on both"):
        example(write(frame, tmp_path, "half.csv"))


def test_with_a_device_profile_the_table_replaces_active_power_and_idle_power_remains(tmp_path: Path) -> None:
    """On an H100 profile (idle 100 W) the table's 300 W steps replace ``active_w`` x busy time:
    each replica's energy is 300 W x busy + 100 W x (duration - busy)."""
    data = energy_scenario(constant_power(tmp_path, 300.0))
    serving = data["serving"]
    serving["replica_groups"] = [{"name": "g", "count": serving.pop("replicas"), "device": "h100-sxm",
                                  "engine": serving.pop("engine"), "latency_model": serving.pop("latency_model")}]
    summary = Simulation(scenario_from_dict(data)).run().summary()
    busy, duration = summary["engine"]["busy_s"], summary["duration_s"]
    expected = [300.0 * b + 100.0 * (duration - b) for b in busy]
    assert summary["devices"]["energy_j_per_replica"] == pytest.approx(expected, rel=1e-6)


# --------------------------------------------------------------------------- draft and fused rows


def with_speculative_rows(tmp_path: Path) -> Path:
    """The example plus ``draft_decode`` rows (a draft model's steps: 2 ms + 0.25 ms per sequence
    at any context) and ``fused_decode`` rows at fanout 4 (12 ms + 1 ms per sequence)."""
    frame = frame_of(EXAMPLE)
    base = frame.iloc[0].to_dict()
    rows = []
    for phase, fanout, fixed, per in (("draft_decode", 1, 2.0, 0.25), ("fused_decode", 4, 12.0, 1.0)):
        for ctx in (128, 2048):
            for mb in (1, 8):
                rows.append({**base, "phase": phase, "context_len": str(ctx), "microbatch": str(mb), "fanout_k": str(fanout),
                             "latency_ms": repr(fixed + per * mb), "latency_p95_ms": "", "notes": ""})
    return write(pd.concat([frame, pd.DataFrame(rows)], ignore_index=True), tmp_path, "spec.csv")


def test_decode_phase_draft_decode_reads_the_draft_rows(tmp_path: Path) -> None:
    """With ``decode_phase: draft_decode`` the decode term is the draft model's row: a step of 4
    sequences takes 2 + 0.25 x 4 = 3 ms at any context; the prefill term is unchanged."""
    path = with_speculative_rows(tmp_path)
    drafter = example(path, decode_phase="draft_decode")
    assert drafter.step_time_s(0, 4, decode_context_tokens=4 * 700) == pytest.approx(0.003, rel=1e-12)
    assert drafter.step_time_s(512, 0) == example(path).step_time_s(512, 0) == pytest.approx(0.040)
    with pytest.raises(FieldValueError, match="must be one of decode, draft_decode"):
        example(path, decode_phase="verify")


def test_a_file_without_draft_rows_names_the_phase(tmp_path: Path) -> None:
    """``decode_phase: draft_decode`` on a file without draft rows is refused, naming the phase."""
    with pytest.raises(FieldValueError, match="no draft_decode rows with fanout_k 1"):
        example(EXAMPLE, decode_phase="draft_decode")


def test_fused_rows_time_a_fused_step(tmp_path: Path) -> None:
    """``fused_time_s`` reads the ``fused_decode`` slice at the largest γ (its ``fanout_k``), the
    mean context and the sequences as microbatch; None without a slice for that γ."""
    m = example(with_speculative_rows(tmp_path))
    assert m.fused_time_s([300, 700], [4, 3]) == pytest.approx((12.0 + 2.0) / 1e3, rel=1e-12)
    assert m.fused_time_s([300], [5]) is None
    assert example(EXAMPLE).fused_time_s([300], [4]) is None


def test_a_previous_version_sharing_no_row_is_refused_not_called_steady(tmp_path: Path) -> None:
    """A previous file with none of the model's rows leaves nothing to compare: refused (and the
    command exits 2), never reported as "no drift"."""
    frame = frame_of(EXAMPLE)
    frame["model"] = "other-8b"
    other = write(frame, tmp_path, "other.csv")
    with pytest.raises(FieldValueError, match="shares no row") as info:
        example(EXAMPLE, previous=str(other))
    assert info.value.field == "previous"
    assert cli(["lut-drift", str(EXAMPLE), str(other)]) == 2
