"""The ``batch_table`` latency model and latency profiles named in a scenario."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.config import ScenarioError
from simpy_llm.config.profile import load_profile
from simpy_llm.loading import load_scenario
from simpy_llm.serving.batch_table import BatchTableLatency
from simpy_llm.serving.latency import BlisLinearLatency


def test_decode_steps_come_from_the_table_and_extrapolate_past_it():
    """D(n) is the n-th entry; past the end, the last two entries' slope (never falling)."""
    m = BatchTableLatency(decode_step_us=(10.0, 40.0, 35.0), prefill_token_us=1.0)
    assert [m.decode_us(n) for n in range(6)] == [0.0, 10.0, 40.0, 35.0, 35.0, 35.0]
    rising = BatchTableLatency(decode_step_us=(10.0, 40.0, 50.0), prefill_token_us=1.0)
    assert rising.decode_us(5) == 70.0
    flat = BatchTableLatency(decode_step_us=(10.0,), prefill_token_us=1.0)
    assert flat.decode_us(7) == 10.0


def test_every_term_of_the_step_time():
    """step = D(n) + prompt terms when P > 0 (+ the prompt-only term without decoders) + the
    attention terms, in microseconds."""
    m = BatchTableLatency(decode_step_us=(100.0, 150.0), prefill_step_us=20.0, prefill_only_step_us=7.0,
                          prefill_token_us=2.0, decode_context_us=0.5, prefill_pair_us=0.01)
    assert m.uses_context
    assert m.step_time_s(0, 2, decode_context_tokens=40) == pytest.approx((150 + 20) * 1e-6)
    assert m.step_time_s(10, 0, prefill_attention_pairs=300) == pytest.approx((20 + 7 + 20 + 3) * 1e-6)
    assert m.step_time_s(10, 1) == pytest.approx((100 + 20 + 20) * 1e-6)
    assert not BatchTableLatency(decode_step_us=(1.0,), prefill_token_us=1.0).uses_context


def test_blis_linear_is_a_special_case():
    """With D(n) = beta0 + beta2 n, prefill_token = beta1 and prefill_only_step = beta0 the
    table model gives BLIS's step times exactly."""
    blis = BlisLinearLatency(beta0_us=900.0, beta1_us=12.0, beta2_us=30.0)
    table = BatchTableLatency(decode_step_us=tuple(900.0 + 30.0 * n for n in range(1, 9)), prefill_token_us=12.0, prefill_only_step_us=900.0)
    for p in (0, 1, 77, 512):
        for d in range(0, 9):
            if p or d:
                assert table.step_time_s(p, d) == pytest.approx(blis.step_time_s(p, d), rel=1e-12)


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"decode_step_us": [], "prefill_token_us": 1.0}, "decode_step_us"),
        ({"decode_step_us": [10.0, 0.0], "prefill_token_us": 1.0}, "decode_step_us[1]"),
        ({"decode_step_us": [10.0]}, "prefill_token_us"),
        ({"decode_step_us": [10.0], "prefill_token_us": -1.0}, "prefill_token_us"),
    ],
)
def test_bad_tables_are_rejected_with_the_key(params, where):
    """An empty or non-positive table, no prompt cost, or a negative coefficient is a
    scenario error at ``serving.latency_model.params.<key>``."""
    with pytest.raises(ScenarioError) as info:
        load_scenario("scenarios/quickstart.yaml", {"serving.latency_model": {"kind": "batch_table", "params": params}})
    assert info.value.paths == [f"serving.latency_model.params.{where}"]


def _profile(tmp_path, data) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


def test_a_scenario_names_a_profile_in_place_of_a_latency_model(tmp_path):
    """``latency_model: {profile: FILE}`` uses the file's latency model; the loaded scenario
    shows the coefficients themselves."""
    path = _profile(
        tmp_path, {"profile_version": 1, "latency_model": {"kind": "batch_table", "params": {"decode_step_us": [5.0], "prefill_token_us": 2.0}}}
    )
    s = load_scenario("scenarios/quickstart.yaml", {"serving.latency_model": {"profile": path}})
    assert s.serving.latency_model.kind == "batch_table" and s.serving.latency_model.params["decode_step_us"] == [5.0]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read profile"),
        ("a: [", "not valid YAML"),
        ({"profile_version": 2, "latency_model": {"kind": "blis_linear"}}, "profile_version: must be 1"),
        ({"latency_model": "fast"}, "latency_model: required: {kind: NAME, params: {...}}"),
        ({"latency_model": {"kind": "batch_table", "params": {"decode_step_us": [1.0]}}}, "latency_model.params.prefill_token_us"),
    ],
)
def test_bad_profiles_are_errors_at_the_profile_key(tmp_path, content, message):
    """A missing, malformed or invalid profile is reported at ``serving.latency_model.profile``,
    naming the profile file and what is wrong inside it."""
    path = str(tmp_path / "missing.yaml") if content is None else _profile(tmp_path, content)
    with pytest.raises(ScenarioError) as info:
        load_scenario("scenarios/quickstart.yaml", {"serving.latency_model": {"profile": path}})
    assert info.value.paths == ["serving.latency_model.profile"]
    assert message in str(info.value)


def test_profile_beside_other_keys_is_rejected():
    """``profile`` replaces ``kind`` and ``params``; giving both is an error."""
    with pytest.raises(ScenarioError, match="unknown key beside profile"):
        load_scenario("scenarios/quickstart.yaml", {"serving.latency_model": {"profile": "x.yaml", "kind": "blis_linear"}})


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(
                        ["profile_version", "latency_model", "kind", "params", "decode_step_us", "prefill_token_us", "fit"]), children, max_size=4),
                    max_leaves=12))
def test_profile_loading_never_fails_otherwise(tmp_path_factory, data):
    """Any YAML content either loads as a profile or is a ScenarioError; nothing else escapes."""
    path = tmp_path_factory.mktemp("fuzz") / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        profile = load_profile(path)
    except ScenarioError:
        return
    assert isinstance(profile["latency_model"]["kind"], str)
