"""The catalogue of measured latency profiles, the model configurations and aliases it resolves
to, and the ``simpy-llm catalogue`` verb (serving/catalogue.py, serving/hardware.py)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simpy_llm.cli import main
from simpy_llm.config.errors import FieldValueError
from simpy_llm.serving.catalogue import catalogue
from simpy_llm.serving.hardware import _parse_aliases, canonical_model_name, model_spec, resolve_hardware
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.serving.profiles import profiles_dir

ROOT = Path(__file__).resolve().parents[2]


def _blis_rows() -> list[dict[str, str]]:
    with open(profiles_dir() / "blis" / "blackbox_coefficients.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_every_blis_row_is_a_latency_profile_by_name() -> None:
    """Each (model, GPU, TP) row of BLIS's coefficients builds ``blis_linear`` with exactly its betas."""
    for row in _blis_rows():
        m = BlisLinearLatency.from_params({"model": row["model"], "gpu": row["gpu"], "tp": int(row["tp"])})
        got = (m.beta0_us, m.beta1_us, m.beta2_us)
        want = (float(row["beta0_us"]), float(row["beta1_us_per_prefill_tok"]), float(row["beta2_us_per_decode_tok"]))
        assert got == want, row["model"]


def test_a_gpu_alias_or_case_finds_the_blis_row() -> None:
    """``h100`` and ``H100-SXM`` (names gpus.yaml gives the H100) find the H100 row, as in ``roofline``."""
    want = BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2})
    for gpu in ("h100", "H100-SXM"):
        got = BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": gpu, "tp": 2})
        assert (got.beta0_us, got.beta1_us, got.beta2_us) == (want.beta0_us, want.beta1_us, want.beta2_us)


def test_an_unknown_gpu_is_still_refused_naming_gpu() -> None:
    """A GPU that no row has is refused at ``gpu``, listing the rows the model has."""
    with pytest.raises(FieldValueError) as info:
        BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": "B200", "tp": 1})
    assert info.value.field == "gpu" and "H100 tp2" in info.value.message


def test_the_catalogue_has_one_entry_per_row_with_its_vllm_version() -> None:
    """``catalogue()`` lists every BLIS row in the file's order with its model, GPU, TP and vLLM version."""
    rows = _blis_rows()
    entries = catalogue()
    assert [(e.model, e.gpu, e.tp, e.vllm) for e in entries] == [
        (r["model"], r["gpu"], int(r["tp"]), r["vllm"]) for r in rows
    ]


def test_catalogue_hardware_flag_agrees_with_resolved_hardware() -> None:
    """An entry's ``hardware`` is True exactly when its model, GPU and TP resolve to a Hardware
    (every shipped row that resolves also fits at the defaults), and ``model_config`` names the
    configuration the model resolves to."""
    for e in catalogue():
        assert e.hardware == (resolve_hardware(e.model, e.gpu, e.tp) is not None), e
        assert e.model_config == canonical_model_name(e.model)


def test_catalogue_lacks_configs_only_for_models_it_cannot_describe() -> None:
    """The models with no configuration are the ones docs/latency.md lists as missing."""
    missing = sorted({e.model for e in catalogue() if e.model_config is None})
    assert missing == [
        "meta-llama/llama-4-maverick-17b-128e-instruct-fp8",
        "openai/gpt-oss-120b",
        "openai/gpt-oss-20b",
        "redhatai/llama-4-scout-17b-16e-instruct-quantized.w4a16",
        "redhatai/smollm3-3b-fp8-dynamic",
    ]


def test_phi4_parameter_count_is_hand_computed() -> None:
    """Phi-4 has 14,659,507,200 parameters, counted by hand from its config (the model card says 14B)."""
    # per layer: q, o 2*5120*5120 = 52,428,800; k, v 2*5120*1280 = 13,107,200; MLP 3*5120*17920 =
    # 275,251,200; norms 10,240 -> 340,797,440; x40 = 13,631,897,600; embedding + LM head
    # 2*100352*5120 = 1,027,604,480; final norm 5,120
    assert model_spec("microsoft/phi-4").param_count == 13_631_897_600 + 1_027_604_480 + 5_120


def test_granite_ties_its_embeddings() -> None:
    """Granite 3.1 8B counts its tied embedding once: 8,170,848,256 parameters (the card's 8.17B)."""
    # per layer: attention 41,943,040; MLP 3*4096*12800 = 157,286,400; norms 8,192; x40 =
    # 7,969,505,280; embedding 49155*4096 = 201,338,880; final norm 4,096
    assert model_spec("ibm-granite/granite-3.1-8b-instruct").param_count == 7_969_505_280 + 201_338_880 + 4_096


def test_a_quantised_alias_keeps_the_shape_and_stores_its_weights_at_its_dtype() -> None:
    """An int4 release has its base model's shape and KV bytes; its projection and MLP weights
    take half a byte each, the embedding and LM head stay bf16."""
    base, w4 = model_spec("qwen2.5-7b-instruct"), model_spec("redhatai/qwen2.5-7b-instruct-quantized.w4a16")
    assert (w4.num_layers, w4.hidden_size, w4.num_kv_heads, w4.dtype_bytes) == (
        base.num_layers, base.hidden_size, base.num_kv_heads, base.dtype_bytes
    )
    linear = base.num_layers * (base.attention_params_per_layer + base.ffn_params_per_layer)
    assert base.weight_bytes_per_gpu(1) - w4.weight_bytes_per_gpu(1) == linear * (2 - 0.5)


def test_an_fp8_alias_halves_the_linear_weights() -> None:
    """Phi-4 fp8: every attention projection and MLP weight takes one byte, so the weights per GPU
    shrink by exactly those parameters' count in bytes."""
    base, fp8 = model_spec("phi-4"), model_spec("redhatai/phi-4-fp8-dynamic")
    linear = base.num_layers * (base.attention_params_per_layer + base.ffn_params_per_layer)
    assert base.weight_bytes_per_gpu(2) - fp8.weight_bytes_per_gpu(2) == linear / 2


def test_the_bf16_scout_alias_undoes_the_fp8_experts() -> None:
    """Llama 4 Scout's bf16 release maps onto the fp8 config with two-byte experts."""
    m = model_spec("meta-llama/llama-4-scout-17b-16e-instruct")
    assert (m.ffn_weight_bytes, m.attention_weight_bytes, m.num_experts) == (2.0, 2.0, 16)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"a": {"model": "phi-4", "weights": "int3"}}, "a.weights: must be one of bf16, fp16, fp8, int8, int4"),
        ({"a": {"weights": "fp8"}}, "a: must be a model name or a mapping with 'model'"),
        ({"a": {"model": "phi-4", "bits": 4}}, "a: must be a model name or a mapping with 'model'"),
        (["a"], "must be a mapping of release name to model"),
    ],
)
def test_a_bad_alias_entry_is_refused_naming_file_and_key(raw: object, needle: str) -> None:
    """An aliases file entry with an unknown weight dtype, no model or an unknown key is refused,
    naming the file, the key and what is allowed."""
    with pytest.raises(ValueError, match=r"aliases\.yaml") as info:
        _parse_aliases(raw, "aliases.yaml")
    assert needle in str(info.value)


def test_catalogue_verb_prints_every_row_as_csv() -> None:
    """``simpy-llm catalogue --csv`` prints a header and one line per profile, exit status 0."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["catalogue", "--csv"])
    lines = list(csv.reader(out.getvalue().splitlines()))
    assert code == 0
    assert lines[0] == ["model", "gpu", "tp", "vllm", "model_config", "hardware"]
    assert len(lines) == 1 + len(catalogue())
    assert lines[1] == ["ibm-granite/granite-3.1-8b-instruct", "A100-80", "1", "v0.8.4", "granite-3.1-8b-instruct", "True"]


def test_the_command_line_does_not_load_the_catalogue_until_asked() -> None:
    """Importing the command line (and parsing a run) leaves the catalogue module unloaded."""
    code = "import json, sys; import simpy_llm.cli as c; c._parser(); print(json.dumps('simpy_llm.serving.catalogue' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) is False
