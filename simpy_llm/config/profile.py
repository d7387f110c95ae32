"""Latency profiles: a latency model's coefficients in a file of their own.

A profile is YAML with at least a ``latency_model`` (what a scenario's
``serving.latency_model`` takes)::

    profile_version: 1
    latency_model: {kind: batch_table, params: {...}}
    server: {...}        # optional: the server it describes (a trace header's server block)
    fit: {...}           # optional: how it was made (``simpy-llm calibrate fit``)

A scenario names one in place of a latency model, ``latency_model: {profile:
path/to/profile.yaml}`` (relative to the scenario file); the loader reads the
file and uses its ``latency_model``, so the scenario's manifest and
``scenario_to_dict`` show the coefficients themselves. When the profile records
the ranges it was fitted on (``fit.ranges``), the scenario's latency model keeps
them as ``fitted_ranges`` (:class:`FittedLatencySpec`), and a run warns when its
workload leaves them (the ``outside_fitted_range`` diagnostic).

The fit block's keys that other code reads are checked when the file is loaded
(each optional: a missing one means "unknown"):

``fit.ranges``
    ``{quantity: [min, max]}`` for the quantities of :data:`RANGE_QUANTITIES`.
``fit.intervals``
    ``{coefficient: [low, high] | null}`` for the coefficients of
    :data:`FIT_COEFFICIENTS`; ``decode_step_us`` takes a list with one entry per
    table entry.
``fit.sources``
    ``{coefficient: source}`` (``trace``, ``prior`` or ``default``, or another
    word a tool writes); ``decode_step_us`` takes a list.
``fit.warnings``
    A list of strings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.schema import PolicySpec

__all__ = [
    "FIT_COEFFICIENTS",
    "PROFILE_VERSION",
    "RANGE_QUANTITIES",
    "FittedLatencySpec",
    "check_profile",
    "check_ranges",
    "load_profile",
    "profile_latency_model",
]

PROFILE_VERSION = 1
"""The ``profile_version`` this project reads and writes."""

FIT_COEFFICIENTS = (
    "decode_step_us",
    "prefill_step_us",
    "prefill_token_us",
    "prefill_only_step_us",
    "alpha0_us",
    "cache_restore_us",
    "decode_context_us",
    "prefill_pair_us",
)
"""The ``batch_table`` coefficients a fit determines (``fit.intervals`` and ``fit.sources`` keys)."""

RANGE_QUANTITIES = {
    "prompt_tokens": "prompt tokens per request",
    "uncached_prompt_tokens": "prompt tokens computed per request, less those found cached",
    "output_tokens": "output tokens per request",
    "decoders": "requests decoding in one step",
    "concurrency": "requests in flight at once, sent and not finished",
    "cached_fraction": "share of a prompt found cached",
}
"""The operating ranges a profile records (``fit.ranges``), with what each counts."""


@attrs.frozen(kw_only=True)
class FittedLatencySpec(PolicySpec):
    """A latency model with the operating ranges its coefficients were fitted on.

    Written ``latency_model: {kind: NAME, params: {...}, fitted_ranges: {quantity: [min,
    max]}}``, or made by the loader from ``latency_model: {profile: FILE}`` when the
    profile has ``fit.ranges``. The ranges do not change a step's time; a run whose
    workload goes outside them gets the ``outside_fitted_range`` diagnostic
    (:mod:`simpy_llm.metrics.diagnostics`).
    """

    fitted_ranges: dict[str, tuple[float, float]] = attrs.field(factory=dict)
    """``{quantity: (min, max)}`` for quantities of :data:`RANGE_QUANTITIES`."""


def check_ranges(value: Any) -> tuple[dict[str, tuple[float, float]], list[tuple[str, str]]]:
    """Operating ranges as data (``{quantity: (min, max)}``) and the problems found in
    *value*, each ``(key path under the ranges, message)``.

    Examples
    --------
    >>> check_ranges({"prompt_tokens": [20, 810], "decoders": [1, 4]})
    ({'prompt_tokens': (20.0, 810.0), 'decoders': (1.0, 4.0)}, [])
    >>> check_ranges({"prompt": [1, 2], "decoders": [4, 1]})[1]  # doctest: +NORMALIZE_WHITESPACE
    [('prompt', 'unknown quantity; allowed: prompt_tokens, uncached_prompt_tokens, output_tokens, decoders,
      concurrency, cached_fraction'), ('decoders', 'must be [min, max] with 0 <= min <= max, got [4, 1]')]
    """
    if not isinstance(value, Mapping):
        return {}, [("", f"must be a mapping {{quantity: [min, max]}}, got {value!r}")]
    out: dict[str, tuple[float, float]] = {}
    problems: list[tuple[str, str]] = []
    for key, pair in value.items():
        if key not in RANGE_QUANTITIES:
            problems.append((str(key), f"unknown quantity; allowed: {', '.join(RANGE_QUANTITIES)}"))
            continue
        ok = (isinstance(pair, (list, tuple)) and len(pair) == 2
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in pair)
              and 0 <= pair[0] <= pair[1])
        if not ok:
            problems.append((key, f"must be [min, max] with 0 <= min <= max, got {pair!r}"))
            continue
        out[key] = (float(pair[0]), float(pair[1]))
    return out, problems


def _interval_problems(value: Any, where: str) -> list[tuple[str, str]]:
    ok = value is None or (
        isinstance(value, (list, tuple)) and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) for v in value)
        and value[0] <= value[1]
    )
    return [] if ok else [(where, f"must be null or [low, high] with low <= high, got {value!r}")]


def _per_coefficient(value: Any, where: str, entry: Any) -> list[tuple[str, str]]:
    """Problems of a ``{coefficient: x}`` block whose values *entry* checks (``decode_step_us``: a list of them)."""
    if not isinstance(value, Mapping):
        return [(where, f"must be a mapping {{coefficient: ...}}, got {value!r}")]
    problems: list[tuple[str, str]] = []
    for key, v in value.items():
        path = f"{where}.{key}"
        if key not in FIT_COEFFICIENTS:
            problems.append((path, f"unknown coefficient; allowed: {', '.join(FIT_COEFFICIENTS)}"))
        elif key == "decode_step_us":
            if not isinstance(v, list):
                problems.append((path, f"must be a list, one entry per decode-table entry, got {v!r}"))
            else:
                for i, item in enumerate(v):
                    problems += entry(item, f"{path}[{i}]")
        else:
            problems += entry(v, path)
    return problems


def _source_problems(value: Any, where: str) -> list[tuple[str, str]]:
    ok = isinstance(value, str) and value != ""
    return [] if ok else [(where, f"must be a word naming where the value comes from (trace, prior, default), got {value!r}")]


def _fit_problems(fit: Any) -> list[tuple[str, str]]:
    """Problems of the fit block's checked keys (module docstring)."""
    if fit is None:
        return []
    if not isinstance(fit, Mapping):
        return [("fit", f"must be a mapping, got {fit!r}")]
    problems: list[tuple[str, str]] = []
    if fit.get("ranges") is not None:
        problems += [(f"fit.ranges.{p}" if p else "fit.ranges", m) for p, m in check_ranges(fit["ranges"])[1]]
    if fit.get("intervals") is not None:
        problems += _per_coefficient(fit["intervals"], "fit.intervals", _interval_problems)
    if fit.get("sources") is not None:
        problems += _per_coefficient(fit["sources"], "fit.sources", _source_problems)
    warnings = fit.get("warnings")
    if warnings is not None and not (isinstance(warnings, list) and all(isinstance(w, str) for w in warnings)):
        problems.append(("fit.warnings", f"must be a list of strings, got {warnings!r}"))
    return problems


def load_profile(path: Path | str) -> dict[str, Any]:
    """The profile at *path* as plain data (:func:`check_profile`).

    Raises
    ------
    ScenarioError
        The file is missing or not YAML, or :func:`check_profile` finds a problem.
    """
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(source, [("", f"cannot read profile: {exc.strerror}")]) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(source, [("", f"not valid YAML: {exc}")]) from None
    return check_profile(data, source)


def check_profile(data: Any, source: str = "<profile>") -> dict[str, Any]:
    """*data* if it is a profile, for a :class:`ScenarioError` naming *source* otherwise.

    Raises
    ------
    ScenarioError
        *data* is not a mapping, has another ``profile_version``, has no ``latency_model:
        {kind: NAME, params: {...}}``, or a checked key of its fit block (module docstring)
        is malformed.

    Examples
    --------
    >>> check_profile({"latency_model": {"kind": "batch_table"}, "fit": {"ranges": {"decoders": [1, 4]}}})["fit"]
    {'ranges': {'decoders': [1, 4]}}
    >>> check_profile({"latency_model": {"kind": "batch_table"}, "fit": {"intervals": {"prefill_pair_us": [2, 1]}}})
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: <profile>: 1 problem(s) in profile
      fit.intervals.prefill_pair_us: must be null or [low, high] with low <= high, got [2, 1]
    """
    if not isinstance(data, dict):
        raise ScenarioError(source, [("", "a profile must be a mapping with latency_model")])
    version = data.get("profile_version", PROFILE_VERSION)
    if version != PROFILE_VERSION:
        raise ScenarioError(source, [("profile_version", f"must be {PROFILE_VERSION}, got {version!r}")])
    model = data.get("latency_model")
    if not isinstance(model, dict) or not isinstance(model.get("kind"), str):
        raise ScenarioError(source, [("latency_model", "required: {kind: NAME, params: {...}}")])
    problems = _fit_problems(data.get("fit"))
    if problems:
        raise ScenarioError(source, problems, what="profile")
    return data


def profile_latency_model(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The latency model a scenario takes from *profile* (loaded data): its
    ``latency_model``, with ``fitted_ranges`` from ``fit.ranges`` when it has them.

    Examples
    --------
    >>> profile_latency_model({"latency_model": {"kind": "batch_table", "params": {}},
    ...                        "fit": {"ranges": {"decoders": [1, 2]}}})
    {'kind': 'batch_table', 'params': {}, 'fitted_ranges': {'decoders': [1, 2]}}
    """
    model = dict(profile["latency_model"])
    fit = profile.get("fit")
    ranges = fit.get("ranges") if isinstance(fit, Mapping) else None
    if ranges:
        model["fitted_ranges"] = dict(ranges)
    return model
