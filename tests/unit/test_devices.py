"""Device profiles: the shipped ones load with their sources, and the loader is strict.

Every rejection must name the file and the key path (``ScenarioError``); a fuzz of
mutated profiles checks that nothing but ``ScenarioError`` ever escapes the loader.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.serving.devices import (
    DeviceProfile,
    device_profile,
    device_profile_from_dict,
    device_profile_names,
    device_profile_to_dict,
    device_profiles,
    load_device_profile,
)
from simpy_llm.serving.hardware import GIB, gpu_spec
from simpy_llm.serving.latency import profiles_dir

SHIPPED = sorted((profiles_dir() / "devices").glob("*.yaml"))


def _valid() -> dict:
    """A valid profile using every key (a target with every optional section)."""
    return {
        "id": "test-gpu",
        "role": "target",
        "vendor": "NVIDIA",
        "description": "an H100 for tests",
        "gpu": "H100",
        "compute": {"sustained_tflops": 989.5, "memory_bandwidth_gb_per_s": 3350, "max_parallel_tokens": 8192},
        "memory": {"memory_gb": 80, "kv_cache_limit_mb": 40960},
        "thermal": {"throttle_after_s": 600, "throttle_factor": 0.9},
        "energy": {"active_w": 700, "idle_w": 100},
        "availability": [{"start_s": 10, "end_s": 20}, {"start_s": 20, "end_s": 25.5}],
        "cold_start": {"load_s": 30},
        "price_per_hour_usd": 3.95,
        "parallelism": {"max_tp": 8, "max_pp": 4, "interconnect_gb_per_s": 450},
        "sources": ["a datasheet"],
    }


def _problems(data: dict, source: str = "profiles/devices/h100.yaml") -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        device_profile_from_dict(data, source)
    assert str(info.value).startswith(f"{source}: ")
    return info.value


# --- shipped profiles ---------------------------------------------------------------------


def test_the_required_profiles_are_shipped():
    """The six profiles the project promises are all there, with their roles."""
    roles = {name: p.role for name, p in device_profiles().items()}
    assert roles == {
        "h100-sxm": "target", "a100-80gb-sxm": "target", "l40s": "target",
        "jetson-agx-orin": "draft", "laptop-rtx4060": "draft", "phone-snapdragon-8-gen-3": "draft",
    }
    assert device_profile_names() == tuple(sorted(roles))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_profile_loads_and_names_its_sources(path: Path):
    """Each file loads strictly, its id is its file name, and it names non-empty sources."""
    profile = load_device_profile(path)
    assert profile.id == path.stem
    assert profile.sources and all(s.strip() for s in profile.sources)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_profile_is_described_in_the_notice_and_the_docs(path: Path):
    """NOTICE.md and docs/devices.md both mention every shipped profile."""
    notice = (profiles_dir() / "devices" / "NOTICE.md").read_text()
    docs = (Path(__file__).resolve().parents[2] / "docs" / "devices.md").read_text()
    assert f"`{path.stem}`" in notice
    assert f"`{path.stem}`" in docs


def test_estimates_in_shipped_profiles_are_marked():
    """A draft device's power figures are estimates, and its sources say so."""
    for name in ("jetson-agx-orin", "laptop-rtx4060", "phone-snapdragon-8-gen-3"):
        text = " ".join(device_profile(name).sources)
        assert "ESTIMATE" in text


def test_prices_are_given_for_datacenter_gpus_only():
    """Targets carry an on-demand price; the edge, laptop and phone have none."""
    for name, profile in device_profiles().items():
        assert (profile.price_per_hour_usd is not None) == (profile.role == "target"), name


def test_shipped_gpus_agree_with_gpus_yaml():
    """A profile naming a GPU of profiles/gpus.yaml has that GPU's peak bf16 throughput,
    memory bandwidth, memory size and per-direction interconnect."""
    checked = 0
    for profile in device_profiles().values():
        if profile.gpu is None:
            continue
        gpu = gpu_spec(profile.gpu)
        assert profile.compute.sustained_tflops * 1e12 == pytest.approx(gpu.peak_flops, rel=1e-12)
        assert profile.compute.memory_bandwidth_gb_per_s * 1e9 == pytest.approx(gpu.hbm_bandwidth_bytes_per_s, rel=1e-12)
        assert profile.memory.memory_gb * GIB == pytest.approx(gpu.memory_bytes, rel=1e-12)
        assert profile.parallelism.interconnect_gb_per_s * 1e9 == pytest.approx(
            gpu.interconnect_bandwidth_bytes_per_s, rel=1e-12
        )
        checked += 1
    assert checked == 3


def test_device_profile_resolves_an_id_or_a_path(tmp_path):
    """device_profile takes a shipped id, or a file; an unknown name lists the shipped ids."""
    assert device_profile("l40s") is device_profiles()["l40s"]
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(_valid()))
    assert device_profile(path).id == "test-gpu"
    assert device_profile(str(path)).id == "test-gpu"
    with pytest.raises(FieldValueError, match="unknown device profile 'b300'; shipped: a100-80gb-sxm"):
        device_profile("b300")
    with pytest.raises(ScenarioError, match="cannot read device profile"):
        device_profile(tmp_path / "missing.yaml")


# --- strictness ---------------------------------------------------------------------------


def test_a_valid_profile_with_every_key_loads():
    """Every key of the schema is accepted, integers are taken as floats where a figure is a float."""
    p = device_profile_from_dict(_valid())
    assert p.energy.active_w == 700.0 and isinstance(p.energy.active_w, float)
    assert p.availability[1].end_s == 25.5 and p.parallelism.max_pp == 4 and p.cold_start.load_s == 30.0


def test_unknown_key_is_rejected_with_file_and_key_path():
    """A misspelt key, at the top or in a section, is named with the keys allowed there."""
    data = _valid()
    data["energy"]["active_watts"] = data["energy"].pop("active_w")
    data["colour"] = "green"
    err = _problems(data)
    assert ("energy.active_watts", "unknown key; allowed: active_w, idle_w") in err.problems
    assert "energy.active_w" in err.paths
    assert "colour" in err.paths
    assert "profiles/devices/h100.yaml" in str(err) and "energy.active_watts: unknown key; allowed: active_w, idle_w" in str(err)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("compute", "sustained_tflops"), "989", "must be a number"),
        (("compute", "sustained_tflops"), True, "must be a number"),
        (("compute", "max_parallel_tokens"), 8.0, "must be an integer"),
        (("memory", "memory_gb"), None, "must be a number"),
        (("parallelism", "max_tp"), "8", "must be an integer"),
        (("role",), 3, "must be one of target, draft, any"),
        (("sources",), "a datasheet", "must be a list of strings"),
        (("sources",), ["ok", 5], "must be a non-empty string"),
        (("energy",), [700, 100], "must be a mapping with keys: active_w, idle_w"),
        (("availability",), {"start_s": 1, "end_s": 2}, "must be a list of {start_s, end_s} windows"),
    ],
)
def test_wrong_type_is_rejected_with_the_key_path(path, value, message):
    """A value of the wrong type is named by its key path."""
    data = _valid()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    err = _problems(data)
    where = ".".join(path)
    hits = [m for p, m in err.problems if p == where or p.startswith(where + "[")]
    assert hits and message in hits[0], err.problems


@pytest.mark.parametrize(
    ("mutate", "where", "message"),
    [
        (lambda d: d["thermal"].update(throttle_factor=0.0), "thermal.throttle_factor", "must be > 0"),
        (lambda d: d["thermal"].update(throttle_factor=1.5), "thermal.throttle_factor", "must be <= 1"),
        (lambda d: d["compute"].update(sustained_tflops=-1), "compute.sustained_tflops", "must be > 0"),
        (lambda d: d["compute"].update(memory_bandwidth_gb_per_s=math.inf), "compute.memory_bandwidth_gb_per_s", "finite"),
        (lambda d: d["energy"].update(idle_w=800), "energy.idle_w", "must be <= active_w"),
        (lambda d: d["memory"].update(kv_cache_limit_mb=90_000), "memory.kv_cache_limit_mb", "memory_gb x 1024"),
        (lambda d: d["availability"][0].update(end_s=5), "availability[0].end_s", "must be > start_s"),
        (lambda d: d["availability"][1].update(start_s=15), "availability[1].start_s", "must be in time order"),
        (lambda d: d.update(price_per_hour_usd=-0.5), "price_per_hour_usd", "must be >= 0"),
        (lambda d: d["parallelism"].update(max_tp=0), "parallelism.max_tp", "must be in [1, 65536]"),
        (lambda d: d.update(id="my gpu"), "id", "letters, digits"),
        (lambda d: d.update(role="draft"), "parallelism", "only a target (or any) device"),
        (lambda d: d.update(vendor=""), "vendor", "non-empty string"),
    ],
)
def test_out_of_range_value_is_rejected_with_the_key_path(mutate, where, message):
    """Each value outside what the schema allows is reported at its key path."""
    data = _valid()
    mutate(data)
    err = _problems(data)
    assert where in err.paths, err.problems
    assert message in dict(err.problems)[where]


def test_missing_required_key_is_rejected():
    """A profile without energy, or an energy without idle_w, says the key is missing."""
    data = _valid()
    del data["energy"]
    assert ("energy", "required key is missing") in _problems(data).problems
    data = _valid()
    del data["energy"]["idle_w"]
    assert ("energy.idle_w", "required key is missing") in _problems(data).problems


def test_unknown_gpu_name_is_rejected_and_aliases_are_canonical():
    """gpu must name a GPU of profiles/gpus.yaml (the error lists them); an alias is
    stored as the GPU's name."""
    data = _valid()
    data["gpu"] = "B300"
    err = _problems(data)
    assert "gpu" in err.paths and "known GPUs: A100-80, H100, L40S" in dict(err.problems)["gpu"]
    data["gpu"] = "h100-sxm"
    assert device_profile_from_dict(data).gpu == "H100"


def test_every_problem_is_reported_at_once():
    """Problems in several sections come back together, each with its path."""
    data = _valid()
    data["compute"]["sustained_tflops"] = "fast"
    data["energy"]["idle_w"] = -1
    data["gpu"] = "nope"
    assert {"compute.sustained_tflops", "energy.idle_w", "gpu"} <= set(_problems(data).paths)


def test_file_errors_name_the_file(tmp_path):
    """Invalid YAML, a non-mapping, and a bad key in a file all name the file."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"(?s)bad\.yaml: 1 problem.*not valid YAML: line 2"):
        load_device_profile(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ScenarioError, match="must be a mapping"):
        load_device_profile(bad)
    data = _valid()
    data["energy"]["active_watts"] = 1
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError) as info:
        load_device_profile(bad)
    assert info.value.source == str(bad) and "energy.active_watts" in info.value.paths


# --- round trip ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", device_profile_names())
def test_shipped_profiles_round_trip_through_plain_data(name):
    """to_dict then from_dict (and through YAML text) gives an equal profile."""
    p = device_profile(name)
    d = device_profile_to_dict(p)
    assert device_profile_from_dict(d) == p
    assert device_profile_from_dict(yaml.safe_load(yaml.safe_dump(d))) == p


def test_full_profile_round_trips_and_leaves_defaults_out():
    """Every section survives the round trip; a profile without optional keys dumps none."""
    p = device_profile_from_dict(_valid())
    assert device_profile_from_dict(device_profile_to_dict(p)) == p
    minimal = attrs.evolve(p, thermal=None, availability=(), cold_start=None, price_per_hour_usd=None,
                           parallelism=None, gpu=None, sources=())
    assert set(device_profile_to_dict(minimal)) == {"id", "role", "vendor", "description", "compute", "memory", "energy"}
    assert device_profile_from_dict(device_profile_to_dict(minimal)) == minimal


def test_direct_construction_is_validated():
    """Building a DeviceProfile in Python runs the same checks (FieldValueError names the key)."""
    p = device_profile("h100-sxm")
    with pytest.raises(FieldValueError, match="role: must be one of"):
        attrs.evolve(p, role="verifier")
    with pytest.raises(FieldValueError, match="parallelism: only a target"):
        attrs.evolve(p, role="draft")
    assert isinstance(attrs.evolve(p, role="any"), DeviceProfile)


# --- fuzz ---------------------------------------------------------------------------------

_JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _paths(d, prefix=()):
    """Every key path into nested dicts and lists of *d*."""
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        yield (*prefix, k)
        yield from _paths(v, (*prefix, k))


@st.composite
def _mutated(draw):
    data = copy.deepcopy(draw(st.sampled_from([_valid(), *(device_profile_to_dict(p) for p in device_profiles().values())])))
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(data))
        action = draw(st.sampled_from(["drop", "add", "replace"]))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        if action == "drop":
            if isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent.pop(path[-1])
        elif action == "add":
            target = parent[path[-1]] if isinstance(parent[path[-1]], dict) else parent
            if isinstance(target, dict):
                target[draw(st.one_of(st.text(max_size=6), st.integers()))] = draw(_JUNK)
        else:
            parent[path[-1]] = draw(_JUNK)
    return data


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_profiles_load_or_raise_scenario_error_only(data):
    """Dropping keys, adding unknown keys and putting wrong types anywhere: the loader
    either returns a profile or raises ScenarioError with at least one key path -- never
    another exception."""
    try:
        p = device_profile_from_dict(data, "fuzz.yaml")
    except ScenarioError as exc:
        assert exc.problems and exc.source == "fuzz.yaml"
    else:
        assert isinstance(p, DeviceProfile)
        assert device_profile_from_dict(device_profile_to_dict(p)) == p
