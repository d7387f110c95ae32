"""``simpy-llm bench run``: a benchmark profile against a server, each run an observed trace.

:func:`bench` draws the dataset's requests once, then for every run of the profile
(:mod:`simpy_llm.observe.bench.profiles`) writes them as a bare workload spec replaying a
trace (``DIR/rate_<k>/workload.yaml`` and ``requests.yaml`` / ``requests.csv``: the target
times of that run and the lengths), sends it with the observer
(:func:`simpy_llm.observe.run.observe`: the same ``trace.yaml`` / ``trace.csv`` and
``summary.json`` as ``simpy-llm observe``), and computes vLLM's metrics from the trace
(:mod:`simpy_llm.observe.bench.metrics`). ``DIR/bench.json`` and ``DIR/bench.csv`` hold one
row per run.
"""

from __future__ import annotations

import asyncio
import csv
import itertools
import json
import math
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from simpy_llm.observe.bench.datasets import BenchRequest, dataset_requests
from simpy_llm.observe.bench.metrics import DEFAULT_PERCENTILES, bench_metrics, read_rows
from simpy_llm.observe.bench.profiles import (
    FIXED_PROFILES,
    PROFILES,
    RunPlan,
    SweepRangeWarning,
    arrival_times,
    fixed_plans,
    sweep_rates,
)
from simpy_llm.observe.bench.tokens import TokenCounter, token_counter
from simpy_llm.observe.client import MAX_CONNECTIONS, ObservedRequest
from simpy_llm.observe.loadgen import PREPARE_BYTES, LoadGenerator, ScheduleLagWarning
from simpy_llm.observe.prompts import synthetic_prompt
from simpy_llm.observe.run import observe
from simpy_llm.workload.traces import TraceV2Writer

__all__ = [
    "ERROR_WINDOW",
    "POLL_S",
    "BenchPrompts",
    "StopCriteria",
    "bench",
    "check_options",
    "run_profile",
    "write_bench_results",
    "write_run_workload",
]

ERROR_WINDOW = 20
"""Requests over which ``--max-error-rate`` is judged: the last this many ended (fewer while fewer have)."""
POLL_S = 0.05
"""How often the stop criteria are looked at, seconds."""


class BenchPrompts:
    """The prompt source of a benchmark run: request *i* sends ``requests[i].prompt`` as it is.

    Its token rule is the run's token counter (:attr:`token_rule` is its name); the lengths of
    the texts it sends are those counted when the dataset was drawn.

    >>> from simpy_llm.observe.bench.tokens import WordCounter
    >>> p = BenchPrompts([BenchRequest("a b c", 3, 2)], WordCounter())
    >>> p.text(99, request_id=0), p.count("a b c"), p.token_rule
    ('a b c', 3, 'words')
    """

    def __init__(self, requests: Sequence[BenchRequest], counter: TokenCounter) -> None:
        self.requests = list(requests)
        self.counter = counter
        self._lengths = {r.prompt: r.input_len for r in self.requests}

    @property
    def token_rule(self) -> str:
        """The token counter's name."""
        return self.counter.name

    def text(self, n_tokens: int, request_id: int) -> str:
        """Request *request_id*'s prompt (its length is the dataset's: *n_tokens* is that length)."""
        return self.requests[request_id].prompt

    def prefix(self, group: str, n_tokens: int) -> str:
        """Synthetic words: a benchmark's requests have no prefix group, so this is never asked."""
        return synthetic_prompt(n_tokens, seed=f"bench/prefix/{group}")

    def count(self, text: str) -> int:
        """The counted length of a dataset prompt, else the counter's count."""
        n = self._lengths.get(text)
        return self.counter.count(text) if n is None else n


@attrs.frozen
class StopCriteria:
    """When a run stops before its last request: after *max_seconds*, or when more than
    *max_error_rate* of the last :data:`ERROR_WINDOW` ended requests failed (``error`` or
    ``timeout``). Requests in flight then are cancelled (written ``cancelled``)."""

    max_seconds: float | None = None
    max_error_rate: float | None = None

    async def watch(self, gen: LoadGenerator, reason: list[str]) -> None:
        """Stop *gen* on the first criterion met; append its name to *reason*."""
        if self.max_seconds is None and self.max_error_rate is None:
            return
        window = _EndedWindow(gen)
        while True:
            now = gen.client.now()
            if self.max_seconds is not None and now >= self.max_seconds:
                reason.append("max_seconds")
                gen.stop()
                return
            if self.max_error_rate is not None and window.error_share() > self.max_error_rate:
                reason.append("max_error_rate")
                gen.stop()
                return
            wait = POLL_S if self.max_seconds is None else min(POLL_S, max(self.max_seconds - now, 0.0))
            await asyncio.sleep(wait)


class _EndedWindow:
    """The statuses of the last :data:`ERROR_WINDOW` requests of a run to end, in the order of
    their ends, kept up to date by looking only at requests still in flight and new ones (a
    poll costs what is in flight, not the whole run)."""

    def __init__(self, gen: LoadGenerator) -> None:
        self.gen = gen
        self.seen = 0
        self.pending: dict[int, ObservedRequest] = {}
        self.last: deque[bool] = deque(maxlen=ERROR_WINDOW)

    def error_share(self) -> float:
        """The share of failed (``error`` or ``timeout``) among the window's requests (0 for none)."""
        records = self.gen.records
        if len(records) > self.seen:
            # Records are kept in the order they were made; skip to the new ones.
            for rec in itertools.islice(records.values(), self.seen, None):
                self.pending[id(rec)] = rec
            self.seen = len(records)
        ended = [rec for rec in self.pending.values() if rec.status in ("ok", "error", "timeout") and rec.done_s is not None]
        for rec in ended:
            del self.pending[id(rec)]
        for rec in sorted(ended, key=lambda r: r.done_s or 0.0):
            self.last.append(rec.status != "ok")
        return sum(self.last) / len(self.last) if self.last else 0.0


def write_run_workload(run_dir: Path, plan: RunPlan, requests: Sequence[BenchRequest], seed: int) -> Path:
    """Write the run's bare workload spec into *run_dir* and return its path: a trace of its
    requests at their target times (``requests.yaml`` / ``requests.csv``) and, for a run with
    a cap on requests in flight, ``max_concurrency``. The observer sends it, and the simulator
    runs the same file (``simpy-llm bench predict``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    times = arrival_times(plan, len(requests), seed)
    header = {"mode": "generated", "bench": {"strategy": plan.strategy, "rate": _rate_value(plan.rate)}}
    with TraceV2Writer(run_dir / "requests", header=header) as writer:
        for i, (req, t) in enumerate(zip(requests, times, strict=True)):
            writer.write_row(
                {"request_id": i, "client_id": "bench", "arrival_time_us": round(t * 1e6),
                 "input_tokens": req.input_len, "output_tokens": req.output_len, "streaming": True}
            )
    spec: dict[str, Any] = {"version": "1", "seed": seed, "traces": [{"path": "requests.csv"}]}
    if plan.concurrency is not None:
        spec["max_concurrency"] = plan.concurrency
    path = run_dir / "workload.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_profile(
    profile: str,
    request_rates: Sequence[float],
    max_concurrency: Sequence[int],
    rates: int | None,
    sweep_arrivals: str | None,
    one: Callable[[RunPlan], Mapping[str, Any]],
) -> None:
    """Make the runs of *profile* (:mod:`~simpy_llm.observe.bench.profiles`), each by calling
    *one* with its plan, which returns the run's row (its metrics); a sweep places its rates
    from the rows of its synchronous and throughput runs. The measured benchmark and the
    predicted one (``simpy-llm bench predict``) share this order of runs.

    Raises
    ------
    ValueError
        A sweep whose synchronous or throughput run completed no request.
    """
    if profile != "sweep":
        for plan in fixed_plans(profile, request_rates, max_concurrency):
            one(plan)
        return
    sync = one(RunPlan("synchronous", concurrency=1))
    limit = max_concurrency[0] if max_concurrency else None
    thr = one(RunPlan("throughput", concurrency=limit))
    low, high = sync["request_throughput"], thr["request_throughput"]
    if not (low > 0 and high > 0):
        raise ValueError("sweep: the synchronous or the throughput run completed no request; no rate to sweep (see bench.json)")
    if high <= low:
        warnings.warn(
            f"sweep: the throughput run ({high:.4g} requests/s) was no faster than the synchronous run ({low:.4g}/s): "
            "the server gains nothing from running requests together here, so no rate lies below its saturation "
            "rate and above the synchronous one; the sweep's rates run from one to the other all the same",
            SweepRangeWarning,
            stacklevel=2,
        )
    for rate in sweep_rates(low, high, 5 if rates is None else rates):
        one(RunPlan(sweep_arrivals or "constant", rate=rate, concurrency=limit))


def _rate_value(rate: float) -> float | str:
    """A rate as vLLM's JSON writes it (``"inf"`` for all at once)."""
    return "inf" if math.isinf(rate) else rate


def bench(
    url: str,
    out: Path | str,
    *,
    dataset: str = "random",
    num_prompts: int = 1000,
    profile: str = "poisson",
    request_rates: Sequence[float] = (math.inf,),
    max_concurrency: Sequence[int] = (),
    rates: int | None = None,
    sweep_arrivals: str | None = None,
    max_seconds: float | None = None,
    max_error_rate: float | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput: Mapping[str, float] | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    range_ratio: float = 0.0,
    prompt_field: str | None = None,
    tokenizer: Path | str | None = None,
    seed: int = 0,
    model: str | None = None,
    api: str = "completions",
    api_key: str | None = None,
    timeout_s: float | None = 600.0,
    ignore_eos: bool = False,
    server_type: str | None = None,
    server_config: Path | str | Mapping[str, Any] | None = None,
    loop: str = "auto",
    max_connections: int | None = MAX_CONNECTIONS,
    prepare_bytes: int = PREPARE_BYTES,
) -> dict[str, Any]:
    """Run benchmark *profile* against the server at *url*; write to *out*; return ``bench.json``'s content.

    Parameters
    ----------
    dataset
        ``sharegpt``, ``random``, ``synthetic`` or a file
        (:func:`~simpy_llm.observe.bench.datasets.dataset_requests`); ``random`` and
        ``synthetic`` take *input_len* and *output_len* (default 1024 and 128, as vLLM's random).
    num_prompts
        Requests per run.
    profile, request_rates, max_concurrency, rates, sweep_arrivals
        The runs (:mod:`simpy_llm.observe.bench.profiles`); *rates* (default 5) and
        *sweep_arrivals* (default ``constant``) are for ``sweep`` only.
    max_seconds, max_error_rate
        Stop criteria of each run (:class:`StopCriteria`).
    percentiles, goodput
        What the metrics report (:func:`~simpy_llm.observe.bench.metrics.bench_metrics`).
    tokenizer
        A ``tokenizers`` file to count tokens with (default: the server's ``/tokenize``, else
        words with a warning; :func:`~simpy_llm.observe.bench.tokens.token_counter`).
    seed
        Draws the dataset, the lengths and the Poisson gaps.
    model, api, api_key, timeout_s, ignore_eos, server_type, server_config, loop, max_connections, prepare_bytes
        As :func:`~simpy_llm.observe.run.observe` takes them (here *api* defaults to
        ``completions`` and *ignore_eos* to false, as ``vllm bench serve``).

    Raises
    ------
    ValueError
        An option that does not fit the profile or the dataset (the message names it).
    PromptDatasetError
        The dataset cannot be used.
    """
    check_options(profile, request_rates, max_concurrency, rates, sweep_arrivals, max_seconds, max_error_rate, num_prompts)
    if dataset in ("random", "synthetic"):
        input_len = 1024 if input_len is None else input_len
        output_len = 128 if output_len is None else output_len
    counter = token_counter(url, tokenizer, model=model, api_key=api_key)
    requests = dataset_requests(
        dataset, num_prompts, counter, seed=seed, input_len=input_len, output_len=output_len,
        range_ratio=range_ratio, prompt_field=prompt_field,
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stop = StopCriteria(max_seconds, max_error_rate)
    result: dict[str, Any] = {
        "profile": profile,
        "dataset": dataset,
        "num_prompts": len(requests),
        "token_counting": counter.name,
        "percentiles": list(percentiles),
        "goodput": dict(goodput or {}),
        "max_seconds": max_seconds,
        "max_error_rate": max_error_rate,
        "runs": [],
    }

    def one(plan: RunPlan) -> dict[str, Any]:
        k = len(result["runs"])
        run_dir = out / f"rate_{k}"
        spec = write_run_workload(run_dir, plan, requests, seed)
        reason: list[str] = []
        with warnings.catch_warnings():
            if plan.strategy not in ("constant", "poisson") or math.isinf(plan.rate):
                # Every request is due at 0 and waits for a free slot: the lag the load
                # generator measures is that wait, the profile's own doing, not the client's.
                warnings.simplefilter("ignore", ScheduleLagWarning)
            summary = observe(
                spec, url, run_dir, model=model, api=api, api_key=api_key, stream=True,
                timeout_s=timeout_s, ignore_eos=ignore_eos, loop=loop, max_connections=max_connections,
                prepare_bytes=prepare_bytes, prompts=BenchPrompts(requests, counter), server_type=server_type, server_config=server_config,
                header={
                    "token_counting": counter.name,
                    "bench": {"profile": profile, "run": k, "strategy": plan.strategy, "request_rate": _rate_value(plan.rate),
                              "max_concurrency": plan.concurrency, "dataset": dataset},
                },
                watch=lambda gen: stop.watch(gen, reason),
            )
        row = {
            "run": k,
            "dir": run_dir.name,
            "strategy": plan.strategy,
            "request_rate": _rate_value(plan.rate),
            "max_concurrency": plan.concurrency,
            "stop_reason": reason[0] if reason else ("stopped" if summary.stopped else None),
            "achieved_send_rate": summary.achieved_rate,
            **bench_metrics(read_rows(run_dir), percentiles=percentiles, goodput=goodput),
        }
        result["runs"].append(row)
        return row

    try:
        run_profile(profile, request_rates, max_concurrency, rates, sweep_arrivals, one)
    finally:  # what was measured is kept, whatever stopped the benchmark
        write_bench_results(out, result)
    return result


def check_options(
    profile: str,
    request_rates: Sequence[float],
    max_concurrency: Sequence[int],
    rates: int | None,
    sweep_arrivals: str | None,
    max_seconds: float | None,
    max_error_rate: float | None,
    num_prompts: int,
) -> None:
    """Refuse options that do not fit *profile* (before anything is sent)."""
    if profile not in PROFILES:
        raise ValueError(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {num_prompts}")
    if any(not r > 0 for r in request_rates):
        raise ValueError(f"--request-rate values must be > 0 (inf: all at once), got {list(request_rates)}")
    if any(c < 1 for c in max_concurrency):
        raise ValueError(f"--max-concurrency values must be at least 1, got {list(max_concurrency)}")
    if profile not in ("constant", "poisson") and tuple(request_rates) != (math.inf,):
        raise ValueError(f"--request-rate is for --profile constant or poisson, not {profile}")
    if profile == "synchronous" and max_concurrency:
        raise ValueError("--max-concurrency does not apply to --profile synchronous (one request at a time)")
    if profile == "concurrency" and not max_concurrency:
        raise ValueError("--profile concurrency needs --max-concurrency N [N ...]")
    if profile != "concurrency" and len(max_concurrency) > 1:
        raise ValueError(f"several --max-concurrency values make a sweep of --profile concurrency, not {profile}")
    if profile in FIXED_PROFILES and (rates is not None or sweep_arrivals is not None):
        raise ValueError("--rates and --sweep-arrivals are for --profile sweep")
    if rates is not None and rates < 1:
        raise ValueError(f"--rates must be at least 1, got {rates}")
    if sweep_arrivals not in (None, "constant", "poisson"):
        raise ValueError(f"--sweep-arrivals must be constant or poisson, got {sweep_arrivals!r}")
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"--max-seconds must be > 0, got {max_seconds}")
    if max_error_rate is not None and not 0 <= max_error_rate < 1:
        raise ValueError(f"--max-error-rate must be in [0, 1), got {max_error_rate}")


_CSV_SKIP = ("errors",)


def write_bench_results(out: Path, result: Mapping[str, Any]) -> None:
    """Write *result* (``bench.json``'s content) as ``out/bench.json`` and its runs as ``out/bench.csv``."""
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    runs = result["runs"]
    if not runs:
        return
    columns = [c for c in runs[0] if c not in _CSV_SKIP] + ["errors"]
    with (out / "bench.csv").open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        for row in runs:
            w.writerow({**row, "errors": " ".join(f"{k}:{v}" for k, v in row["errors"].items())})
