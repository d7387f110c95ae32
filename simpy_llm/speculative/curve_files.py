"""Acceptance curve files: the project's ``curves:`` format and the seed's ``bins:`` format
(``k=N: {mean, p95}``), read into an :class:`~simpy_llm.speculative.acceptance.AcceptanceModel`
with every problem named by its key path.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simpy_llm.config.errors import ProblemList
from simpy_llm.config.structure import read_yaml_file
from simpy_llm.config.validators import MAX_TOKENS
from simpy_llm.speculative.acceptance import DRAWS, INTERPOLATIONS, MAX_K, METHODS, AcceptanceCurve, AcceptanceModel, finite_number, fit_beta, lerp

_BIN_KEYS = ("context_len", "temperature", "acceptance")
_BIN_TOP_KEYS = ("name", "drafter", "verifier", "method", "source", "illustrative", "notes", "interpolation", "draw", "bins")
_CURVE_KEYS = ("temperature", "context_len", "acceptance")
_ENTRY_KEYS = ("mean", "p95")
_MAX_PROBLEMS = 25
_POSITION = re.compile(r"k=([1-9][0-9]*)")
_REQUIRED_BIN_TOP = ("method", "source", "bins")
_REQUIRED_TOP = ("name", "drafter", "verifier", "method", "source", "curves")
_TOP_KEYS = ("name", "drafter", "verifier", "method", "source", "illustrative", "notes", "curves")
_WHAT = "acceptance curve"

__all__ = ["acceptance_from_dict", "load_acceptance"]




def _text(data: Mapping[str, Any], key: str, found: ProblemList, required: bool) -> str:
    if key not in data:
        if required:
            found.add(key, "required key is missing")
        return ""
    value = data[key]
    if not isinstance(value, str) or (required and not value.strip()):
        found.add(key, f"must be {'non-blank ' if required else ''}text, got {value!r}")
        return ""
    return value


def _curve(raw: Any, where: str, found: ProblemList, k_max: list[int]) -> AcceptanceCurve | None:
    if not isinstance(raw, Mapping):
        found.add(where, f"must be a mapping with keys {', '.join(_CURVE_KEYS)}, got {raw!r}")
        return None
    before = len(found)
    for key in raw:
        if key not in _CURVE_KEYS:
            found.add(f"{where}.{key}", f"unknown key; allowed: {', '.join(_CURVE_KEYS)}")
    for key in _CURVE_KEYS:
        if key not in raw:
            found.add(f"{where}.{key}", "required key is missing")
    temperature = finite_number(raw.get("temperature"))
    if "temperature" in raw and (temperature is None or temperature < 0):
        found.add(f"{where}.temperature", f"must be a finite number >= 0, got {raw['temperature']!r}")
    grid: list[int] = []
    ctx = raw.get("context_len")
    if "context_len" in raw:
        if not isinstance(ctx, list) or not ctx:
            found.add(f"{where}.context_len", f"must be a non-empty list of whole numbers, got {ctx!r}")
        else:
            for j, c in enumerate(ctx):
                f = finite_number(c)
                if f is None or not f.is_integer() or not 1 <= f <= MAX_TOKENS:
                    found.add(f"{where}.context_len[{j}]", f"must be a whole number in [1, {MAX_TOKENS}], got {c!r}")
                    continue
                if grid and f <= grid[-1]:
                    found.add(f"{where}.context_len[{j}]", f"must be strictly increasing: {int(f)} after {grid[-1]}")
                grid.append(int(f))
    rows: list[tuple[float, ...]] = []
    acc = raw.get("acceptance")
    if "acceptance" in raw:
        if not isinstance(acc, list) or not acc:
            found.add(f"{where}.acceptance", f"must be a non-empty list of rows (one per context_len), got {acc!r}")
        else:
            if isinstance(ctx, list) and len(acc) != len(ctx):
                found.add(f"{where}.acceptance", f"has {len(acc)} row(s) for {len(ctx)} context_len value(s)")
            for r, row in enumerate(acc):
                at = f"{where}.acceptance[{r}]"
                if not isinstance(row, list) or not row:
                    found.add(at, f"must be a non-empty list p_1 .. p_kmax, got {row!r}")
                    continue
                if len(row) > MAX_K:
                    found.add(at, f"has {len(row)} positions; at most {MAX_K}")
                    continue
                if not k_max:
                    k_max.append(len(row))
                elif len(row) != k_max[0]:
                    found.add(at, f"has {len(row)} position(s); every row must have k_max = {k_max[0]} (the first row's)")
                values = []
                for i, p in enumerate(row):
                    f = finite_number(p)
                    if f is None or not 0.0 <= f <= 1.0:
                        found.add(f"{at}[{i}]", f"must be a probability in [0, 1], got {p!r}")
                    values.append(f)
                rows.append(tuple(values))  # type: ignore[arg-type]
    if len(found) > before:
        return None
    return AcceptanceCurve(temperature=float(temperature), context_len=tuple(grid), acceptance=tuple(rows))  # type: ignore[arg-type]


def _metadata(data: Mapping[str, Any], found: ProblemList, required: tuple[str, ...]) -> tuple[dict[str, str], str, Any, Any]:
    """The keys both formats share: the names and source (each required when in *required*),
    the notes, the drafting method and the illustrative flag, their problems added to *found*."""
    texts = {key: _text(data, key, found, key in required) for key in ("name", "drafter", "verifier", "source")}
    notes = _text(data, "notes", found, False)
    method = data.get("method")
    if "method" not in data:
        found.add("method", "required key is missing")
    elif method not in METHODS:
        found.add("method", f"must be one of {', '.join(METHODS)}; got {method!r}")
    illustrative = data.get("illustrative", False)
    if not isinstance(illustrative, bool):
        found.add("illustrative", f"must be true or false, got {illustrative!r}")
    return texts, notes, method, illustrative


def acceptance_from_dict(data: Any, source: str = "<dict>") -> AcceptanceModel:
    """Validate a curve file's content (module docstring) into an :class:`AcceptanceModel`.

    Raises
    ------
    ScenarioError
        Naming *source* and listing every problem with its key path; ``what`` is
        ``"acceptance curve"``.

    Examples
    --------
    >>> m = acceptance_from_dict({"name": "x", "drafter": "d", "verifier": "v", "method": "standard",
    ...     "source": "made up", "curves": [{"temperature": 0, "context_len": [128], "acceptance": [[0.5]]}]})
    >>> m.position_probabilities(1_000, 1)
    (0.5,)
    >>> acceptance_from_dict({"name": "x", "colour": "red"})
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: <dict>: 6 problem(s) in acceptance curve
      colour: unknown key; allowed: name, drafter, verifier, method, source, illustrative, notes, curves
      drafter: required key is missing
      verifier: required key is missing
      source: required key is missing
      method: required key is missing
      curves: required key is missing (or bins, for seed 003's k=N: {mean, p95} format)
    >>> acceptance_from_dict({"method": "eagle", "source": "SpecBench24", "bins": [
    ...     {"context_len": 128, "acceptance": {"k=1": {"mean": 0.92}, "k=2": {"mean": 0.85}, "k=4": {"mean": 0.72}}}]
    ... }).position_probabilities(128, 4)                   # k=3 between k=2 and k=4
    (0.92, 0.85, 0.7849999999999999, 0.72)
    """
    found = ProblemList(_WHAT, _MAX_PROBLEMS)
    if not isinstance(data, Mapping):
        found.add("", f"must be a mapping with keys {', '.join(_TOP_KEYS)}, got {type(data).__name__}")
        found.raise_if_any(source)
    if "bins" in data:
        return _bins_model(data, source)
    for key in data:
        if key not in _TOP_KEYS:
            found.add(str(key), f"unknown key; allowed: {', '.join(_TOP_KEYS)}")
    texts, notes, method, illustrative = _metadata(data, found, _REQUIRED_TOP)
    raw_curves = data.get("curves")
    curves: list[AcceptanceCurve | None] = []
    if "curves" not in data:
        found.add("curves", "required key is missing (or bins, for seed 003's k=N: {mean, p95} format)")
    elif not isinstance(raw_curves, list) or not raw_curves:
        found.add("curves", f"must be a non-empty list of curves, got {raw_curves!r}")
    else:
        k_max: list[int] = []
        curves = [_curve(raw, f"curves[{n}]", found, k_max) for n, raw in enumerate(raw_curves)]
        for n in range(1, len(curves)):
            a, b = curves[n - 1], curves[n]
            if a is not None and b is not None and not b.temperature > a.temperature:
                found.add(f"curves[{n}].temperature", f"temperatures must be strictly increasing: {b.temperature} after {a.temperature}")
    found.raise_if_any(source)
    return AcceptanceModel(
        name=texts["name"], drafter=texts["drafter"], verifier=texts["verifier"], method=str(method),
        source=texts["source"], illustrative=bool(illustrative), notes=notes,
        curves=tuple(c for c in curves if c is not None), path=source,
    )


def _entry(raw: Any, where: str, found: ProblemList) -> tuple[float, float | None] | None:
    """``(mean, p95 or None)`` of one ``k=N: {mean, p95}`` entry, or None (problems recorded)."""
    if not isinstance(raw, Mapping):
        found.add(where, f"must be a mapping with keys mean (required) and p95, got {raw!r}")
        return None
    before = len(found)
    for key in raw:
        if key not in _ENTRY_KEYS:
            found.add(f"{where}.{key}", f"unknown key; allowed: {', '.join(_ENTRY_KEYS)}")
    values: dict[str, float] = {}
    for key in _ENTRY_KEYS:
        if key not in raw:
            if key == "mean":
                found.add(f"{where}.mean", "required key is missing")
            continue
        f = finite_number(raw[key])
        if f is None or not 0.0 <= f <= 1.0:
            found.add(f"{where}.{key}", f"must be a probability in [0, 1], got {raw[key]!r}")
        else:
            values[key] = f
    if len(found) > before:
        return None
    return values["mean"], values.get("p95")


def _bin(raw: Any, where: str, found: ProblemList) -> tuple[int, float | None, dict[int, tuple[float, float | None]]] | None:
    """``(context_len, temperature or None, {N: (mean, p95)})`` of one bin, or None (problems recorded)."""
    if not isinstance(raw, Mapping):
        found.add(where, f"must be a mapping with keys {', '.join(_BIN_KEYS)}, got {raw!r}")
        return None
    before = len(found)
    for key in raw:
        if key not in _BIN_KEYS:
            found.add(f"{where}.{key}", f"unknown key; allowed: {', '.join(_BIN_KEYS)}")
    for key in ("context_len", "acceptance"):
        if key not in raw:
            found.add(f"{where}.{key}", "required key is missing")
    ctx = finite_number(raw.get("context_len"))
    if "context_len" in raw and (ctx is None or not ctx.is_integer() or not 1 <= ctx <= MAX_TOKENS):
        found.add(f"{where}.context_len", f"must be a whole number in [1, {MAX_TOKENS}], got {raw['context_len']!r}")
    temperature = finite_number(raw.get("temperature"))
    if "temperature" in raw and (temperature is None or temperature < 0):
        found.add(f"{where}.temperature", f"must be a finite number >= 0, got {raw['temperature']!r}")
    entries: dict[int, tuple[float, float | None]] = {}
    acc = raw.get("acceptance")
    if "acceptance" in raw:
        if not isinstance(acc, Mapping) or not acc:
            found.add(f"{where}.acceptance", f"must be a non-empty mapping k=N: {{mean, p95}}, got {acc!r}")
        else:
            for key, value in acc.items():
                at = f"{where}.acceptance.{key}"
                match = _POSITION.fullmatch(key) if isinstance(key, str) else None
                if match is None or int(match.group(1)) > MAX_K:
                    found.add(at, f"must be k=N, N a whole number in [1, {MAX_K}] (the draft position)")
                    continue
                entry = _entry(value, at, found)
                if entry is not None:
                    entries[int(match.group(1))] = entry
    if ctx is None or len(found) > before:
        return None
    return int(ctx), temperature, entries


def _fill(given: dict[int, float], k_max: int) -> tuple[float, ...]:
    """Positions ``1..k_max`` from the given ones, each missing one linear between its neighbours."""
    known = sorted(given)
    out = []
    for i in range(1, k_max + 1):
        if i in given:
            out.append(given[i])
            continue
        j = bisect.bisect_left(known, i)
        lo, hi = known[j - 1], known[j]
        out.append(lerp(given[lo], given[hi], (i - lo) / (hi - lo)))
    return tuple(out)


def _bins_model(data: Mapping[str, Any], source: str) -> AcceptanceModel:
    """A file in the bins format (module docstring) as an :class:`AcceptanceModel`."""
    found = ProblemList(_WHAT, _MAX_PROBLEMS)
    for key in data:
        if key == "curves":
            found.add("curves", "give curves (rows p_1 .. p_kmax) or bins (k=N: {mean, p95}), not both")
        elif key not in _BIN_TOP_KEYS:
            found.add(str(key), f"unknown key; allowed: {', '.join(_BIN_TOP_KEYS)}")
    texts, notes, method, illustrative = _metadata(data, found, _REQUIRED_BIN_TOP)
    interpolation = data.get("interpolation", "log_linear")
    if interpolation not in INTERPOLATIONS:
        found.add("interpolation", f"must be one of {', '.join(INTERPOLATIONS)}; got {interpolation!r}")
    draw = data.get("draw", "mean")
    if draw not in DRAWS:
        found.add("draw", f"must be one of {', '.join(DRAWS)}; got {draw!r}")
    raw_bins = data["bins"]
    if not isinstance(raw_bins, list) or not raw_bins:
        found.add("bins", f"must be a non-empty list of bins, got {raw_bins!r}")
        found.raise_if_any(source)
    bins = [(r, b) for r, raw in enumerate(raw_bins) if (b := _bin(raw, f"bins[{r}]", found)) is not None]
    found.raise_if_any(source)
    # Across bins: one temperature rule, one order, one set of positions, p95 everywhere or nowhere.
    given_t = [r for r, (_, t, _) in bins if t is not None]
    if given_t and len(given_t) < len(bins):
        for r, (_, t, _) in bins:
            if t is None:
                found.add(f"bins[{r}].temperature", "required key is missing: other bins give a temperature (give it in every bin or in none)")
    else:
        for (_, (c0, t0, _)), (r, (c1, t1, _)) in itertools.pairwise(bins):
            if (t1 or 0.0) < (t0 or 0.0):
                found.add(f"bins[{r}].temperature", f"bins must be in increasing (temperature, context_len) order: {t1} after {t0}")
            elif (t1 or 0.0) == (t0 or 0.0) and c1 <= c0:
                found.add(f"bins[{r}].context_len", f"must be strictly increasing within a temperature: {c1} after {c0}")
    positions = sorted(bins[0][1][2])
    if positions[0] != 1:
        found.add("bins[0].acceptance", "must give k=1: the chain starts at the first draft position")
    for r, (_, _, entries) in bins[1:]:
        if sorted(entries) != positions:
            found.add(f"bins[{r}].acceptance", f"gives k={sorted(entries)} but bins[0] gives k={positions}: every bin gives the same positions")
    tails = any(q is not None for _, (_, _, e) in bins for _, q in e.values())
    if tails:
        for r, (_, _, entries) in bins:
            for i, (_, q) in sorted(entries.items()):
                if q is None:
                    found.add(f"bins[{r}].acceptance.k={i}.p95",
                              "required key is missing: other positions give p95 (give it for every position or for none)")
    elif draw == "beta":
        found.add("draw", "beta draws from each position's mean and p95: give p95 for every position")
    found.raise_if_any(source)
    k_max = positions[-1]
    means = {r: _fill({i: e[0] for i, e in entries.items()}, k_max) for r, (_, _, entries) in bins}
    p95s = {r: _fill({i: e[1] for i, e in entries.items() if e[1] is not None}, k_max) for r, (_, _, entries) in bins} if tails else {}
    if draw == "beta":
        for r, _ in bins:
            for i, (m, q) in enumerate(zip(means[r], p95s[r], strict=True), start=1):
                try:
                    fit_beta(m, q)
                except ValueError as exc:
                    at = f"bins[{r}].acceptance.k={i}" if i in positions else f"bins[{r}].acceptance"
                    found.add(at, str(exc) if i in positions else f"position {i} (interpolated between the given k): {exc}")
    found.raise_if_any(source)
    curves = []
    for temperature in sorted({t for _, (_, t, _) in bins}, key=lambda t: t or 0.0):
        rows = [(r, c) for r, (c, t, _) in bins if t == temperature]
        curves.append(AcceptanceCurve(
            temperature=float(temperature or 0.0), context_len=tuple(c for _, c in rows),
            acceptance=tuple(means[r] for r, _ in rows), p95=tuple(p95s[r] for r, _ in rows) if tails else (),
            interpolation=str(interpolation),
        ))
    return AcceptanceModel(
        name=texts["name"] or Path(source).stem, drafter=texts["drafter"], verifier=texts["verifier"], method=str(method),
        source=texts["source"], illustrative=bool(illustrative), notes=notes, curves=tuple(curves), path=source,
        draw=str(draw),
    )


def load_acceptance(path: str | os.PathLike[str]) -> AcceptanceModel:
    """Read and validate a curve file (YAML; module docstring).

    Raises
    ------
    ScenarioError
        Naming the file and each key path; also for a missing file or one that is
        not YAML.

    Examples
    --------
    >>> from simpy_llm.speculative.acceptance import shipped_dir
    >>> m = load_acceptance(shipped_dir() / "illustrative-mobile.yaml")
    >>> m.curves[0].context_len
    (128, 512, 2048, 8192)
    """
    return acceptance_from_dict(read_yaml_file(os.fspath(path), _WHAT), str(path))
