"""Model shapes, GPU facts, KV bytes per token and KV-block sizing (serving/hardware.py)."""

from __future__ import annotations

import pytest

from simpy_llm.config.errors import FieldValueError
from simpy_llm.serving.hardware import (
    GIB,
    Hardware,
    auto_kv_blocks,
    gpu_spec,
    kv_bytes_per_token,
    model_names,
    model_spec,
    spec_from_hf_config,
)
from simpy_llm.serving.latency import BlisLinearLatency

LLAMA_8B = "llama-3.1-8b-instruct"


def test_llama_8b_spec_reads_its_config() -> None:
    """The Llama-3.1-8B spec carries the shape its config.json states."""
    m = model_spec(LLAMA_8B)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (32, 4096, 32, 8, 128)
    assert (m.intermediate_size, m.vocab_size, m.dtype_bytes, m.is_moe) == (14336, 128256, 2, False)


def test_llama_8b_parameter_count_is_hand_computed() -> None:
    """Llama-3.1-8B has 8,030,261,248 parameters, counted by hand from its shape."""
    # per layer: q 4096*4096 + o 4096*4096 = 33,554,432; k, v 2*4096*1024 = 8,388,608;
    # MLP 3*4096*14336 = 176,160,768; two norms 8,192 -> 218,112,000; x32 = 6,979,584,000
    # embedding + LM head 2*128256*4096 = 1,050,673,152; final norm 4,096
    assert model_spec(LLAMA_8B).param_count == 6_979_584_000 + 1_050_673_152 + 4_096


def test_mixtral_counts_all_experts_and_active_ones() -> None:
    """Mixtral 8x7B stores 46.70e9 parameters and uses 12.88e9 per token (2 of 8 experts)."""
    m = model_spec("mixtral-8x7b-v0.1")
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (8, 2, 14336)
    # per layer: attention 41,943,040; experts 8*3*4096*14336 = 1,409,286,144; router 32,768;
    # norms 8,192 -> 1,451,270,144; x32 = 46,440,644,608; + 2*32000*4096 + 4096
    assert m.param_count == 46_440_644_608 + 262_144_000 + 4_096
    # six unused experts of 176,160,768 parameters in each of 32 layers
    assert m.active_param_count == m.param_count - 32 * 6 * 176_160_768


def test_llama4_scout_fp8_has_one_byte_expert_weights() -> None:
    """The fp8 Llama 4 Scout keeps bf16 attention and one-byte (fp8) expert weights, with a shared expert."""
    m = model_spec("redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic")
    assert (m.dtype_bytes, m.ffn_weight_bytes) == (2, 1.0)
    assert (m.num_experts, m.experts_per_token, m.num_shared_experts) == (16, 1, 1)


def test_every_shipped_config_loads() -> None:
    """Every config.json under profiles/models gives a spec whose KV and weights are positive."""
    assert len(model_names()) >= 10
    for name in model_names():
        m = model_spec(name)
        assert m.param_count > 1e9 and kv_bytes_per_token(m, 1) > 0, name


def test_latent_attention_config_is_refused() -> None:
    """A config with multi-head latent attention (kv_lora_rank) is refused, naming the model field."""
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
              "vocab_size": 100, "kv_lora_rank": 16}
    with pytest.raises(FieldValueError) as info:
        spec_from_hf_config("mla", config)
    assert info.value.field == "model" and "kv_lora_rank" in info.value.message


def test_org_prefix_and_alias_find_the_shared_config() -> None:
    """A BLIS name with its organisation prefix, or an alias, finds the config of the same shape."""
    assert model_spec("meta-llama/Llama-3.1-8B-Instruct") == model_spec(LLAMA_8B)
    alias = model_spec("meta-llama/llama-3.3-70b-instruct")
    assert alias.name == "llama-3.1-70b-instruct" and alias.num_layers == 80


def test_unknown_model_lists_known_names() -> None:
    """An unknown model raises FieldValueError on field model, listing the shipped names."""
    with pytest.raises(FieldValueError) as info:
        model_spec("gpt-5")
    assert info.value.field == "model"
    assert "gpt-5" in info.value.message and LLAMA_8B in info.value.message


def test_unknown_gpu_lists_known_names() -> None:
    """An unknown GPU raises FieldValueError on field gpu, listing the shipped GPUs."""
    with pytest.raises(FieldValueError) as info:
        gpu_spec("B200")
    assert info.value.field == "gpu" and "A100-80, H100, L40S" in info.value.message


def test_gpu_facts_and_links() -> None:
    """GPU specs carry BLIS's peaks and the datasheet links per direction; L40S all-reduces over PCIe."""
    h100 = gpu_spec("h100")
    assert (h100.peak_flops, h100.hbm_bandwidth_bytes_per_s, h100.memory_bytes) == (989.5e12, 3.35e12, 80 * GIB)
    assert (h100.pcie_bandwidth_bytes_per_s, h100.interconnect_bandwidth_bytes_per_s, h100.nvlink) == (64e9, 450e9, True)
    assert (h100.mfu_prefill, h100.mfu_decode) == (0.45, 0.30)
    assert gpu_spec("A100-SXM") == gpu_spec("A100-80")
    l40s = gpu_spec("L40S")
    assert (l40s.nvlink, l40s.interconnect_bandwidth_bytes_per_s) == (False, l40s.pcie_bandwidth_bytes_per_s)


def test_kv_bytes_per_token_per_gpu() -> None:
    """Llama-3.1-8B stores 2*32*8*128*2 = 131072 KV bytes per token; TP shards heads, then replicates one."""
    m = model_spec(LLAMA_8B)
    assert kv_bytes_per_token(m, 1) == 131_072
    assert kv_bytes_per_token(m, 2) == 65_536
    assert kv_bytes_per_token(m, 8) == 16_384
    assert kv_bytes_per_token(m, 16) == 16_384  # 8 KV heads on 16 GPUs: one replicated head each


def test_tp_that_does_not_shard_the_heads_is_refused() -> None:
    """A TP degree that does not divide the attention heads is a FieldValueError on field tp."""
    with pytest.raises(FieldValueError) as info:
        Hardware(model=model_spec(LLAMA_8B), gpu=gpu_spec("H100"), tp=3)
    assert info.value.field == "tp"


def test_auto_kv_blocks_llama_8b_h100_tp1() -> None:
    """Llama-3.1-8B on one H100 holds 26,389 blocks of 16 tokens (hand-computed)."""
    # 0.9 * 80 GiB = 77,309,411,328; weights 8,030,261,248 * 2 = 16,060,522,496; headroom 5.5 GiB
    # = 5,905,580,032; free 55,343,308,800 / (16 * 131,072 = 2,097,152) = 26,389.9
    hw = Hardware(model=model_spec(LLAMA_8B), gpu=gpu_spec("H100"), tp=1)
    assert hw.weight_bytes_per_gpu == 16_060_522_496
    assert auto_kv_blocks(hw, block_size=16) == 26_389


def test_auto_kv_blocks_llama_8b_h100_tp2() -> None:
    """Llama-3.1-8B on two H100s holds 60,437 blocks of 16 tokens per GPU (hand-computed)."""
    # weights per GPU: norms (32*2*4096 + 4096 = 266,240 params, 532,480 B) replicated, the rest
    # halved: (16,060,522,496 - 532,480) / 2 + 532,480 = 8,030,527,488
    # free 77,309,411,328 - 8,030,527,488 - 5,905,580,032 = 63,373,303,808; / (16 * 65,536) = 60,437.6
    hw = Hardware(model=model_spec(LLAMA_8B), gpu=gpu_spec("H100"), tp=2)
    assert hw.weight_bytes_per_gpu == 8_030_527_488
    assert auto_kv_blocks(hw, block_size=16) == 60_437


def test_auto_kv_blocks_follows_utilization_and_headroom() -> None:
    """Lower utilization and no headroom move the block count as the formula says."""
    hw = Hardware(model=model_spec(LLAMA_8B), gpu=gpu_spec("H100"), tp=1)
    # 0.5 * 80 GiB = 42,949,672,960 - 16,060,522,496 = 26,889,150,464; / 2,097,152 = 12,821.9
    assert auto_kv_blocks(hw, block_size=16, gpu_memory_utilization=0.5, activation_headroom_bytes=0) == 12_821


def test_auto_kv_blocks_refuses_a_model_that_does_not_fit() -> None:
    """Llama-3.1-70B (141 GB of weights) on one H100 is a FieldValueError saying it does not fit."""
    hw = Hardware(model=model_spec("llama-3.1-70b-instruct"), gpu=gpu_spec("H100"), tp=1)
    with pytest.raises(FieldValueError) as info:
        auto_kv_blocks(hw, block_size=16)
    assert info.value.field == "gpu_memory_utilization" and "does not fit" in info.value.message


def test_blis_linear_resolves_its_hardware() -> None:
    """A blis_linear profile with a shipped model config exposes its Hardware; others have None."""
    m = BlisLinearLatency.from_params({"model": "meta-llama/llama-3.1-8b-instruct", "gpu": "A100-80", "tp": 2})
    assert m.hardware == Hardware(model=model_spec(LLAMA_8B), gpu=gpu_spec("A100-80"), tp=2)
    assert (m.model, m.gpu, m.tp) == ("meta-llama/llama-3.1-8b-instruct", "A100-80", 2)
    assert BlisLinearLatency(beta0_us=1.0).hardware is None
    gpt_oss = BlisLinearLatency.from_params({"model": "openai/gpt-oss-20b", "gpu": "H100", "tp": 1})
    assert gpt_oss.hardware is None  # no config.json shipped for it
