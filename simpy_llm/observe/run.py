"""One observed run: a workload spec sent to a server, recorded as a trace v2 (``simpy-llm observe``).

:func:`observe` generates the workload's requests exactly as the simulator
would (same seed, same streams), sends them with the :class:`LoadGenerator`
(open loop at the target times; sessions closed loop with
:class:`~simpy_llm.observe.sessions.Conversations`), and writes to *out*:

``trace.yaml`` / ``trace.csv``
    The trace v2 (``mode: real``), one row per request whatever its fate,
    written as requests end. The header names the server URL, model, API, the
    workload spec and seed, ``warm_up_requests``, the load settings, the
    prefix groups' shared lengths (``prefix_groups``), the server's
    description (``server``, ``hardware``, ``network``:
    :mod:`simpy_llm.observe.server_info`), when scraping, the metrics file, and,
    rewritten when the run ends, the load generator's statistics
    (``load_generator``: :meth:`~simpy_llm.observe.loadgen.LoadGenerator.statistics`
    and the measured round trip).
``metrics.csv``
    With ``scrape_metrics``: the server's Prometheus samples over time
    (:mod:`simpy_llm.observe.scrape`), on the trace's clock.
``sessions.csv``
    With sessions: every session's LLM calls (``rounds``), end reason, times and tool time.
``calls.csv``
    With agentic sessions: every call of every session, with its step, loop iteration,
    instance, request id (LLM calls) or tool, and times.
``summary.json``
    The :class:`~simpy_llm.observe.loadgen.RunSummary` (written at the end), with
    the latency report of :mod:`simpy_llm.observe.report`.

Prompts are synthetic words unless a prompt dataset is given (*prompts*:
:mod:`simpy_llm.observe.prompts`), drawn with the workload's seed and each
request's id, so workloads of different seeds share no prompt; the header's
``prompts`` entry names the source and the token rule that
``approx_input_tokens`` is measured by.

SIGINT (Ctrl-C) stops the run cleanly: requests in flight are cancelled and
written as ``cancelled``, and every file above is complete.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import csv
import json
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from simpy_llm.config.schema import Scenario, WorkloadConfig
from simpy_llm.loading import load_workload_or_scenario, override_spec
from simpy_llm.observe.client import MAX_CONNECTIONS, OpenAIClient, RetryPolicy
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, PREPARE_BYTES, LoadGenerator, RunSummary, load_requests
from simpy_llm.observe.progress import live_progress
from simpy_llm.observe.prompts import DatasetPrompts, PromptSource, SyntheticPrompts, load_prompts
from simpy_llm.observe.runner import run as run_loop
from simpy_llm.observe.scrape import MetricsScraper
from simpy_llm.observe.server_info import ServerConfig, describe_server, load_server_config, resolve_server_type
from simpy_llm.observe.sessions import Conversations, has_sessions
from simpy_llm.observe.workers import ProcessLoadGenerator
from simpy_llm.workload.export import generate_requests
from simpy_llm.workload.sources import spec_workload
from simpy_llm.workload.traces import TraceV2Writer

__all__ = ["CALL_COLUMNS", "SESSION_COLUMNS", "observe"]

SESSION_COLUMNS = ("session_id", "client_id", "rounds", "end_reason", "workflow", "start_s", "end_s", "tool_calls", "tool_wait_s")
"""The columns of ``sessions.csv`` (:meth:`~simpy_llm.observe.sessions.Conversations.ended`)."""
CALL_COLUMNS = (
    "session_id", "client_id", "step_id", "tool", "loop_iteration", "instance", "request_id",
    "start_s", "wait_s", "end_s", "latency_s", "output_tokens", "status",
)
"""The columns of ``calls.csv`` (:meth:`~simpy_llm.observe.sessions.Conversations.calls`)."""
_OWN_HEADER_KEYS = frozenset((
    "trace_version", "time_unit", "created_at", "mode", "server_url", "api", "workload_spec", "overrides", "seed",
    "warm_up_requests", "load", "prompts", "prefix_groups", "metrics_file", "metrics_url", "metrics_interval_s",
    "model", "server", "hardware", "network", "load_generator",
))
"""The trace header keys the observer (and the trace writer) fill: ``observe(header=...)`` may not give them."""


def observe(
    workload: Path | str | Scenario | WorkloadConfig,
    url: str,
    out: Path | str,
    *,
    model: str | None = None,
    api: str = "chat",
    api_key: str | None = None,
    overrides: Sequence[str] = (),
    stream: bool | None = None,
    concurrency: int | None = None,
    timeout_s: float | None = 600.0,
    retries: int = 0,
    ignore_eos: bool = True,
    scrape_metrics: str | None = None,
    scrape_interval_s: float = 1.0,
    loop: str = "auto",
    prompts: Path | str | PromptSource | None = None,
    prompt_field: str | None = None,
    progress: bool = False,
    server_type: str | None = None,
    server_config: Path | str | Mapping[str, Any] | ServerConfig | None = None,
    warm_up_requests: int = 0,
    workers: int = 1,
    max_connections: int | None = MAX_CONNECTIONS,
    prepare_bytes: int = PREPARE_BYTES,
    header: Mapping[str, Any] | None = None,
    watch: Callable[[LoadGenerator], Awaitable[None]] | None = None,
) -> RunSummary:
    """Send the workload *workload* to the server at *url*; write to *out*.

    Parameters
    ----------
    workload
        A YAML file holding a bare workload spec or a scenario (whose ``workload``
        section is used), told apart by content
        (:func:`~simpy_llm.config.load_workload_or_scenario`); or a loaded
        :class:`~simpy_llm.config.schema.Scenario` or
        :class:`~simpy_llm.config.schema.WorkloadConfig`.
    url
        The server's base URL (``http://host:port``, without ``/v1``).
    out
        Directory for ``trace.yaml``, ``trace.csv``, ``summary.json`` (and ``metrics.csv``,
        ``sessions.csv``).
    model
        Model name to request (default: the first of the server's ``/v1/models``).
    api
        ``chat`` (``/v1/chat/completions``) or ``completions`` (``/v1/completions``).
    overrides
        ``dotted.key=value`` changes (as ``simpy-llm run --set``); for a bare workload spec
        the keys are relative to the workload (a leading ``workload.`` is dropped).
    stream
        Force streaming on or off (default: each request's ``streaming``).
    concurrency
        At most this many requests in flight (default: the workload's ``max_concurrency``, else
        an open loop); given beside a workload ``max_concurrency``, the two must agree.
    timeout_s, retries
        Per-attempt limit, and retries of 429/503 answers with exponential backoff.
    ignore_eos
        Ask the server for exactly the requested output length.
    scrape_metrics
        A Prometheus endpoint to scrape every *scrape_interval_s* (``None``: no scraping).
    loop
        ``auto`` (uvloop when installed), ``uvloop`` or ``asyncio``.
    prompts, prompt_field
        A prompt dataset (JSON or JSONL, ShareGPT or records with a text field; see
        :func:`~simpy_llm.observe.prompts.load_prompts`) and the field to read (default: found
        by itself). Each request's text is a dataset prompt fitted to its drawn length, chosen
        with the workload's seed. ``None``: synthetic words. A
        :class:`~simpy_llm.observe.prompts.PromptSource` is used as it is (the header's
        ``prompts`` then says ``source: custom`` and its token rule).
    progress
        Show a live progress line on standard error (``rich``) while the run goes.
    server_type
        ``vllm``, ``sglang``, ``llamacpp``, ``emulated``, ``tgi`` or ``other`` (default: the server
        config's ``server.type``, else ``other``): which settings the header's ``server``
        block holds and how they are discovered (:mod:`simpy_llm.observe.server_info`).
    server_config
        A YAML file (or a mapping) with optional ``server``, ``hardware`` and ``network``
        mappings; its values override discovered ones.
    warm_up_requests
        Written to the header: the first this many requests (in request-id order) are
        left out of calibration. They are sent and recorded like the others.
    workers
        Processes that send (default 1: this process's event loop). More spread the schedule
        over worker processes (:mod:`simpy_llm.observe.workers`); a concurrency limit is then
        split across them, and a workload with closed-loop sessions is refused.
    max_connections
        Connections each sending process keeps open at most (default
        :data:`~simpy_llm.observe.client.MAX_CONNECTIONS`; ``None``: no cap). A request
        beyond it waits for one, and the wait counts in its schedule delay.
    prepare_bytes
        Request bodies built ahead, in bytes, for each sending process (default
        :data:`~simpy_llm.observe.loadgen.PREPARE_BYTES`): as many as it holds are built before
        the clock starts, the rest while the run goes, which costs the sending process CPU at
        high rates (``docs/observe.md``, "Speed").
    header
        More keys for the trace header (written with the others, before the first request);
        a key the observer writes itself is an error.
    watch
        A coroutine function run beside the load generator from its start (given it), e.g. to
        call :meth:`~simpy_llm.observe.loadgen.LoadGenerator.stop` on a stop criterion; it is
        cancelled when the run ends.

    Raises
    ------
    ScenarioError
        The workload file or the server config is bad.
    ValueError
        An unknown *server_type*; a *warm_up_requests* that is not a whole number >= 0; a
        *workers* that is not a whole number >= 1, above *concurrency*, or above 1 with sessions;
        a *concurrency* other than the workload's ``max_concurrency``; a *header* key the
        observer writes itself; or *watch* with more than one worker.
    PromptDatasetError
        The prompt dataset cannot be used (raised before anything is sent).
    """
    if isinstance(warm_up_requests, bool) or not isinstance(warm_up_requests, int) or warm_up_requests < 0:
        raise ValueError(f"warm_up_requests must be a whole number >= 0, got {warm_up_requests!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a whole number >= 1, got {workers!r}")
    if concurrency is not None and workers > concurrency:  # before anything is read: the options alone say so
        raise ValueError(f"workers ({workers}) must not exceed concurrency ({concurrency}): each worker needs a slot")
    if watch is not None and workers > 1:
        raise ValueError("watch reads the generator of one process: give workers=1 with it")
    if clash := sorted(set(header or {}) & _OWN_HEADER_KEYS):
        raise ValueError(f"header keys {', '.join(clash)} are written by the observer itself")
    server_cfg = load_server_config(server_config)
    kind = resolve_server_type(server_type, server_cfg)
    if isinstance(workload, (Scenario, WorkloadConfig)):
        spec = override_spec(workload, list(overrides)) if overrides else workload
        spec_file = workload.loaded_from if isinstance(workload, Scenario) else None
    else:
        spec = load_workload_or_scenario(workload, list(overrides))
        spec_file = str(workload)
    wl, seed = spec_workload(spec)
    if wl.max_concurrency is not None:
        if concurrency is not None and concurrency != wl.max_concurrency:
            raise ValueError(f"concurrency {concurrency} differs from the workload's max_concurrency {wl.max_concurrency}: give one")
        concurrency = wl.max_concurrency
        if workers > concurrency:
            raise ValueError(f"workers ({workers}) must not exceed the workload's max_concurrency ({concurrency}): each worker needs a slot")
    source: PromptSource
    prompts_header: dict[str, Any]
    if prompts is not None and not isinstance(prompts, (str, Path)):
        source = prompts
        prompts_header = {"source": "custom"}
    elif prompts is not None:
        dataset = load_prompts(prompts, prompt_field)
        source = DatasetPrompts(dataset, seed=seed)
        prompts_header = {
            "source": "dataset",
            "file": dataset.path,
            "field": dataset.field,
            "prompts": len(dataset.prompts),
            "skipped": dataset.skipped,
        }
    else:
        source = SyntheticPrompts(seed=seed)
        prompts_header = {"source": "synthetic"}
    prompts_header["token_rule"] = source.token_rule
    requests = load_requests(generate_requests(spec))
    conversations = Conversations(spec, requests, prompts=source) if has_sessions(spec) else None
    if conversations is not None and workers > 1:
        raise ValueError(
            f"workers={workers}: the workload's clients open closed-loop sessions, which one process runs "
            "(their later calls share request ids and tool slots); use workers=1"
        )
    prefixes = {c.prefix_group: c.prefix_length for c in wl.clients if c.prefix_group}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    header_: dict[str, Any] = {
        "mode": "real",
        "server_url": url,
        "api": api,
        "workload_spec": spec_file,
        "overrides": list(overrides),
        "seed": seed,
        "warm_up_requests": warm_up_requests,
        "load": {
            "stream": stream,
            "concurrency": concurrency,
            "timeout_s": timeout_s,
            "retries": retries,
            "ignore_eos": ignore_eos,
            "closed_loop_sessions": conversations is not None,
            "workers": workers,
            "max_connections": max_connections,
            "prepare_bytes": prepare_bytes,
        },
        "prompts": prompts_header,
        "prefix_groups": prefixes,
    }
    if scrape_metrics:
        header_["metrics_file"] = "metrics.csv"
        header_["metrics_url"] = scrape_metrics
        header_["metrics_interval_s"] = scrape_interval_s
    header_.update(header or {})

    async def main() -> RunSummary:
        retry = RetryPolicy(max_retries=retries)
        async with OpenAIClient(
            url, api_key=api_key, model=model, timeout_s=timeout_s, retry=retry, max_connections=max_connections
        ) as client:
            header_["model"] = await client.default_model()
            # The server's description, discovered and measured before the first request is sent.
            header_.update(
                await describe_server(
                    client, server_type=kind, config=server_cfg, model=header_["model"], model_discovered=model is None
                )
            )
            with TraceV2Writer(out / "trace", header=header_, extra_columns=OBSERVER_COLUMNS) as writer:
                gen: LoadGenerator | ProcessLoadGenerator
                if workers > 1:
                    gen = ProcessLoadGenerator(
                        client,
                        requests,
                        writer,
                        workers=workers,
                        endpoint=api,
                        stream=stream,
                        concurrency=concurrency,
                        ignore_eos=ignore_eos,
                        prefixes=prefixes,
                        prompts=source,
                        loop=loop,
                        prepare_bytes=prepare_bytes,
                    )
                else:
                    gen = LoadGenerator(
                        client,
                        requests,
                        writer,
                        endpoint=api,
                        stream=stream,
                        concurrency=concurrency,
                        ignore_eos=ignore_eos,
                        prefixes=prefixes,
                        conversations=conversations,
                        prompts=source,
                        prepare_bytes=prepare_bytes,
                    )
                scraper = None
                if scrape_metrics:
                    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
                    scraper = MetricsScraper(
                        scrape_metrics, out / "metrics.csv", interval_s=scrape_interval_s, clock=client.now, headers=headers
                    )
                loop_ = asyncio.get_running_loop()
                # Ctrl-C stops sending and keeps what was recorded; signal handlers belong to the
                # main thread (off it, a running kernel's loop was there first: see below).
                on_main = threading.current_thread() is threading.main_thread()
                if on_main:
                    loop_.add_signal_handler(signal.SIGINT, gen.stop)
                progress_task: asyncio.Task[None] | None = None
                watch_task: asyncio.Task[None] | None = None
                try:
                    # The generator resets the client's clock when it starts; the scraper reads
                    # the same clock, so it starts after the first await of the run.
                    run_task = asyncio.create_task(gen.run())
                    if isinstance(gen, ProcessLoadGenerator):  # its clock is set once the workers are ready
                        await gen.wait_started(run_task)
                    else:
                        await asyncio.sleep(0)
                    scrape_task = asyncio.create_task(scraper.run()) if scraper is not None else None
                    if watch is not None and isinstance(gen, LoadGenerator):  # workers=1 (checked above)
                        watch_task = asyncio.create_task(_awaited(watch(gen)))
                    if progress:
                        from rich.console import Console

                        progress_task = asyncio.create_task(
                            live_progress(gen.live, lambda: len(gen.requests), Console(file=sys.stderr))
                        )
                    summary = await run_task
                    # Known only now: how the run kept its schedule, beside what it measured.
                    network = header_.get("network") or {}
                    writer.update_header(
                        {"load_generator": {**gen.statistics(), "measured_rtt_ms": network.get("measured_rtt_ms")}}
                    )
                finally:
                    if on_main:
                        loop_.remove_signal_handler(signal.SIGINT)
                    for task in (progress_task, watch_task):
                        if task is not None:
                            task.cancel()
                            await asyncio.gather(task, return_exceptions=True)
                    if scraper is not None and scrape_task is not None:
                        scraper.stop()
                        await scrape_task
        return summary

    if _loop_running():
        # Called from a running event loop (a Jupyter kernel's): the run gets a thread and a
        # loop of its own, and this call waits for it.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="observe") as pool:
            summary = pool.submit(run_loop, main(), loop=loop).result()
    else:
        summary = run_loop(main(), loop=loop)
    if conversations is not None:
        _write_csv(out / "sessions.csv", conversations.ended(), SESSION_COLUMNS)
        if conversations.agentic:
            _write_csv(out / "calls.csv", conversations.calls(), CALL_COLUMNS)
    (out / "summary.json").write_text(json.dumps(attrs.asdict(summary), indent=2, default=str) + "\n", encoding="utf-8")
    return summary


async def _awaited(awaitable: Awaitable[None]) -> None:
    await awaitable


def _loop_running() -> bool:
    """Whether this thread is running an event loop (as a Jupyter kernel's main thread is)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
