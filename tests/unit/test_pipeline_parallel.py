"""Pipeline parallelism in the roofline and the hardware (serving/roofline.py, serving/hardware.py):
hand-computed pipelined steps, the bubble, per-GPU memory, GPUs per replica, refusals, and the
tensor-parallel all-reduce against its closed form and BLIS's TP variants."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from simpy_llm import load_scenario
from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.schema import Scenario
from simpy_llm.serving.fleet import plan_fleet
from simpy_llm.serving.hardware import (
    DEFAULT_ACTIVATION_HEADROOM_BYTES,
    GpuSpec,
    Hardware,
    ModelSpec,
    auto_kv_blocks,
    gpu_spec,
    model_spec,
    stage_layers,
)
from simpy_llm.serving.profiles import profiles_dir
from simpy_llm.serving.roofline import Roofline, RooflineLatency, pipeline_bubble_fraction

LLAMA_8B = "llama-3.1-8b-instruct"

# The two-layer version of test_roofline.py's tiny model: 2 query heads and 1 KV head of width 4,
# hidden 8, MLP 16, vocabulary 32, 2-byte values; 576 parameters per token per layer.
TINY2 = ModelSpec(
    name="tiny2", num_layers=2, hidden_size=8, num_attention_heads=2, num_kv_heads=1, head_dim=4,
    intermediate_size=16, vocab_size=32, dtype_bytes=2,
)
# 1000 FLOP/s, 100 B/s memory, 20 B/s per direction between GPUs.
SLOW = GpuSpec(
    name="slow", peak_flops=1000.0, hbm_bandwidth_bytes_per_s=100.0, memory_bytes=1e6,
    pcie_bandwidth_bytes_per_s=10.0, interconnect_bandwidth_bytes_per_s=20.0,
)


def _tiny(tp: int, pp: int, microbatches: int | None = None, allreduce_latency_us: float = 0.0) -> Roofline:
    return Roofline(
        hardware=Hardware(model=TINY2, gpu=SLOW, tp=tp, pp=pp), mfu=0.5, mfu_decode=0.25, mbu=0.8,
        allreduce_latency_us=allreduce_latency_us, microbatches=microbatches,
    )


def _roofline_scenario(params: str, *overrides: str) -> Scenario:
    return load_scenario(
        "scenarios/quickstart.yaml",
        [f"serving.latency_model={{kind: roofline, params: {{model: {LLAMA_8B}, gpu: H100, {params}}}}}",
         "serving.engine.kv_num_blocks=auto", *overrides],
    )


def test_one_stage_step_is_the_unpipelined_sum() -> None:
    """With one stage a step is exactly L x layer + all-reduce + LM head, the formula before stages existed."""
    r = RooflineLatency(model=LLAMA_8B, gpu="H100", tp=2).roofline
    for p, d, c, a in [(0, 1, 512, 0), (0, 64, 64 * 1024, 0), (2048, 0, 0, 2048 * 2049 // 2), (256, 32, 9000, 40000)]:
        expected = 32 * r.layer_time_s(p, d, c, a) + r.all_reduce_time_s(p + d) + r.lm_head_time_s(p, d)
        assert r.step_time_s(p, d, c, a) == expected
        assert RooflineLatency(model=LLAMA_8B, gpu="H100", tp=2).step_time_s(p, d, c, a) == expected


def test_one_stage_memory_is_the_tensor_parallel_figure() -> None:
    """With one stage the weights, KV bytes and auto KV blocks per GPU are the tp-only figures (26,389 and 60,437 blocks)."""
    m, h100 = model_spec(LLAMA_8B), gpu_spec("H100")
    for tp, blocks in [(1, 26389), (2, 60437)]:
        hw = Hardware(model=m, gpu=h100, tp=tp)
        assert hw.weight_bytes_per_gpu == m.weight_bytes_per_gpu(tp)
        assert hw.gpus == tp
        assert auto_kv_blocks(hw, block_size=16) == blocks


def test_pp2_decode_step_is_hand_computed() -> None:
    """A decode step of 4 requests on two one-layer stages, two micro-batches, takes 120 s, derived by hand."""
    r = _tiny(tp=1, pp=2)
    # micro-batch: 2 decode tokens, 100 context tokens (half the step's).
    # layer: compute (2*576*2 + 4*2*4*100) / (1000*0.25) = 22.016; memory (1184 B weights + 16 B KV
    #        * (100 + 2)) / (100*0.8) = 35.2 -> 35.2 (memory-bound); one layer per stage, no all-reduce
    # stage 0 = 35.2; stage 1 = 35.2 + LM head max(2*32*8*2 rows / 250 = 4.096, 32*8*2 / 80 = 6.4) = 41.6
    # send: 8 hidden * 2 B * 2 tokens / 20 B/s = 1.6
    # step = (35.2 + 41.6) + (2 - 1) * 1.6 + (2 - 1) * max(35.2, 41.6, 1.6) = 120.0
    assert r.step_time_s(0, 4, decode_context_tokens=200) == pytest.approx(120.0, rel=1e-12)
    assert r.stage_times_s(0, 4, decode_context_tokens=200) == pytest.approx((35.2, 41.6), rel=1e-12)


def test_pp2_tp2_prefill_step_is_hand_computed() -> None:
    """A 40-token prefill on two stages of two GPUs, two micro-batches, takes 237.56 s, derived by hand."""
    r = _tiny(tp=2, pp=2, microbatches=2, allreduce_latency_us=5e5)
    # micro-batch: 20 prefill tokens, 410 attention pairs. Per GPU 320 parameters per token
    # (q o 64, k v 64, MLP shard 192), 1 query head.
    # layer: compute (2*320*20 + 4*1*4*410) / 500 = 38.72; memory (672 + 16*20) / 80 = 12.4 -> 38.72
    # all-reduce of the layer: 2 calls * 2*(2-1)/2 * 20 tokens * 8 * 2 B / 20 B/s = 32, + 2 * 0.5 s = 33
    # stage 0 = 71.72; stage 1 = 71.72 + LM head (vocab shard 16, 1/2 row) max(0.512, 16*8*2/80 = 3.2) = 74.92
    # send: 8 * 2 B * 20 tokens / 20 B/s = 16
    # step = (71.72 + 74.92) + 16 + (2 - 1) * 74.92 = 237.56
    step = r.step_time_s(40, 0, prefill_attention_pairs=820)
    assert step == pytest.approx(237.56, rel=1e-12)


def test_more_microbatches_than_tokens_cut_one_token_each() -> None:
    """A step of fewer tokens than micro-batches is cut into one-token micro-batches: 3 decodes, 8 asked, 3 made."""
    r = _tiny(tp=1, pp=2, microbatches=8)
    assert r.microbatch_count(3) == 3
    stages = r.stage_times_s(0, 3, decode_context_tokens=30)
    one = _tiny(tp=1, pp=2, microbatches=3)
    assert stages == one.stage_times_s(0, 3, decode_context_tokens=30)
    send = r.stage_send_time_s(3)
    assert send == pytest.approx(8 * 2 * 1 / 20, rel=1e-12)
    assert r.step_time_s(0, 3, decode_context_tokens=30) == pytest.approx(sum(stages) + send + 2 * max(stages), rel=1e-12)


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (2, 8), (4, 4), (4, 1), (8, 16)])
def test_each_stage_idles_the_bubble_fraction(pp: int, m: int) -> None:
    """With equal stages the first stage idles (pp - 1) / (m + pp - 1) of the step, once the
    sends and the last stage's LM head are taken out."""
    r = RooflineLatency(model=LLAMA_8B, gpu="H100", tp=1, pp=pp, microbatches=m).roofline
    d, c = 256, 256 * 512
    stages = r.stage_times_s(0, d, decode_context_tokens=c)
    assert len(set(stages[:-1])) == 1  # 32 layers split evenly; only the last stage adds the LM head
    lm = stages[-1] - stages[0]
    send = r.stage_send_time_s(d)
    step = r.step_time_s(0, d, decode_context_tokens=c)
    pipeline = step - m * lm - (pp - 1) * send  # = (m + pp - 1) x stage time
    assert 1 - m * stages[0] / pipeline == pytest.approx(pipeline_bubble_fraction(pp, m), rel=1e-9)
    assert pipeline_bubble_fraction(pp, m) == (pp - 1) / (m + pp - 1)


def test_pp2_halves_weights_and_kv_per_gpu() -> None:
    """Two stages hold half the layers each: KV per GPU halves exactly, and weights halve plus half the
    final norm (the last stage has the LM head and the norm, the first the embedding of the same size)."""
    m, h100 = model_spec(LLAMA_8B), gpu_spec("H100")
    one, two = Hardware(model=m, gpu=h100, tp=1), Hardware(model=m, gpu=h100, tp=1, pp=2)
    norm = m.hidden_size * m.dtype_bytes
    assert two.stage_weight_bytes_per_gpu == pytest.approx(
        ((one.weight_bytes_per_gpu - norm) / 2, (one.weight_bytes_per_gpu + norm) / 2), rel=1e-15
    )
    assert two.weight_bytes_per_gpu == max(two.stage_weight_bytes_per_gpu)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token == 131072
    assert two.replica_kv_bytes_per_token == one.replica_kv_bytes_per_token == 131072


def test_auto_kv_blocks_take_the_fullest_stage() -> None:
    """kv_num_blocks: auto is the fewest blocks any stage's GPU fits: 3 stages of 11, 11, 10 layers."""
    m, h100 = model_spec(LLAMA_8B), gpu_spec("H100")
    hw = Hardware(model=m, gpu=h100, tp=1, pp=3)
    assert hw.stage_layers == (11, 11, 10) == stage_layers(32, 3)
    assert hw.stage_kv_bytes_per_token == (11 * 4096, 11 * 4096, 10 * 4096)
    free = [h100.memory_bytes * 0.9 - w - DEFAULT_ACTIVATION_HEADROOM_BYTES for w in hw.stage_weight_bytes_per_gpu]
    by_hand = min(int(f // (16 * kv)) for f, kv in zip(free, hw.stage_kv_bytes_per_token, strict=True))
    assert auto_kv_blocks(hw, block_size=16) == by_hand


def test_uneven_split_gives_leftover_layers_to_the_stages_before_the_last() -> None:
    """L // pp layers per stage; the L % pp left over go one each to the stages before the last."""
    assert stage_layers(32, 5) == (6, 6, 7, 7, 6)
    assert stage_layers(80, 3) == (27, 27, 26)
    assert stage_layers(7, 7) == (1,) * 7
    assert sum(stage_layers(61, 8)) == 61


def test_replica_gpus_are_tp_times_pp() -> None:
    """A replica of a roofline at tp 2 and pp 2 occupies 4 GPUs in its fleet plan."""
    plans = plan_fleet(_roofline_scenario("tp: 2, pp: 2").serving)
    assert {p.gpus for p in plans} == {4}
    assert {p.gpus for p in plan_fleet(_roofline_scenario("tp: 2").serving)} == {2}


@pytest.mark.parametrize(
    ("params", "key", "words"),
    [
        ("pp: 33", "serving.latency_model.params.pp", "32 layers, fewer than pp=33"),
        ("pp: 0", "serving.latency_model.params.pp", "positive integer"),
        ("microbatches: 4", "serving.latency_model.params.microbatches", "needs pp > 1"),
        ("pp: 2, microbatches: 0", "serving.latency_model.params.microbatches", "positive integer"),
    ],
)
def test_bad_pipeline_values_are_refused_at_their_key(params: str, key: str, words: str) -> None:
    """More stages than layers, a stage count or micro-batch count below 1, and micro-batches without
    stages are refused, naming the parameter's key path."""
    with pytest.raises(ScenarioError) as info:
        _roofline_scenario(params)
    assert any(path == key and words in why for path, why in info.value.problems)


def test_hardware_refuses_more_stages_than_layers() -> None:
    """Hardware with more pipeline stages than the model's layers raises naming pp."""
    with pytest.raises(FieldValueError) as info:
        Hardware(model=TINY2, gpu=SLOW, pp=3)
    assert info.value.field == "pp"


@pytest.mark.parametrize(("gpu", "link"), [("H100", 450e9), ("L40S", 32e9)])
def test_tensor_parallel_all_reduce_is_the_ring_closed_form(gpu: str, link: float) -> None:
    """The all-reduces of a tp-4 step are 2 per layer of T x hidden x 2 B, each 2 (tp - 1) / tp x bytes
    over the GPU-to-GPU link (NVLink on the H100, PCIe on the L40S): 1000 tokens of Llama-3.1-8B."""
    r = RooflineLatency(model=LLAMA_8B, gpu=gpu, tp=4, allreduce_latency_us=10.0).roofline
    by_hand = 2 * 32 * (2 * 3 / 4 * 1000 * 4096 * 2 / link + 10e-6)
    assert r.all_reduce_time_s(1000) == pytest.approx(by_hand, rel=1e-12)
    assert RooflineLatency(model=LLAMA_8B, gpu=gpu, tp=1).roofline.all_reduce_time_s(1000) == 0.0


def _blis_beta1(model: str, tp: int) -> float:
    with (profiles_dir() / "blis" / "blackbox_coefficients.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["model"] == model and r["gpu"] == "H100" and r["tp"] == str(tp)]
    (row,) = rows
    assert row["vllm"] == "v0.8.4"  # one vLLM version on both sides of the ratio
    return float(row["beta1_us_per_prefill_tok"])


@pytest.mark.parametrize(
    "model",
    [
        "meta-llama/llama-3.1-8b-instruct",
        "ibm-granite/granite-3.1-8b-instruct",
        "qwen/qwen2.5-7b-instruct",
        "redhatai/llama-3.1-nemotron-70b-instruct-hf-fp8-dynamic",
    ],
)
def test_tp4_over_tp2_prefill_cost_is_near_blis(model: str) -> None:
    """Going from tp 2 to tp 4 on H100, the roofline's prefill cost falls to 0.75-1.05 of the ratio BLIS
    measured (beta1 at tp 4 / at tp 2), on the rows whose own ratio a GPU can give (docs/latency.md)."""
    blis = _blis_beta1(model, 4) / _blis_beta1(model, 2)
    assert 0.5 <= blis < 1  # the rule that chose these rows: more GPUs, at most twice as fast
    c = 2048
    step = {tp: RooflineLatency(model=model, gpu="H100", tp=tp).step_time_s(c, 0, 0, c * (c + 1) // 2) for tp in (2, 4)}
    assert 0.75 <= step[4] / step[2] / blis <= 1.05


def test_disaggregated_hand_off_needs_its_size_with_stages() -> None:
    """A disaggregated fleet whose prefill pool runs pipeline stages must give kv_transfer.bytes_per_token."""
    roofline = f"serving.latency_model={{kind: roofline, params: {{model: {LLAMA_8B}, gpu: H100, tp: 1, pp: 2}}}}"
    with pytest.raises(ScenarioError) as info:
        load_scenario("scenarios/disaggregated.yaml", [roofline])
    assert [p for p, _ in info.value.problems] == ["serving.disaggregation.kv_transfer.bytes_per_token"]
    given = load_scenario("scenarios/disaggregated.yaml", [roofline, "serving.disaggregation.kv_transfer.bytes_per_token=131072"])
    assert {p.gpus for p in plan_fleet(given.serving)} == {2}


def test_planner_parallelism_refuses_pipelined_replicas() -> None:
    """Parallelism candidates, which set a one-stage replica's tp, are refused for a fleet with pp > 1."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(
            "scenarios/planner_pool_split.yaml",
            [f"serving.latency_model={{kind: roofline, params: {{model: {LLAMA_8B}, gpu: H100, tp: 1, pp: 2}}}}",
             "planner.candidates={parallelism: [{tp: 1}, {tp: 2}]}"],
        )
    assert [(p, "pp 2 pipeline stages" in why) for p, why in info.value.problems] == [("planner.candidates.parallelism", True)]



def test_device_max_pp_bounds_the_stages(tmp_path: Path) -> None:
    """A replica on a device whose max_pp is below its latency model's pp is refused at device."""
    text = (profiles_dir() / "devices" / "h100-sxm.yaml").read_text()
    device = tmp_path / "h100-two-stages.yaml"
    device.write_text(text.replace("id: h100-sxm", "id: h100-two-stages").replace("  max_tp: 8\n", "  max_tp: 8\n  max_pp: 2\n"))
    def fleet(pp: int) -> Scenario:
        roofline = f"{{kind: roofline, params: {{model: {LLAMA_8B}, gpu: H100, tp: 2, pp: {pp}}}}}"
        return load_scenario(
            "scenarios/heterogeneous_fleet.yaml",
            [f"serving.replica_groups.0.device={device}", f"serving.replica_groups.0.latency_model={roofline}"],
        )

    assert [p.gpus for p in plan_fleet(fleet(2).serving)] == [4] * 4 + [1] * 4
    with pytest.raises(ScenarioError) as info:
        fleet(4)
    assert [(p, "pp 4 exceeds" in why) for p, why in info.value.problems] == [("serving.replica_groups[0].device", True)]
