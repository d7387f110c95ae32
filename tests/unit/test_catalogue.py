"""The catalogue of measured latency profiles, the model configurations and aliases it resolves
to, and the ``simpy-llm catalogue`` verb (serving/catalogue.py, serving/hardware.py)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm.cli import main
from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.serving.catalogue import catalogue, gpu_prices
from simpy_llm.serving.hardware import (
    _parse_aliases,
    canonical_model_name,
    gpu_names,
    gpu_spec,
    model_spec,
    resolve_hardware,
)
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


# --- GPU prices -----------------------------------------------------------------------------


def test_shipped_prices_cover_every_shipped_gpu() -> None:
    """The shipped price table gives a positive price for each GPU of profiles/gpus.yaml."""
    prices = gpu_prices()
    assert sorted(prices) == sorted(gpu_names())
    assert prices == {"H100": 3.9492, "A100-80": 2.4984, "L40S": 1.9512}


def test_a_user_file_overrides_the_prices_it_gives(tmp_path: Path) -> None:
    """A user's file replaces the prices it names (by any alias or case) and keeps the others."""
    path = tmp_path / "prices.yaml"
    path.write_text("h100-sxm: 2.25\n")
    assert gpu_prices(path) == {"H100": 2.25, "A100-80": 2.4984, "L40S": 1.9512}


@pytest.mark.parametrize(
    ("text", "key", "needle"),
    [
        ("B200: 3.0\n", "B200", "unknown GPU 'B200'; known GPUs: A100-80, H100, L40S"),
        ("L40S: 0\n", "L40S", "a number > 0, got 0"),
        ("L40S: cheap\n", "L40S", "a number > 0, got 'cheap'"),
        ("L40S: .inf\n", "L40S", "a number > 0, got inf"),
        ("H100: 2\nh100-sxm: 3\n", "h100-sxm", "names H100, already priced under another of its names"),
        ("- H100\n", "<top level>", "must be a mapping of GPU name to US dollars per GPU-hour"),
        ("H100: [\n", "<top level>", "is not valid YAML"),
    ],
)
def test_a_bad_price_file_is_refused_naming_file_key_and_what_is_allowed(
    tmp_path: Path, text: str, key: str, needle: str
) -> None:
    """A price file with an unknown GPU, a price that is not a number > 0, a GPU named twice,
    a list, or broken YAML is refused with the file, the key and what is allowed."""
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        gpu_prices(path)
    message = str(info.value)
    assert str(path) in message and f"  {key}: " in message and needle in message


def test_a_missing_price_file_is_refused_naming_it(tmp_path: Path) -> None:
    """A path that does not exist is refused as a ScenarioError naming the file."""
    with pytest.raises(ScenarioError, match="cannot be read"):
        gpu_prices(tmp_path / "none.yaml")


_KEYS = st.one_of(st.sampled_from(["H100", "h100", "H100-SXM", "A100-80", "a100-sxm", "L40S", "B200", ""]), st.text(max_size=8))
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.booleans(), st.none(), st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(st.dictionaries(_KEYS, _VALUES, max_size=5), _VALUES))
def test_the_price_loader_accepts_good_tables_and_refuses_bad_ones(tmp_path: Path, raw: object) -> None:
    """Over arbitrary YAML content the loader either returns every shipped GPU with a finite
    positive price (and the user's value where one was given) or raises ScenarioError naming
    the file; it never raises anything else."""
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(raw))
    try:
        prices = gpu_prices(path)
    except ScenarioError as exc:
        assert str(path) in str(exc)
        return
    assert sorted(prices) == sorted(gpu_names())
    assert all(isinstance(v, float) and 0 < v < math.inf for v in prices.values())
    if isinstance(raw, dict):
        for key, value in raw.items():
            assert prices[gpu_spec(key).name] == float(value)
