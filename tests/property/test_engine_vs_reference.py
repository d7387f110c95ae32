"""The engine, in both modes, against the per-token reference model (hypothesis).

Each example draws a small scenario, runs it through :class:`Simulation` with
``simulation.mode: event_per_change`` and ``event_per_step``, and through
``tests/reference/replica.py`` (written from ``docs/model.md`` alone), and
requires identical records: per request ``status``, ``enqueue_s``,
``first_scheduled_s``, ``first_token_s``, ``completion_s`` (exact float
equality, NaN equals NaN), ``generated_tokens``, ``num_preemptions`` and
``cached_tokens``; the preemption table (request, replica, time, mode); the
engine's step count (per replica where ``summary()["engine"]["steps"]`` is a
list, else over all replicas); and each replica's busy time.

The reference takes as *inputs* what the workload and the router decided
(arrival times, lengths, replicas, sessions, prefix groups: read from the
run's records); everything the replica decides is compared.

Busy time is compared to a relative 1e-9: the specification defines each
step's duration, not the order in which a run sums them (a run of identical
steps may be added as ``n * step``), and one missing or extra step is far
larger than that tolerance. Swap copies use a bandwidth of exactly 2**30
bytes/s and whole bytes per token, so every copy time is exact in binary and
a step's swap time does not depend on how its copies are summed.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm import Results, Simulation, scenario_from_dict
from simpy_llm.config.errors import ScenarioWarning
from simpy_llm.config.structure import build_policy
from tests.reference.replica import (
    ReplicaOutcome,
    engine_settings,
    linear_latency,
    requests_from_records,
    simulate,
)

MODES = ("event_per_change", "event_per_step")
FIELDS = (
    "status",
    "enqueue_s",
    "first_scheduled_s",
    "first_token_s",
    "completion_s",
    "generated_tokens",
    "num_preemptions",
    "cached_tokens",
)
INPUT_COLUMNS = (
    "request_id", "client_id", "tenant_id", "slo_class", "priority", "replica", "session_id",
    "round_index", "prefix_group", "prefix_tokens", "prompt_tokens", "output_tokens", "arrival_s",
)
EXACT_BANDWIDTH_GB_PER_S = 1.073741824
"""2**30 bytes/s: copy times of whole bytes are exact binary fractions."""
SHOWN = 8
"""Mismatches listed in a failure message."""


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


# --- scenarios ---------------------------------------------------------------------------------


def _length(rnd: random.Random, high: int) -> dict[str, Any]:
    kind = rnd.choice(["constant", "uniform", "exponential"])
    if kind == "constant":
        return {"type": "constant", "params": {"value": rnd.randint(1, high)}}
    if kind == "uniform":
        return {"type": "uniform", "params": {"low": 1, "high": rnd.randint(2, high + 1)}}
    return {"type": "exponential", "params": {"mean": rnd.uniform(1, high)}}


def _scheduler(rnd: random.Random) -> dict[str, Any]:
    kind = rnd.choice(["fcfs", "priority", "sjf", "edf"])
    if kind == "sjf":
        by = rnd.choice(["prompt", "output"])
        params: dict[str, Any] = {"by": by}
        if by == "output":
            params["predictor"] = rnd.choice(
                [{"kind": "oracle"}, {"kind": "noisy", "sigma": 0.8, "seed": rnd.randint(0, 9)}]
            )
        return {"kind": "sjf", "params": params}
    if kind == "edf":
        return {
            "kind": "edf",
            "params": {
                "default_ttft_s": rnd.choice([0.01, 0.1, 1.0]),
                "slack_s_per_token": rnd.choice([0.0, 0.001, 0.02]),
            },
        }
    return {"kind": kind}


def random_scenario(
    rnd: random.Random,
    *,
    swap: bool | None = None,
    tight_kv: bool | None = None,
    sessions: bool | None = None,
    prefixes: bool | None = None,
    ties: bool | None = None,
    until: bool | None = None,
    slots: bool = False,
) -> dict[str, Any]:
    """A small scenario as plain data; a feature given as True/False is forced, else drawn.
    With *slots* the engine is a llama.cpp server's: a slot cache (:func:`slot_engine`)."""

    def coin(forced: bool | None, p: float = 0.5) -> bool:
        return rnd.random() < p if forced is None else forced

    block = rnd.choice([1, 2, 4, 8, 16])
    tight = coin(tight_kv)
    max_seqs = rnd.randint(2 if tight else 1, 8)
    chunked = coin(None)
    budget = rnd.randint(max(max_seqs, 2), 48) if chunked else rnd.randint(max(max_seqs, 24), 64)
    if tight:
        # room for a few requests at once (prompts <= 48 tokens, outputs <= 24): decoding
        # requests outgrow the cache and preempt each other
        tokens = rnd.randint(max(budget, 32), max(budget, 32) + 48)
    else:
        tokens = rnd.randint(max(budget, 96), 400)
    blocks = -(-tokens // block)
    capacity = blocks * block
    engine: dict[str, Any] = {
        "max_num_seqs": max_seqs,
        "max_num_batched_tokens": budget,
        "chunked_prefill": chunked,
        "kv_block_size": block,
        "kv_num_blocks": blocks,
        "scheduler": _scheduler(rnd),
    }
    # Without chunking a prompt must fit the budget whole: keep every admissible request
    # schedulable (the specification has no rule for one that never fits).
    longest = capacity if chunked else min(capacity, budget)
    if not chunked or coin(None):
        engine["max_model_len"] = rnd.randint(max(2, longest * 2 // 3), longest)
    caching = rnd.choice([True, False, None])
    if caching is not None:
        engine["prefix_caching"] = caching
    if coin(swap):
        engine["preemption_mode"] = "swap"
        engine["swap_space_blocks"] = rnd.randint(1, 24)
        engine["swap_kv_bytes_per_token"] = rnd.choice([4096, 131072, 3 * 65536])
        engine["swap_bandwidth_gb_per_s"] = EXACT_BANDWIDTH_GB_PER_S
    elif coin(None):
        engine["preemption_mode"] = "recompute"
    if coin(None, 0.25):
        engine["ubatch_tokens"] = rnd.randint(1, budget)
    if chunked and coin(None, 0.25):
        engine["prefill_breaks"] = sorted(rnd.sample(range(1, 40), rnd.randint(1, 3)), reverse=True)
    if coin(None, 0.3):
        engine["reusable_prompt_tail"] = rnd.randint(0, 12)

    with_sessions = coin(sessions, 0.3)
    with_prefix = coin(prefixes)
    tied = coin(ties, 0.3)
    high = 12 if with_sessions else 24
    a: dict[str, Any] = {
        "id": "a",
        "rate_fraction": 1.0,
        "arrival": {"process": "constant"} if tied else rnd.choice(
            [{"process": "poisson"}, {"process": "gamma", "cv": 3.0}, {"process": "constant"}]
        ),
        "input_distribution": _length(rnd, high),
        "output_distribution": _length(rnd, 24),
        "priority": rnd.randint(0, 3),
    }
    b: dict[str, Any] = {
        "id": "b",
        "rate_fraction": 1.0 if tied else rnd.choice([0.0, 0.5, 2.0]),
        "arrival": {"process": "constant"} if tied else {"process": "poisson"},
        "input_distribution": _length(rnd, high),
        "output_distribution": _length(rnd, 24),
        "priority": rnd.randint(0, 3),
        "slo_class": "batch",
    }
    if with_prefix:
        a["prefix_group"] = "g"
        a["prefix_length"] = rnd.randint(1, 24)
        if coin(None):
            # the same group with another length: the shorter prefix is cut inside a hash block
            b["prefix_group"] = "g"
            b["prefix_length"] = rnd.randint(1, 24)
    if with_sessions:
        a["multi_turn"] = {
            "max_rounds": rnd.randint(2, 3),
            "think_time": {"type": "constant", "params": {"value": rnd.choice([0.001, 0.003, 0.05])}},
            "context_growth": rnd.choice(["accumulate", "accumulate", "fixed"]),
        }
    rate = rnd.uniform(100, 1000) if tight or coin(None) else rnd.uniform(5, 100)
    num_requests = rnd.randint(4, 20) if with_sessions else rnd.randint(8, 60)
    data: dict[str, Any] = {
        "seed": rnd.randint(0, 2**16),
        "workload": {"aggregate_rate": rate, "num_requests": num_requests, "clients": [a, b]},
        "serving": {
            "replicas": rnd.randint(1, 3),
            "router": {"kind": rnd.choice(["round_robin", "round_robin", "least_loaded", "random"])},
            "engine": engine,
            "latency_model": {
                "kind": "blis_linear",
                "params": {
                    "beta0_us": rnd.choice([0.0, 500.0, 5000.0]),
                    "beta1_us": rnd.choice([10.0, 300.0]),
                    "beta2_us": rnd.choice([50.0, 1000.0]),
                    "alpha0_us": rnd.choice([0.0, 2000.0]),
                    "alpha1_us": rnd.choice([0.0, 7.0]),
                    "alpha2_us": rnd.choice([0.0, 100.0]),
                    "cache_restore_us": rnd.choice([0.0, 0.0, 3000.0]),
                },
            },
        },
    }
    if coin(None):
        data["workload"]["seed"] = rnd.randint(0, 99)
    if coin(None, 0.3):
        # TTFT targets per class: the edf scheduler's deadlines
        data["slo"] = {"default": {"ttft_s": rnd.choice([0.005, 0.05])}, "batch": {"ttft_s": rnd.choice([0.02, 0.5])}}
    if coin(until, 0.2):
        # somewhere in the arrivals (or a little after them)
        data["simulation"] = {"until_s": rnd.uniform(0.05, 1.5) * num_requests / rate + 1e-3}
    if slots:
        data["serving"]["engine"] = slot_engine(rnd, engine["scheduler"])
    return data


def slot_engine(rnd: random.Random, scheduler: dict[str, Any]) -> dict[str, Any]:
    """An engine with llama.cpp's slot cache: few slots, each owning its whole context (KV
    blocks for every slot's ``max_model_len``), a host cache from none to plenty, similarity
    from off to strict, checkpoints or not, and few enough checkpoints kept to drop some."""
    block = rnd.choice([1, 1, 2, 4, 8])
    slots = rnd.randint(1, 4)
    chunked = rnd.random() < 0.7
    budget = rnd.randint(max(slots, 2), 48) if chunked else rnd.randint(max(slots, 24), 64)
    model_len = rnd.randint(24, 120) if chunked else rnd.randint(24, budget)
    engine: dict[str, Any] = {
        "max_num_seqs": slots,
        "max_num_batched_tokens": budget,
        "chunked_prefill": chunked,
        "kv_block_size": block,
        "kv_num_blocks": max(slots * -(-model_len // block), -(-budget // block)) + rnd.choice([0, 0, 5]),
        "max_model_len": model_len,
        "scheduler": scheduler,
    }
    if chunked and rnd.random() < 0.6:
        engine["prefill_breaks"] = sorted(rnd.sample(range(1, 30), rnd.randint(1, 2)), reverse=True)
    if rnd.random() < 0.25:
        engine["ubatch_tokens"] = rnd.randint(1, budget)
    host = rnd.choice([0, 16, 64, 100_000])
    engine["slot_cache"] = {
        "prompt_similarity": rnd.choice([0.0, 0.1, 0.1, 0.3, 0.6]),
        "host_cache_tokens": host,
        "cache_idle_slots": host > 0 and rnd.random() < 0.7,
        "checkpoints": rnd.random() < 0.75,
        "max_checkpoints": rnd.choice([1, 2, 3, 32]),
    }
    return engine


def scenarios(**forced: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Random small scenarios (see :func:`random_scenario`). Hypothesis draws the seed of
    the scenario's own Random: the examples then spread over the whole parameter space
    instead of clustering near the simplest values, as many draws in one composite do."""
    return st.integers(0, 2**32 - 1).map(lambda seed: random_scenario(random.Random(seed), **forced))


# --- running and comparing --------------------------------------------------------------------


def _run(data: dict[str, Any], mode: str) -> Results:
    data = copy.deepcopy(data)
    data.setdefault("simulation", {})["mode"] = mode
    scenario = scenario_from_dict(data)
    if data["workload"]["clients"][1]["rate_fraction"] == 0:
        # client b drew rate_fraction 0: it is left out, with a warning naming it
        with pytest.warns(ScenarioWarning, match="client 'b' has rate_fraction 0"):
            sim = Simulation(scenario)
    else:
        sim = Simulation(scenario)
    return sim.run()


def _policy(data: dict[str, Any]) -> Any:
    """The scenario's scheduler policy, built as the simulation builds it (with the SLO
    classes' TTFT targets)."""
    from simpy_llm.policies.scheduling import scheduler_policies

    scenario = scenario_from_dict(data)
    ttft_targets = {name: t.ttft_s for name, t in scenario.slo.items() if t.ttft_s is not None}
    return build_policy(scenario.serving.engine.scheduler, scheduler_policies, slo=ttft_targets)


def _reference(data: dict[str, Any], results: Results) -> list[ReplicaOutcome]:
    serving = data["serving"]
    return simulate(
        requests_from_records(results.to_dataframe(), data),
        engine_settings(serving["engine"]),
        linear_latency(serving["latency_model"]["params"]),
        _policy(data),
        num_replicas=serving.get("replicas", 1),
        until_s=data.get("simulation", {}).get("until_s"),
    )


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) or isinstance(y, float):
        return (math.isnan(x) and math.isnan(y)) or x == y
    return x == y


def _mismatches(results: Results, ref: list[ReplicaOutcome]) -> list[str]:
    """Every difference between a run and the reference, described."""
    out: list[str] = []
    cols = results.columns
    by_id = {rid: rec for rep in ref for rid, rec in rep.requests.items()}
    ids = [int(i) for i in cols["request_id"]]
    if sorted(by_id) != ids:
        out.append(f"request ids: engine {ids} reference {sorted(by_id)}")
        return out
    for name in FIELDS:
        if name not in cols:
            out.append(f"records have no {name!r} column")
            continue
        column = cols[name]
        for i, rid in enumerate(ids):
            engine_value = column[i].item() if hasattr(column[i], "item") else column[i]
            ref_value = getattr(by_id[rid], name)
            if not _same(engine_value, ref_value):
                out.append(
                    f"request {rid} (replica {int(cols['replica'][i])}) {name}: "
                    f"engine {engine_value!r} reference {ref_value!r}"
                )
    table = results.preemptions()
    if "mode" not in table.columns:
        out.append(f"preemption table has no 'mode' column (columns {list(table.columns)})")
    else:
        engine_rows = [
            (int(r), int(p), float(t), str(m))
            for r, p, t, m in table[["request_id", "replica", "time_s", "mode"]].itertuples(index=False, name=None)
        ]
        ref_rows = sorted(row for rep in ref for row in rep.preemptions)
        if engine_rows != ref_rows:
            first = next(
                (k for k, (e, f) in enumerate(zip(engine_rows, ref_rows, strict=False)) if e != f),
                min(len(engine_rows), len(ref_rows)),
            )
            out.append(
                f"preemptions ({len(engine_rows)} vs {len(ref_rows)} rows) differ at row {first}: "
                f"engine {engine_rows[first:first + 3]} reference {ref_rows[first:first + 3]}"
            )
    engine = results.summary()["engine"]
    ref_steps = [rep.steps for rep in ref]
    steps = engine["steps"]
    if isinstance(steps, list):
        if steps != ref_steps:
            out.append(f"engine steps per replica: engine {steps} reference {ref_steps}")
    elif steps != sum(ref_steps):
        out.append(f"engine steps (all replicas): engine {steps} reference {sum(ref_steps)} {ref_steps}")
    ref_busy = [rep.busy_s for rep in ref]
    if len(engine["busy_s"]) != len(ref_busy) or not all(
        math.isclose(e, r, rel_tol=1e-9, abs_tol=1e-15) for e, r in zip(engine["busy_s"], ref_busy, strict=False)
    ):
        out.append(f"busy_s per replica: engine {engine['busy_s']} reference {ref_busy}")
    return out


def compare(data: dict[str, Any]) -> list[str]:
    """Mismatches of both engine modes against the reference, each prefixed by its mode."""
    found: list[str] = []
    cached: tuple[Any, list[ReplicaOutcome]] | None = None
    for mode in MODES:
        results = _run(data, mode)
        inputs = results.to_dataframe()[list(INPUT_COLUMNS)]
        if cached is None or not cached[0].equals(inputs):
            # each mode against the reference fed with its own inputs (sessions' later
            # rounds arrive after earlier completions, so a wrong engine shifts inputs)
            cached = (inputs, _reference(data, results))
        found.extend(f"{mode}: {m}" for m in _mismatches(results, cached[1]))
    return found


def _check(data: dict[str, Any]) -> None:
    problems = compare(data)
    assert not problems, f"{len(problems)} mismatch(es):\n" + "\n".join(problems[:SHOWN])


# --- the tests (1,000 examples in all) -------------------------------------------------------


@pytest.mark.slow
@_settings(400)
@given(scenarios())
def test_engine_matches_reference_on_random_scenarios(data):
    """Records, preemptions and step statistics of both engine modes equal the reference's
    on scenarios mixing every scheduler, prefix caching on and off, both preemption modes,
    chunked and whole prefill, several replicas and routers, prefix groups and sessions."""
    _check(data)


@_settings(200)
@given(scenarios(tight_kv=True, swap=True))
def test_engine_matches_reference_under_kv_pressure_with_swap(data):
    """With a KV cache barely above the token budget and swap preemption (swap space from
    none to plenty), preemptions, swap-outs, swap-ins and fallbacks to recompute match."""
    _check(data)


@_settings(200)
@given(scenarios(prefixes=True, sessions=True))
def test_engine_matches_reference_with_prefix_groups_and_sessions(data):
    """With shared prefixes (two lengths in one group) and multi-turn sessions, the prefix
    cache's hits (cached_tokens), evictions and their timing match."""
    _check(data)


@_settings(150)
@given(scenarios(slots=True, prefixes=True, sessions=True))
def test_engine_matches_reference_with_llamacpp_slots(data):
    """With llama.cpp's slot cache (slot choice by shared prompt or least recent use, the host
    cache's saves, restores and evictions, checkpoints), the cached tokens, the restore
    costs and everything they move match, on shared prefixes and multi-turn sessions."""
    _check(data)


@_settings(60)
@given(scenarios(slots=True))
def test_engine_matches_reference_with_llamacpp_slots_anywhere(data):
    """The slot cache on the other drawn workloads (with or without prefixes and sessions,
    tied arrivals, early stops) matches the reference too."""
    _check(data)


@_settings(100)
@given(scenarios(ties=True))
def test_engine_matches_reference_with_tied_arrival_times(data):
    """Two clients with constant arrivals at one rate send requests at identical instants;
    entries at one time are taken in request-id order, as the reference takes them."""
    _check(data)


@_settings(100)
@given(scenarios(until=True))
def test_engine_matches_reference_when_stopped_early(data):
    """With simulation.until_s, the steps that happened, the admissions and preemptions of
    the step in progress, and the in-flight records match."""
    _check(data)
