"""A scenario's trace sources: checking the files a ``TraceSource`` names without reading their
rows (:func:`check_trace_files`), loading the trace ready to replay (:func:`load_trace`), each
keeping its last results for unchanged files, and the trace header's ``server`` block: the one a
simulated server reports (:func:`emulated_server_block`) and its differences from the simulated
engine (:func:`server_block_mismatches`).
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.plain import scenario_to_dict
from simpy_llm.workload.traces.columns import _KINDS, _REQUIRED, Trace, _is_int, _Problems, _require_columns
from simpy_llm.workload.traces.imported import (
    _ARRIVAL_FIELDS,
    _AZURE_COLUMNS,
    _BURSTGPT_COLUMNS,
    _MOONCAKE_KEYS,
    _column_mapping,
    read_azure,
    read_burstgpt,
    read_csv_mapped,
    read_mooncake,
)
from simpy_llm.workload.traces.v2 import _read_header, read_trace_v2, trace_v2_paths

if TYPE_CHECKING:
    from simpy_llm.config.schema import TraceSource

__all__ = [
    "CHECKED_TRACES_KEPT",
    "LLAMACPP_BLOCK_KEYS",
    "LOADED_TRACES_KEPT",
    "SERVER_BLOCK_KEYS",
    "TraceFileInfo",
    "check_trace_files",
    "emulated_server_block",
    "load_trace",
    "server_block_mismatches",
]


# --------------------------------------------------------------------------- header and column checks


class TraceFileInfo(NamedTuple):
    """What :func:`check_trace_files` learnt from a trace's header, without reading its rows."""

    header: dict[str, Any]
    """A trace v2's YAML header (empty for the other formats, whose header is made on reading)."""
    fields: frozenset[str]
    """The trace fields the file gives each row (``slo_class`` among them when rows carry a class)."""


def _csv_header(path: Path | str) -> list[str]:
    """The column names on the first line of the CSV at *path* (whitespace stripped), read as
    :func:`~simpy_llm.workload.traces.columns._read_csv_strings` reads them but without reading any other line."""
    source = str(path)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            first = next(csv.reader(f), None)
    except FileNotFoundError:
        raise ScenarioError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise ScenarioError(source, [("", "is a directory, expected a CSV file")]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, [("line 1", f"not UTF-8 text: {exc}")]) from None
    except csv.Error as exc:
        raise ScenarioError(source, [("line 1", f"malformed CSV: {exc}")]) from None
    except OSError as exc:
        raise ScenarioError(source, [("", f"cannot read: {exc.strerror or exc}")]) from None
    if first is None:
        raise ScenarioError(source, [("line 1", "empty file: expected a header line")])
    names = [c.strip() for c in first]
    if not any(names):
        raise ScenarioError(source, [("line 1", "blank header line: expected the column names")])
    duplicated = sorted({c for c in names if names.count(c) > 1})
    if duplicated:
        raise ScenarioError(source, [("line 1", f"duplicate column name(s): {', '.join(duplicated)}")])
    return names


def _first_jsonl_object(path: Path | str) -> dict[str, Any]:
    """The first object of the JSONL file at *path* (blank lines skipped), reading no further."""
    source = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):  # noqa: B007 - lineno is read after the loop
                if line.strip():
                    break
            else:
                raise ScenarioError(source, [("", "empty file: expected one JSON object a line")])
    except FileNotFoundError:
        raise ScenarioError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise ScenarioError(source, [("", "is a directory, expected a JSONL file")]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, [("", f"not UTF-8 text: {exc}")]) from None
    except OSError as exc:
        raise ScenarioError(source, [("", f"cannot read: {exc.strerror or exc}")]) from None
    where = f"line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ScenarioError(source, [(where, f"not valid JSON: {exc.msg} (column {exc.colno})")]) from None
    if not isinstance(obj, dict):
        raise ScenarioError(source, [(where, f"must be a JSON object, got {type(obj).__name__}")])
    missing = [k for k in _MOONCAKE_KEYS if k not in obj]
    if missing:
        raise ScenarioError(source, [(where, f"missing key(s) {', '.join(missing)}; the first object has: {', '.join(map(str, obj)) or '(none)'}")])
    return obj


def _whole(value: Any, low: int) -> bool:
    return _is_int(value) and value >= low


def _replay_header_problems(header: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Problems with the keys of a trace v2 header that the replay reads (``prefix_block_tokens``,
    ``prefix_groups``, ``seed``, ``warm_up_requests``), as :func:`~simpy_llm.workload.traces.trace_rows` would find them."""
    out = []
    if "prefix_block_tokens" in header and not _whole(header["prefix_block_tokens"], 1):
        out.append(("prefix_block_tokens", f"must be a whole number of tokens >= 1, got {header['prefix_block_tokens']!r}"))
    groups = header.get("prefix_groups") or {}
    if not isinstance(groups, Mapping):
        out.append(("prefix_groups", f"must be a mapping of group names to prefix tokens, got {groups!r}"))
    else:
        out += [
            (f"prefix_groups.{group}", f"must be a whole number of tokens >= 0, got {tokens!r}")
            for group, tokens in groups.items()
            if not _whole(tokens, 0)
        ]
    if not _whole(header.get("seed", 0), 0):
        out.append(("seed", f"must be a whole number >= 0, got {header['seed']!r}"))
    if not _whole(header.get("warm_up_requests", 0) or 0, 0):
        out.append(("warm_up_requests", f"must be a whole number >= 0, got {header['warm_up_requests']!r}"))
    return out


def check_trace_files(source: TraceSource) -> TraceFileInfo:
    """Check the file(s) a scenario's :class:`~simpy_llm.config.schema.TraceSource` names
    without reading their rows: each exists and can be read, a CSV's header line has the
    columns its format needs (without duplicates), a Mooncake file's first object has the
    keys every row needs, and a trace v2's YAML header is valid (``trace_version``,
    ``time_unit``, ``mode``, and the keys the replay reads: ``prefix_block_tokens``,
    ``prefix_groups``, ``seed``, ``warm_up_requests``). Replaying at ``send_time_us`` needs
    that column.

    The rows are read, and checked, when the trace is loaded (:func:`load_trace`).

    Returns
    -------
    TraceFileInfo
        The trace v2 header (empty for the other formats) and the fields rows carry.

    Raises
    ------
    ScenarioError
        Naming the file and the line (or header key) of the first problem.

    The last :data:`CHECKED_TRACES_KEPT` results are kept, keyed by the source and its files'
    modification times and sizes: a fit or a sweep builds many simulations of one trace, and
    each checks it.

    Examples
    --------
    >>> from simpy_llm.config.schema import TraceSource
    >>> info = check_trace_files(TraceSource(path="data/azure_llm_2023/AzureLLMInferenceTrace_code.csv", format="azure"))
    >>> sorted(info.fields)
    ['arrival_time_us', 'input_tokens', 'output_tokens']
    >>> check_trace_files(TraceSource(path="data/azure_llm_2023/AzureLLMInferenceTrace_code.csv", format="burstgpt"))
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: data/azure_llm_2023/AzureLLMInferenceTrace_code.csv: 1 problem(s) in trace
      line 1: missing column(s) Timestamp, Request tokens, Response tokens; the header has: TIMESTAMP, ContextTokens, GeneratedTokens
    """
    key = (repr(source), _file_stats(source))
    with _checked_lock:
        kept = _checked.get(key)
        if kept is not None:
            _checked.move_to_end(key)
    if kept is None:
        try:
            kept = _check_trace_files(source)
        except ScenarioError as exc:
            raise ScenarioError(exc.source, exc.problems, "trace") from None
        with _checked_lock:
            _checked[key] = kept
            while len(_checked) > CHECKED_TRACES_KEPT:
                _checked.popitem(last=False)
    return TraceFileInfo(copy.deepcopy(kept.header), kept.fields)


CHECKED_TRACES_KEPT = 64
"""How many results of :func:`check_trace_files` are kept for the next check of the same
source and unchanged files."""

_checked: OrderedDict[tuple[str, tuple[tuple[str, int, int] | None, ...]], TraceFileInfo] = OrderedDict()
_checked_lock = threading.Lock()  # sweeps may build simulations from threads


def _file_stats(source: TraceSource) -> tuple[tuple[str, int, int] | None, ...]:
    """``(path, modification time in ns, size)`` of each file *source* reads (None for one not there)."""
    paths = trace_v2_paths(source.path) if source.format == "trace_v2" else (Path(source.path),)
    out: list[tuple[str, int, int] | None] = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            out.append(None)
        else:
            out.append((str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(out)


def _check_trace_files(source: TraceSource) -> TraceFileInfo:
    fmt = source.format
    if fmt == "mooncake":
        _first_jsonl_object(source.path)
        return TraceFileInfo({}, frozenset(("arrival_time_us", "input_tokens", "output_tokens", "prefix_group", "prefix_blocks")))
    if fmt == "trace_v2":
        header_path, csv_path = trace_v2_paths(source.path)
        header = _read_header(header_path)
        problems = _Problems(header_path)
        for key, message in _replay_header_problems(header):
            problems.add(f"key {key}", message)
        problems.raise_if_any()
        names = _csv_header(csv_path)
        problems = _Problems(csv_path)
        _require_columns(names, _REQUIRED, problems)
        if source.arrival_column == "send_time_us":
            _require_columns(names, ("send_time_us",), problems, " (arrival_column: send_time_us replays the send times)")
        return TraceFileInfo(header, frozenset(c for c in names if c in _KINDS))
    names = _csv_header(source.path)
    problems = _Problems(source.path)
    if fmt == "azure":
        _require_columns(names, _AZURE_COLUMNS, problems)
        return TraceFileInfo({}, frozenset(("arrival_time_us", "input_tokens", "output_tokens")))
    if fmt == "burstgpt":
        _require_columns(names, _BURSTGPT_COLUMNS, problems)
        return TraceFileInfo({}, frozenset(("arrival_time_us", "input_tokens", "output_tokens", "status", "error_message")))
    if fmt == "csv":
        mapping = _column_mapping(names, source.columns, problems)
        return TraceFileInfo({}, frozenset("arrival_time_us" if f in _ARRIVAL_FIELDS else f for f in mapping))
    raise ScenarioError(str(source.path), [("format", f"must be one of trace_v2, azure, mooncake, burstgpt, csv, got {fmt!r}")])


# --------------------------------------------------------------------------- loading


LOADED_TRACES_KEPT = 4
"""How many loaded traces :func:`load_trace` keeps in memory for the next load of the same
source and file contents (0 keeps none)."""

_loaded: OrderedDict[tuple[str, tuple[tuple[str, bytes | None], ...]], Trace] = OrderedDict()
_loaded_lock = threading.Lock()  # sweeps may load from threads


def _file_digests(source: TraceSource) -> tuple[tuple[str, bytes | None], ...]:
    """The contents' digest of each file *source* reads (None for a file that is not there)."""
    paths = trace_v2_paths(source.path) if source.format == "trace_v2" else (Path(source.path),)
    out: list[tuple[str, bytes | None]] = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                out.append((str(path), hashlib.file_digest(f, "blake2b").digest()))
        except OSError:
            out.append((str(path), None))
    return tuple(out)


def _copy_trace(trace: Trace) -> Trace:
    """A copy of *trace* whose header and frame its caller may change (without normalising
    the frame again)."""
    out = object.__new__(Trace)
    object.__setattr__(out, "header", copy.deepcopy(trace.header))
    object.__setattr__(out, "frame", trace.frame.copy())
    return out


def load_trace(source: TraceSource) -> Trace:
    """The trace a scenario's :class:`~simpy_llm.config.schema.TraceSource` names, ready to replay.

    The last :data:`LOADED_TRACES_KEPT` traces loaded stay in memory, keyed by the source and
    the digest of its files' contents: loading the same source again while its files are
    unchanged (a fit replays its trace hundreds of times, a sweep or capacity study once per
    point) copies the kept trace instead of parsing the files again. Each call returns a
    trace of its own.

    1. Read ``source.path`` by ``source.format`` (``trace_v2``: :func:`~simpy_llm.workload.traces.read_trace_v2`,
       ``azure``, ``mooncake``, ``burstgpt``, ``csv``: :func:`~simpy_llm.workload.traces.read_csv_mapped` with
       ``source.columns``).
    2. With ``arrival_column: send_time_us`` (an observed trace), the send times
       become the arrivals and rows never sent are left out: the server saw the
       requests when they were sent, which a lagging client or a closed-loop
       session makes differ from the targets in ``arrival_time_us``.
    3. Order the rows by arrival (stable: ties keep file order) and keep the first
       ``max_requests``.
    4. Scale the arrivals: ``t' = first + round((t - first) * time_scale / rate_scale)``
       microseconds, ``first`` the earliest arrival. ``time_scale`` stretches the gaps,
       ``rate_scale`` divides them: they are inverses (``time_scale: 2`` =
       ``rate_scale: 0.5``), both kept so a scenario can say what it means. Measured
       times (``send_time_us``, ...) are not scaled.
    5. Fill blanks: ``client_id`` with ``source.client_id`` (default: the file's stem),
       ``tenant_id`` with the client id, ``slo_class`` with ``source.slo_class``.

    The header gains ``replay: {format, time_scale, rate_scale, max_requests, arrival_column}``.
    """
    key = (repr(source), _file_digests(source))
    with _loaded_lock:
        kept = _loaded.get(key)
        if kept is not None:
            _loaded.move_to_end(key)
    if kept is None:
        kept = _load_trace(source)
        with _loaded_lock:
            _loaded[key] = kept
            while len(_loaded) > LOADED_TRACES_KEPT:
                _loaded.popitem(last=False)
    return _copy_trace(kept)


def _load_trace(source: TraceSource) -> Trace:
    """:func:`load_trace` without the kept traces."""
    fmt = source.format  # (settings of another format are refused by TraceSource itself)
    readers: dict[str, Callable[[Any], Trace]] = {
        "trace_v2": read_trace_v2,
        "azure": read_azure,
        "mooncake": read_mooncake,
        "burstgpt": read_burstgpt,
        "csv": lambda p: read_csv_mapped(p, source.columns),
    }
    if fmt not in readers:
        raise ScenarioError(str(source.path), [("format", f"must be one of {', '.join(readers)}, got {fmt!r}")])
    trace = readers[fmt](source.path)
    frame = trace.frame
    if source.arrival_column == "send_time_us":
        sent = frame["send_time_us"]
        if len(frame) and not sent.notna().any():  # a generated trace: replaying it would send nothing
            raise ScenarioError(
                str(source.path), [("column send_time_us", "no row has a send time (not an observed trace): replay it at arrival_time_us")], "trace"
            )
        frame = frame[sent.notna()].copy()
        frame["arrival_time_us"] = frame["send_time_us"].astype(np.int64)
    t = frame["arrival_time_us"].to_numpy()
    if len(t) > 1 and not bool(np.all(t[1:] >= t[:-1])):
        frame = frame.iloc[np.argsort(t, kind="stable")]
    if source.max_requests is not None:
        frame = frame.iloc[: source.max_requests]
    frame = frame.reset_index(drop=True).copy()
    if len(frame) and (source.time_scale != 1.0 or source.rate_scale != 1.0):
        t = frame["arrival_time_us"].to_numpy()
        first = int(t.min())
        frame["arrival_time_us"] = first + np.rint((t - first) * source.time_scale / source.rate_scale).astype(np.int64)
    client = source.client_id or _stem(source.path)
    frame["client_id"] = frame["client_id"].where(frame["client_id"] != "", client)
    frame["tenant_id"] = frame["tenant_id"].where(frame["tenant_id"] != "", frame["client_id"])
    frame["slo_class"] = frame["slo_class"].where(frame["slo_class"] != "", source.slo_class)
    replay = {
        "format": fmt,
        "time_scale": source.time_scale,
        "rate_scale": source.rate_scale,
        "max_requests": source.max_requests,
        "arrival_column": source.arrival_column,
    }
    return Trace({**trace.header, "replay": replay}, frame)


SERVER_BLOCK_KEYS: dict[str, str] = {
    "max_num_seqs": "max_num_seqs",
    "block_size": "kv_block_size",
    "max_model_len": "max_model_len",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_prefix_caching": "prefix_caching",
}
"""Keys of a trace header's ``server`` block (seed 000 §7) and the engine settings they
describe, for a vLLM-style block (``type`` vllm, sglang, emulated, other, or none). The
block's other keys (server type, model, tensor parallelism, GPU memory utilisation, ...)
describe the observed server and are not compared."""

LLAMACPP_BLOCK_KEYS: dict[str, str] = {
    "n_parallel": "max_num_seqs",
    "n_batch": "max_num_batched_tokens",
    "ctx_per_slot": "max_model_len",
    "cache_prompt": "prefix_caching",
}
"""The same for a ``type: llamacpp`` block (llama.cpp's own names): slots are the running
batch, the logical batch the tokens of a step, a slot's context the longest request, the
prompt cache prefix caching. llama.cpp clamps ``n_batch`` to the whole context
(``n_ctx``, else ``n_parallel x ctx_per_slot``), and the comparison does too."""


def emulated_server_block(scenario: Any, model: str) -> dict[str, Any]:
    """The ``server`` block describing *scenario*'s serving system as a server serving *model*
    (what ``simpy-llm serve`` reports about itself, and what a simulated observation's header
    holds): ``type: emulated``, ``model``, ``scenario`` (its name), the engine settings under
    vLLM's names (:data:`SERVER_BLOCK_KEYS`, each given when every replica group has the same
    value), ``replicas``, the whole ``serving`` section (as ``scenario_to_dict`` writes it),
    ``seed`` and ``simulation_mode``: with them a scenario rebuilds the serving system exactly.
    """

    groups = scenario.serving.groups()
    out: dict[str, Any] = {"type": "emulated", "model": model, "scenario": scenario.name}
    for key, field in SERVER_BLOCK_KEYS.items():
        values = {getattr(g.engine, field) for g in groups}
        if len(values) == 1:
            out[key] = values.pop()
    out["replicas"] = scenario.serving.num_replicas
    out["serving"] = scenario_to_dict(scenario)["serving"]
    out["seed"] = scenario.seed
    out["simulation_mode"] = scenario.simulation.mode
    return out


def server_block_mismatches(header: Mapping[str, Any], engine: Any) -> list[tuple[str, str]]:
    """``(engine key, message)`` for each setting of the header's ``server`` block that
    differs from *engine* (an :class:`~simpy_llm.config.schema.EngineConfig`): the keys of
    :data:`LLAMACPP_BLOCK_KEYS` for a ``type: llamacpp`` block, of :data:`SERVER_BLOCK_KEYS`
    for any other, and a llama.cpp block's ``kv_unified`` against the engine's
    ``ubatch_split`` (with more than one slot). Keys absent or null in the block are not compared.

    >>> from simpy_llm.config.schema import EngineConfig
    >>> server_block_mismatches({"server": {"max_num_seqs": 4, "block_size": 16}}, EngineConfig())
    [('max_num_seqs', 'the trace was recorded with server.max_num_seqs = 4, the scenario has 256')]
    >>> server_block_mismatches({"server": {"type": "llamacpp", "n_parallel": 4, "cache_prompt": True}}, EngineConfig())
    [('max_num_seqs', 'the trace was recorded with server.n_parallel = 4, the scenario has 256')]
    """
    server = header.get("server") or {}
    if not isinstance(server, Mapping):
        return [("", f"the header's server block must be a mapping, got {server!r}")]
    keys = LLAMACPP_BLOCK_KEYS if server.get("type") == "llamacpp" else SERVER_BLOCK_KEYS
    out = []
    for key, field in keys.items():
        value = server.get(key)
        if value is None:
            continue
        if key == "n_batch":
            value = _effective_n_batch(server, value)
        if value != getattr(engine, field):
            shown = f"{server[key]!r}" if value == server[key] else f"{server[key]!r} (clamped to the context: {value!r})"
            out.append((field, f"the trace was recorded with server.{key} = {shown}, the scenario has {getattr(engine, field)!r}"))
    if server.get("type") == "llamacpp":
        out += _kv_layout_mismatch(server, engine)
    return out


def _kv_layout_mismatch(server: Mapping[str, Any], engine: Any) -> list[tuple[str, str]]:
    """llama.cpp's ``kv_unified`` against the engine's ``ubatch_split``: a KV stream per slot
    cuts a step's passes by slot (docs/model.md, "Passes by slot"); with one slot both ways cut
    alike, so nothing is compared."""
    kv_unified = server.get("kv_unified")
    if kv_unified is None or not _is_int(server.get("n_parallel")) or server["n_parallel"] <= 1:
        return []
    split = "simple" if kv_unified else "by_slot"
    if engine.ubatch_split == split:
        return []
    return [("ubatch_split", f"the trace was recorded with server.kv_unified = {kv_unified!r} (ubatch_split {split!r}), "
                             f"the scenario has ubatch_split {engine.ubatch_split!r}")]


def _effective_n_batch(server: Mapping[str, Any], n_batch: Any) -> Any:
    """llama.cpp's logical batch as it runs: at most the whole context."""
    n_ctx = server.get("n_ctx")
    if n_ctx is None and _is_int(server.get("n_parallel")) and _is_int(server.get("ctx_per_slot")):
        n_ctx = server["n_parallel"] * server["ctx_per_slot"]
    return min(n_batch, n_ctx) if _is_int(n_batch) and _is_int(n_ctx) else n_batch


def _stem(path: Path | str) -> str:
    p = Path(path)
    return p.name if p.is_dir() else p.stem
