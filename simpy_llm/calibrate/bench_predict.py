"""A benchmark predicted before it is run, and scored against it once it has been.

``simpy-llm bench run`` (:mod:`simpy_llm.observe.bench`) writes every run of a profile as a
bare workload spec, a trace of its requests at their target times with the run's cap on
requests in flight (``workload.max_concurrency``), and sends that file to the server. Here
the simulator runs the same kind of file on a scenario's serving system, and writes what an
observer would have recorded (:func:`~simpy_llm.calibrate.synthetic.simulated_observation`),
so a predicted run and a measured one are read by the same metrics code:

* :func:`predict_bench` makes a profile's runs in the order a benchmark makes them (a
  sweep's rates come from its *predicted* synchronous and throughput runs), from the same
  dataset draws, and writes ``bench.json`` / ``bench.csv`` as ``bench run`` does;
* :func:`predict_measured` runs each measured run's own ``workload.yaml`` (the very requests
  and target times that were sent), and :func:`bench_errors` scores the prediction run by
  run: the relative error of p50 and p99 TTFT and E2E, and of the saturation rate (the
  throughput run's achieved request rate).

Token counts: a ``random`` or ``synthetic`` dataset's requests have the lengths asked for,
whatever counts them; a prompt file's are counted with *tokenizer* when given, else one token
per word (warned: the server's ``/tokenize``, which ``bench run`` prefers, is not there yet).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpy_llm.calibrate.synthetic import simulated_observation
from simpy_llm.config import Scenario
from simpy_llm.loading import replace_scenario
from simpy_llm.observe.bench.datasets import dataset_requests
from simpy_llm.observe.bench.metrics import DEFAULT_PERCENTILES, bench_metrics, read_rows
from simpy_llm.observe.bench.profiles import RunPlan
from simpy_llm.observe.bench.run import check_options, run_profile, write_bench_results, write_run_workload
from simpy_llm.observe.bench.tokens import FileTokenizer, TokenCounter, TokenCountWarning, WordCounter

__all__ = ["COMPARED_METRICS", "bench_errors", "predict_bench", "predict_measured", "simulate_run"]

COMPARED_METRICS = ("median_ttft_ms", "p99_ttft_ms", "median_e2el_ms", "p99_e2el_ms")
"""The figures of a run whose prediction is scored, run by run."""


def simulate_run(scenario: Scenario, workload_spec: Path | str, run_dir: Path | str) -> Path:
    """Simulate *scenario*'s serving system under the bare workload spec *workload_spec* (a
    benchmark run's ``workload.yaml``) and write the run as an observed trace into *run_dir*
    (``trace.yaml`` / ``trace.csv``); returns the CSV's path.

    Everything but the workload (serving, seed) is the scenario's; the run goes to its end
    (``simulation.until_s`` is cleared). A benchmark's requests are all of SLO class
    ``default`` and its goodput is judged by ``--goodput``: the scenario's other SLO classes are
    left out, and its ``default`` class, if any, kept.
    """
    changes: dict[str, Any] = {"workload": {"file": str(Path(workload_spec).resolve())}, "simulation.until_s": None}
    if "default" not in scenario.slo:
        changes["slo"] = {}
    predicted = replace_scenario(scenario, changes)
    _, csv_path = simulated_observation(predicted, Path(run_dir) / "trace")
    return csv_path


def _counter(dataset: str, tokenizer: Path | str | None) -> TokenCounter:
    if tokenizer is not None:
        return FileTokenizer(tokenizer)
    if dataset not in ("random", "synthetic"):
        warnings.warn(
            f"--dataset {dataset}: no --tokenizer given, so its prompts are counted one token per word "
            "(token_counting: words); the server's own count may differ",
            TokenCountWarning,
            stacklevel=3,
        )
    return WordCounter()


def predict_bench(
    scenario: Scenario,
    out: Path | str,
    *,
    dataset: str = "random",
    num_prompts: int = 1000,
    profile: str = "poisson",
    request_rates: Sequence[float] = (math.inf,),
    max_concurrency: Sequence[int] = (),
    rates: int | None = None,
    sweep_arrivals: str | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput: Mapping[str, float] | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    range_ratio: float = 0.0,
    prompt_field: str | None = None,
    tokenizer: Path | str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The benchmark ``simpy-llm bench run`` would make with these options, predicted on
    *scenario*'s serving system; writes each run under *out* (``rate_<k>/``: its workload, and
    the simulated trace) and ``bench.json`` / ``bench.csv``; returns ``bench.json``'s content
    (``predicted: true`` and the scenario's name beside what ``bench run`` writes).

    The options are :func:`~simpy_llm.observe.bench.run.bench`'s, with its defaults (a
    ``random`` or ``synthetic`` dataset's lengths default to 1024 and 128). There are no stop
    criteria: a simulated run always ends.

    Examples
    --------
    >>> import tempfile
    >>> from simpy_llm import load_scenario
    >>> with tempfile.TemporaryDirectory() as out:
    ...     result = predict_bench(load_scenario("scenarios/quickstart.yaml"), out, num_prompts=20,
    ...                            profile="sweep", rates=2, input_len=200, output_len=50)
    >>> [(r["strategy"], r["completed"]) for r in result["runs"]]
    [('synchronous', 20), ('throughput', 20), ('constant', 20), ('constant', 20)]
    >>> result["runs"][1]["request_throughput"] > result["runs"][0]["request_throughput"]
    True
    """
    check_options(profile, request_rates, max_concurrency, rates, sweep_arrivals, None, None, num_prompts)
    if dataset in ("random", "synthetic"):
        input_len = 1024 if input_len is None else input_len
        output_len = 128 if output_len is None else output_len
    counter = _counter(dataset, tokenizer)
    requests = dataset_requests(
        dataset, num_prompts, counter, seed=seed, input_len=input_len, output_len=output_len,
        range_ratio=range_ratio, prompt_field=prompt_field,
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "predicted": True,
        "scenario": scenario.name,
        "profile": profile,
        "dataset": dataset,
        "num_prompts": len(requests),
        "token_counting": counter.name,
        "percentiles": list(percentiles),
        "goodput": dict(goodput or {}),
        "runs": [],
    }

    def one(plan: RunPlan) -> dict[str, Any]:
        k = len(result["runs"])
        run_dir = out / f"rate_{k}"
        csv_path = simulate_run(scenario, write_run_workload(run_dir, plan, requests, seed), run_dir)
        row = {
            "run": k, "dir": run_dir.name, "strategy": plan.strategy,
            "request_rate": "inf" if math.isinf(plan.rate) else plan.rate, "max_concurrency": plan.concurrency,
            **bench_metrics(read_rows(csv_path), percentiles=percentiles, goodput=goodput),
        }
        result["runs"].append(row)
        return row

    try:
        run_profile(profile, request_rates, max_concurrency, rates, sweep_arrivals, one)
    finally:
        write_bench_results(out, result)
    return result


def predict_measured(
    scenario: Scenario,
    measured: Path | str | Mapping[str, Any],
    out: Path | str,
    *,
    percentiles: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Predict every run of the measured benchmark *measured* (its directory, or its
    ``bench.json`` content with ``directory`` set) by simulating the run's own ``workload.yaml``
    on *scenario*'s serving system; writes ``out/rate_<k>/`` and ``bench.json`` / ``bench.csv``
    as :func:`predict_bench` does; returns that content. The percentiles are the measured
    benchmark's unless given.
    """
    import json

    if isinstance(measured, Mapping):
        result_m, directory = measured, Path(measured["directory"])
    else:
        directory = Path(measured)
        result_m = json.loads((directory / "bench.json").read_text(encoding="utf-8"))
    percentiles = tuple(result_m.get("percentiles") or DEFAULT_PERCENTILES) if percentiles is None else tuple(percentiles)
    goodput = result_m.get("goodput") or None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "predicted": True, "scenario": scenario.name, "measured": str(directory),
        **{k: result_m[k] for k in ("profile", "dataset", "num_prompts", "token_counting") if k in result_m},
        "percentiles": list(percentiles), "goodput": dict(goodput or {}), "runs": [],
    }
    for row_m in result_m["runs"]:
        run_dir = out / row_m["dir"]
        csv_path = simulate_run(scenario, directory / row_m["dir"] / "workload.yaml", run_dir)
        result["runs"].append({
            **{k: row_m[k] for k in ("run", "dir", "strategy", "request_rate", "max_concurrency")},
            **bench_metrics(read_rows(csv_path), percentiles=percentiles, goodput=goodput),
        })
    write_bench_results(out, result)
    return result


def bench_errors(measured: Sequence[Mapping[str, Any]], predicted: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How far each predicted run is from the measured one (the two lists of runs pair run by
    run, as :func:`predict_measured` makes them).

    Returns ``runs`` (per run: its strategy and target rate, the measured request rate, and
    for each of :data:`COMPARED_METRICS` the relative error ``(predicted - measured) /
    measured``), ``saturation`` (the throughput run's measured and predicted request rates and
    their relative error; None without a throughput run) and ``mape`` (per metric, the mean
    absolute relative error over the runs *below saturation*: those at a finite target rate
    under the measured saturation rate, and the synchronous runs).

    Examples
    --------
    >>> m = [{"strategy": "throughput", "request_rate": "inf", "request_throughput": 2.0, "median_ttft_ms": 100.0},
    ...      {"strategy": "constant", "request_rate": 1.0, "request_throughput": 1.0, "median_ttft_ms": 50.0}]
    >>> p = [{"strategy": "throughput", "request_rate": "inf", "request_throughput": 1.8, "median_ttft_ms": 90.0},
    ...      {"strategy": "constant", "request_rate": 1.0, "request_throughput": 1.0, "median_ttft_ms": 55.0}]
    >>> e = bench_errors(m, p)
    >>> round(e["saturation"]["error"], 6), round(e["mape"]["median_ttft_ms"], 6)
    (-0.1, 0.1)
    """
    if len(measured) != len(predicted):
        raise ValueError(f"{len(measured)} measured runs but {len(predicted)} predicted: they pair run by run")
    saturation = None
    for m, p in zip(measured, predicted, strict=True):
        if m["strategy"] == "throughput":
            saturation = {"measured": m["request_throughput"], "predicted": p["request_throughput"],
                          "error": _relative(p["request_throughput"], m["request_throughput"])}
            break
    limit = saturation["measured"] if saturation is not None else math.inf
    runs: list[dict[str, Any]] = []
    below: list[dict[str, float | None]] = []
    for k, (m, p) in enumerate(zip(measured, predicted, strict=True)):
        if (m["strategy"], m["request_rate"]) != (p["strategy"], p["request_rate"]):
            raise ValueError(f"run {k}: measured {m['strategy']} at {m['request_rate']}, predicted {p['strategy']} at {p['request_rate']}")
        errors = {name: _relative(p.get(name), m.get(name)) for name in COMPARED_METRICS}
        runs.append({"strategy": m["strategy"], "request_rate": m["request_rate"], "request_throughput": m["request_throughput"], **errors})
        rate = m["request_rate"]
        if m["strategy"] == "synchronous" or (isinstance(rate, (int, float)) and rate < limit):
            below.append(errors)
    mape: dict[str, float | None] = {}
    for name in COMPARED_METRICS:
        values = [abs(v) for e in below if (v := e[name]) is not None]
        mape[name] = float(np.mean(values)) if values else None
    return {"runs": runs, "saturation": saturation, "mape": mape}


def _relative(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or not measured > 0:
        return None
    return (predicted - measured) / measured
