"""Device profiles: what a device can do, what it draws, when it is there, what it costs.

A :class:`DeviceProfile` describes one device that serves a model: a datacenter GPU
(the *target* of speculative decoding, or any replica), or an edge GPU, a laptop, a
phone (a *draft* device). Its schema follows seed 003 §5.1 ("Device Profile Schema"),
with units in every name; ``docs/devices.md`` lists every key, the shipped profiles
and how the simulator uses each figure.

Shipped profiles live in ``profiles/devices/<id>.yaml`` (found through
:func:`~simpy_llm.serving.latency.profiles_dir`); every figure in them names its
source in ``sources`` and in ``profiles/devices/NOTICE.md``, and estimates say so.

Loading is strict, like the scenario loader: an unknown key anywhere, a missing
required key, a value of the wrong type (``"700"`` is not a number, ``true`` is not a
number, ``8.0`` is not an integer) or out of range, and an unknown GPU name, are each
reported with the file and the key path, all in one
:class:`~simpy_llm.config.errors.ScenarioError`::

    profiles/devices/h100.yaml: 1 problem(s) in device profile
      energy.active_watts: unknown key; allowed: active_w, idle_w

Units: TFLOP/s = 1e12 FLOP/s; GB/s = 1e9 bytes/s (bandwidths, as vendors quote them);
memory sizes in GiB (``memory_gb``) and MiB (``kv_cache_limit_mb``), i.e. 2**30 and
2**20 bytes, as memory capacities are quoted (an "80GB" HBM part holds 80 x 2**30
bytes; ``profiles/gpus.yaml`` counts it the same way); power in watts; time in seconds;
money in US dollars.

Examples
--------
>>> h100 = device_profile("h100-sxm")
>>> h100.role, h100.gpu, h100.compute.memory_bandwidth_gb_per_s, h100.energy.active_w
('target', 'H100', 3350.0, 700.0)
>>> sorted(p.id for p in device_profiles().values() if p.role == "draft")
['jetson-agx-orin', 'laptop-rtx4060', 'phone-snapdragon-8-gen-3']
"""

from __future__ import annotations

import functools
import re
import reprlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.structure import read_yaml_file
from simpy_llm.config.validators import (
    MAX_TIME_S,
    MAX_TOKENS,
    all_of,
    at_least,
    at_most,
    greater_than,
    optional,
)
from simpy_llm.serving.hardware import gpu_spec
from simpy_llm.serving.profiles import profiles_path

__all__ = [
    "DEVICE_ROLES",
    "AvailabilityWindow",
    "ColdStart",
    "Compute",
    "DeviceProfile",
    "Energy",
    "Memory",
    "Parallelism",
    "Thermal",
    "device_profile",
    "device_profile_from_dict",
    "device_profile_names",
    "device_profile_to_dict",
    "device_profiles",
    "load_device_profile",
    "profiles_path",
]

DEVICE_ROLES = ("target", "draft", "any")
"""What a device may serve: the target model, a draft model, or either."""

MAX_TFLOPS = 1e6
"""Largest ``sustained_tflops``: an exaflop per second, beyond any single device."""

MAX_BANDWIDTH_GB_PER_S = 1e6
"""Largest memory or interconnect bandwidth, GB/s (a petabyte per second)."""

MAX_MEMORY_GB = 1e6
"""Largest device memory, GiB (about a pebibyte)."""

MAX_POWER_W = 1e6
"""Largest power draw, watts (a megawatt, far beyond one device)."""

MAX_PRICE_PER_HOUR_USD = 1e6
"""Largest price, US dollars per hour."""

MAX_PARALLEL_DEGREE = 2**16
"""Largest tensor- or pipeline-parallel degree a device may allow."""

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_WHAT = "device profile"


# --- validators (raise FieldValueError, so errors carry the key) ---------------------------


def _text(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise FieldValueError(attr.name, f"must be a non-empty string, got {reprlib.repr(value)}")


def _identifier(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not _ID.match(value):
        raise FieldValueError(
            attr.name,
            f"must be a name of letters, digits, '.', '_' and '-' (not starting with a symbol), got {reprlib.repr(value)}",
        )


def _role(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or value not in DEVICE_ROLES:
        raise FieldValueError(attr.name, f"must be one of {', '.join(DEVICE_ROLES)}; got {reprlib.repr(value)}")


def _integer(low: int, high: int) -> Any:
    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldValueError(attr.name, f"must be an integer, got {reprlib.repr(value)}")
        if not low <= value <= high:
            raise FieldValueError(attr.name, f"must be in [{low}, {high}], got {reprlib.repr(value)}")

    return check


def _sources(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple):
        raise FieldValueError(attr.name, f"must be a list of strings, got {reprlib.repr(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise FieldValueError(f"{attr.name}[{i}]", f"must be a non-empty string, got {reprlib.repr(item)}")


def _windows(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(w, AvailabilityWindow) for w in value):
        raise FieldValueError(attr.name, f"must be a tuple of AvailabilityWindow, got {reprlib.repr(value)}")
    for i in range(1, len(value)):
        if value[i].start_s < value[i - 1].end_s:
            raise FieldValueError(
                f"{attr.name}[{i}].start_s",
                f"windows must be in time order and not overlap: starts at {value[i].start_s} s, "
                f"before the previous window ends ({value[i - 1].end_s} s)",
            )


def _canonical_gpu(value: Any) -> Any:
    """The name ``profiles/gpus.yaml`` gives the GPU (an alias or another case maps to it)."""
    return None if value is None else gpu_spec(value).name


def _as_float(value: Any) -> Any:
    """An integer as a float (YAML writes ``700`` for 700.0); anything else unchanged, for
    the validator to judge (so ``"700"`` and ``true`` are still refused)."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int too large for a float: the validator says so
            return value
    return value


def _of_type(cls: type) -> Any:
    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, cls):
            raise FieldValueError(attr.name, f"must be a {cls.__name__}, got {reprlib.repr(value)}")

    return check


# --- the records --------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Compute:
    """What the device computes with."""

    sustained_tflops: float = attrs.field(converter=_as_float, validator=all_of(greater_than(0), at_most(MAX_TFLOPS)))
    """Dense fp16/bf16 matrix throughput the device sustains, TFLOP/s (1e12 FLOP/s). The
    shipped GPU profiles give the datasheet peak (an upper bound); their ``sources`` say so."""
    memory_bandwidth_gb_per_s: float = attrs.field(
        converter=_as_float, validator=all_of(greater_than(0), at_most(MAX_BANDWIDTH_GB_PER_S))
    )
    """Device-memory bandwidth, GB/s (1e9 bytes/s)."""
    max_parallel_tokens: int | None = attrs.field(default=None, validator=optional(_integer(1, MAX_TOKENS)))
    """Most tokens the device computes in one step (None: no limit beyond the engine's)."""


@attrs.frozen(kw_only=True)
class Memory:
    """What the device holds."""

    memory_gb: float = attrs.field(converter=_as_float, validator=all_of(greater_than(0), at_most(MAX_MEMORY_GB)))
    """Device memory, GiB (2**30 bytes), as the vendor quotes it (for a phone or an edge
    module, the memory shared by CPU and GPU)."""
    kv_cache_limit_mb: float | None = attrs.field(
        default=None, converter=_as_float, validator=optional(all_of(greater_than(0), at_most(MAX_MEMORY_GB * 1024)))
    )
    """Most KV cache the device may hold, MiB (2**20 bytes); None: what ``memory_gb`` leaves
    after the weights. At most ``memory_gb x 1024``."""

    def __attrs_post_init__(self) -> None:
        if self.kv_cache_limit_mb is not None and self.kv_cache_limit_mb > self.memory_gb * 1024:
            raise FieldValueError(
                "kv_cache_limit_mb",
                f"must be <= memory_gb x 1024 = {self.memory_gb * 1024:g} MiB, got {self.kv_cache_limit_mb!r}",
            )


@attrs.frozen(kw_only=True)
class Thermal:
    """Thermal throttling: after a stretch of continuous work, the device slows down."""

    throttle_after_s: float = attrs.field(converter=_as_float, validator=all_of(at_least(0), at_most(MAX_TIME_S)))
    """Continuous busy time after which the device throttles, seconds."""
    throttle_factor: float = attrs.field(converter=_as_float, validator=all_of(greater_than(0), at_most(1)))
    """Fraction of its speed a throttled device keeps, in (0, 1] (1: no slowdown)."""


@attrs.frozen(kw_only=True)
class Energy:
    """Power the device draws (the board, or the module / SoC and its memory)."""

    active_w: float = attrs.field(converter=_as_float, validator=all_of(greater_than(0), at_most(MAX_POWER_W)))
    """Power under load, watts (for a GPU, its board power limit)."""
    idle_w: float = attrs.field(converter=_as_float, validator=all_of(at_least(0), at_most(MAX_POWER_W)))
    """Power when in service but not working, watts (at most ``active_w``)."""

    def __attrs_post_init__(self) -> None:
        if self.idle_w > self.active_w:
            raise FieldValueError("idle_w", f"must be <= active_w ({self.active_w!r}), got {self.idle_w!r}")


@attrs.frozen(kw_only=True)
class AvailabilityWindow:
    """A stretch of simulated time during which the device is out of service."""

    start_s: float = attrs.field(converter=_as_float, validator=all_of(at_least(0), at_most(MAX_TIME_S)))
    """Start of the window, seconds of simulated time."""
    end_s: float = attrs.field(converter=_as_float, validator=all_of(at_least(0), at_most(MAX_TIME_S)))
    """End of the window, seconds (after ``start_s``); the device is back at ``end_s``."""

    def __attrs_post_init__(self) -> None:
        if not self.end_s > self.start_s:
            raise FieldValueError("end_s", f"must be > start_s ({self.start_s!r}), got {self.end_s!r}")


@attrs.frozen(kw_only=True)
class ColdStart:
    """Getting the device ready to serve."""

    load_s: float = attrs.field(converter=_as_float, validator=all_of(at_least(0), at_most(MAX_TIME_S)))
    """Time to load the model's weights before the first request, seconds."""


@attrs.frozen(kw_only=True)
class Parallelism:
    """How far a model may be split over devices of this kind (target devices)."""

    max_tp: int = attrs.field(validator=_integer(1, MAX_PARALLEL_DEGREE))
    """Largest tensor-parallel degree: devices joined by ``interconnect_gb_per_s`` (one
    NVLink domain, or one server's PCIe)."""
    interconnect_gb_per_s: float = attrs.field(
        converter=_as_float, validator=all_of(greater_than(0), at_most(MAX_BANDWIDTH_GB_PER_S))
    )
    """Device-to-device bandwidth per direction used by a tensor-parallel all-reduce, GB/s
    (as ``profiles/gpus.yaml`` counts it)."""
    max_pp: int | None = attrs.field(default=None, validator=optional(_integer(1, MAX_PARALLEL_DEGREE)))
    """Largest pipeline-parallel degree (None: no limit from the device; stages span servers)."""


@attrs.frozen(kw_only=True)
class DeviceProfile:
    """One device: its compute, memory, power, availability, start-up cost and price.

    Examples
    --------
    >>> p = DeviceProfile(
    ...     id="my-gpu", role="target", vendor="NVIDIA", description="an H100 with a lower power cap",
    ...     compute=Compute(sustained_tflops=700.0, memory_bandwidth_gb_per_s=3350.0),
    ...     memory=Memory(memory_gb=80.0), energy=Energy(active_w=500.0, idle_w=90.0), gpu="h100-sxm",
    ... )
    >>> p.gpu, p.availability, p.sources
    ('H100', (), ())
    """

    id: str = attrs.field(validator=_identifier)
    """The profile's name (a shipped profile's file is ``<id>.yaml``)."""
    role: str = attrs.field(validator=_role)
    """What it serves: ``target`` (the target model, or any replica), ``draft`` (a draft
    model), ``any`` (either)."""
    vendor: str = attrs.field(validator=_text)
    """Who makes the device (for a phone, the maker of its chip)."""
    description: str = attrs.field(validator=_text)
    """What the device is, in a line."""
    compute: Compute = attrs.field(validator=_of_type(Compute))
    """Throughput and memory bandwidth."""
    memory: Memory = attrs.field(validator=_of_type(Memory))
    """Memory size and KV-cache limit."""
    energy: Energy = attrs.field(validator=_of_type(Energy))
    """Power under load and when idle."""
    thermal: Thermal | None = attrs.field(default=None, validator=optional(_of_type(Thermal)))
    """Thermal throttling (None: the device never throttles)."""
    availability: tuple[AvailabilityWindow, ...] = attrs.field(default=(), validator=_windows)
    """Windows when the device is out of service, in time order, not overlapping
    (empty: always in service)."""
    cold_start: ColdStart | None = attrs.field(default=None, validator=optional(_of_type(ColdStart)))
    """Weight loading before the first request (None: ready at once)."""
    price_per_hour_usd: float | None = attrs.field(
        default=None, converter=_as_float, validator=optional(all_of(at_least(0), at_most(MAX_PRICE_PER_HOUR_USD)))
    )
    """On-demand price of one device, US dollars per hour (None: no meaningful price,
    e.g. a phone the user owns)."""
    parallelism: Parallelism | None = attrs.field(default=None, validator=optional(_of_type(Parallelism)))
    """Tensor/pipeline-parallel limits (target and any devices only; None: one device per replica)."""
    gpu: str | None = attrs.field(default=None, converter=_canonical_gpu)
    """The GPU of ``profiles/gpus.yaml`` this device is, checked to exist (given by name or
    alias, stored as its name); None for a device not listed there."""
    sources: tuple[str, ...] = attrs.field(default=(), validator=_sources)
    """Where each figure comes from (document titles or URLs, estimates marked as such);
    required and non-empty for shipped profiles."""

    def __attrs_post_init__(self) -> None:
        if self.parallelism is not None and self.role == "draft":
            raise FieldValueError(
                "parallelism", "only a target (or any) device has parallelism limits; this profile's role is draft"
            )


_SECTIONS: dict[str, type] = {
    "compute": Compute,
    "memory": Memory,
    "thermal": Thermal,
    "energy": Energy,
    "cold_start": ColdStart,
    "parallelism": Parallelism,
}


# --- loading --------------------------------------------------------------------------------


def _join(prefix: str, field: str) -> str:
    if not prefix:
        return field
    return prefix + field if field.startswith("[") else f"{prefix}.{field}"


def _fields(cls: type, value: Mapping[Any, Any], prefix: str, problems: list[tuple[str, str]], parse: Any = None) -> Any:
    """``cls(**value)``, or None after reporting every unknown or missing key and bad value.

    *parse(name, item)* turns a raw item into the field's value first (sections, lists);
    it returns :data:`_BAD` after reporting its own problems.
    """
    names = [a.name for a in attrs.fields(cls)]
    before = len(problems)
    for key in value:
        if key not in names:
            problems.append((_join(prefix, str(key)), f"unknown key; allowed: {', '.join(names)}"))
    kwargs: dict[str, Any] = {}
    for a in attrs.fields(cls):
        if a.name not in value:
            if a.default is attrs.NOTHING:
                problems.append((_join(prefix, a.name), "required key is missing"))
            continue
        item = value[a.name] if parse is None else parse(a.name, value[a.name])
        if item is _BAD:
            continue
        try:
            if a.converter is not None:
                item = a.converter(item)
            if a.validator is not None:
                a.validator(None, a, item)
        except FieldValueError as exc:
            problems.append((_join(prefix, exc.field), exc.message))
            continue
        kwargs[a.name] = item
    if len(problems) > before:
        return None
    try:  # the checks that span fields
        return cls(**kwargs)
    except FieldValueError as exc:
        problems.append((_join(prefix, exc.field), exc.message))
        return None


_BAD = object()
"""A raw value :func:`_parse_top` could not turn into a field's value (already reported)."""


def _section(cls: type, value: Any, path: str, problems: list[tuple[str, str]]) -> Any:
    if not isinstance(value, Mapping):
        names = ", ".join(a.name for a in attrs.fields(cls))
        problems.append((path, f"must be a mapping with keys: {names}; got {reprlib.repr(value)}"))
        return _BAD
    built = _fields(cls, value, path, problems)
    return _BAD if built is None else built


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _parse_top(problems: list[tuple[str, str]]) -> Any:
    def parse(name: str, value: Any) -> Any:
        if name in _SECTIONS:
            if value is None and attrs.fields_dict(DeviceProfile)[name].default is None:
                return None  # an optional section written as null
            return _section(_SECTIONS[name], value, name, problems)
        if name == "availability":
            if value is None:
                return ()
            if not _is_list(value):
                problems.append((name, f"must be a list of {{start_s, end_s}} windows, got {reprlib.repr(value)}"))
                return _BAD
            windows = [_section(AvailabilityWindow, w, f"{name}[{i}]", problems) for i, w in enumerate(value)]
            return _BAD if any(w is _BAD for w in windows) else tuple(windows)
        if name == "sources":
            if not _is_list(value):
                problems.append((name, f"must be a list of strings, got {reprlib.repr(value)}"))
                return _BAD
            return tuple(value)
        return value

    return parse


def device_profile_from_dict(data: Any, source: str = "<dict>") -> DeviceProfile:
    """Build a :class:`DeviceProfile` from plain data (a parsed YAML file).

    Parameters
    ----------
    data
        A mapping with the keys of :class:`DeviceProfile` (sections as mappings,
        ``availability`` as a list of ``{start_s, end_s}``, ``sources`` as a list of
        strings).
    source
        What to call the data in errors (the file it came from).

    Raises
    ------
    ScenarioError
        Listing every problem found (in the order of the schema's keys), each with
        its key path and what is allowed.

    Examples
    --------
    >>> device_profile_from_dict({"id": "x", "role": "draft", "vendor": "v", "description": "d",
    ...     "compute": {"sustained_tflops": 1, "memory_bandwidth_gb_per_s": 50},
    ...     "memory": {"memory_gb": 8}, "energy": {"active_w": 5, "idle_watts": 1}}, "x.yaml")
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: x.yaml: 2 problem(s) in device profile
      energy.idle_watts: unknown key; allowed: active_w, idle_w
      energy.idle_w: required key is missing
    """
    if not isinstance(data, Mapping):
        raise ScenarioError(source, [("", f"a device profile must be a mapping, got {reprlib.repr(data)}")], _WHAT)
    problems: list[tuple[str, str]] = []
    profile = _fields(DeviceProfile, data, "", problems, parse=_parse_top(problems))
    if profile is None:
        raise ScenarioError(source, problems, _WHAT)
    return profile


def load_device_profile(path: str | Path) -> DeviceProfile:
    """Read a device profile from a YAML file (strictly; see the module docstring).

    Raises
    ------
    ScenarioError
        Naming the file, each key path and what is allowed; also for a missing
        file, a file that is not YAML, or one that is not a mapping.

    Examples
    --------
    >>> p = load_device_profile(profiles_path() / "l40s.yaml")
    >>> p.id, p.memory.memory_gb, p.parallelism.interconnect_gb_per_s
    ('l40s', 48.0, 32.0)
    """
    return device_profile_from_dict(read_yaml_file(path, _WHAT), str(path))


def device_profile_to_dict(profile: DeviceProfile) -> dict[str, Any]:
    """Plain data for *profile*, in the file's shape: what
    :func:`device_profile_from_dict` reads back into an equal profile. Keys left at
    their default (None, no availability windows, no sources) are left out.

    Examples
    --------
    >>> d = device_profile_to_dict(device_profile("jetson-agx-orin"))
    >>> d["energy"], "price_per_hour_usd" in d
    ({'active_w': 60.0, 'idle_w': 10.0}, False)
    >>> device_profile_from_dict(d) == device_profile("jetson-agx-orin")
    True
    """

    def keep(a: attrs.Attribute[Any], value: Any) -> bool:
        return value is not None and value != () and value != []

    return attrs.asdict(profile, filter=keep)


# --- shipped profiles ------------------------------------------------------------------------


def _display(path: Path) -> str:
    """*path* relative to the folder holding ``profiles/`` (``profiles/devices/h100-sxm.yaml``)."""
    root = profiles_path().parent.parent
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


@functools.cache
def _shipped() -> tuple[tuple[str, DeviceProfile], ...]:
    out = []
    for path in sorted(profiles_path().glob("*.yaml")):
        source = _display(path)
        try:
            profile = load_device_profile(path)
        except ScenarioError as exc:
            raise ScenarioError(source, exc.problems, _WHAT) from None
        problems = []
        if profile.id != path.stem:
            problems.append(("id", f"a shipped profile's id must be its file name, {path.stem!r}; got {profile.id!r}"))
        if not profile.sources:
            problems.append(("sources", "a shipped profile must name the source of its figures"))
        if problems:
            raise ScenarioError(source, problems, _WHAT)
        out.append((profile.id, profile))
    return tuple(out)


def device_profiles() -> dict[str, DeviceProfile]:
    """Every shipped profile (``profiles/devices/*.yaml``), by id (read once, then cached).

    Raises
    ------
    ScenarioError
        If a shipped file is invalid, its id is not its file name, or it names no sources.

    Examples
    --------
    >>> list(device_profiles())  # doctest: +NORMALIZE_WHITESPACE
    ['a100-80gb-sxm', 'h100-sxm', 'jetson-agx-orin', 'l40s', 'laptop-rtx4060',
     'phone-snapdragon-8-gen-3']
    """
    return dict(_shipped())


def device_profile_names() -> tuple[str, ...]:
    """Ids of the shipped profiles, sorted."""
    return tuple(name for name, _ in _shipped())


def device_profile(name_or_path: str | Path) -> DeviceProfile:
    """A shipped profile by id, or the profile in a YAML file.

    A :class:`~pathlib.Path`, or a string that is not a shipped id but names an
    existing file or ends in ``.yaml`` / ``.yml``, is read as a file.

    Raises
    ------
    FieldValueError
        (field ``device``) for a name that is neither a shipped id nor a file,
        listing the shipped ids.
    ScenarioError
        For a file that is not a valid profile.

    Examples
    --------
    >>> device_profile("l40s").compute.sustained_tflops
    362.05
    >>> device_profile("b300")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.FieldValueError: device: unknown device profile 'b300'; shipped: a100-80gb-sxm, h100-sxm,
        jetson-agx-orin, l40s, laptop-rtx4060, phone-snapdragon-8-gen-3 (or give the path of a YAML file)
    """
    shipped = device_profiles()
    if isinstance(name_or_path, str) and name_or_path in shipped:
        return shipped[name_or_path]
    if isinstance(name_or_path, (str, Path)):
        path = Path(name_or_path)
        if isinstance(name_or_path, Path) or path.suffix in (".yaml", ".yml") or path.is_file():
            return load_device_profile(path)
    raise FieldValueError(
        "device",
        f"unknown device profile {name_or_path!r}; shipped: {', '.join(shipped)} (or give the path of a YAML file)",
    )
