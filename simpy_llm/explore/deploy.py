"""Which deployment to buy: the cheapest configuration that carries a load within SLOs.

:func:`deploy` takes a scenario (its workload, its model) and searches a space of
deployments: every catalogue row (:func:`~simpy_llm.serving.catalogue.catalogue`) of the
scenario's model on the GPUs and tensor-parallel degrees given, crossed with schedulers,
``max_num_seqs``, ``max_num_batched_tokens`` and chunked prefill. For each configuration it
finds the fewest replicas that carry the load within the SLO criteria (the probes and the
galloping-then-bisecting count search of :func:`~simpy_llm.explore.capacity.min_replicas`,
with its :class:`~simpy_llm.explore.capacity.StabilityCriteria`), and prices it at
``replicas x tp x pp x price per GPU-hour`` (:func:`~simpy_llm.serving.catalogue.gpu_prices`).

The search is exact: with pruning on (the default) it returns the configuration an
exhaustive search returns, by these rules (``docs/capacity.md``, "Which deployment"):

1. *More replicas never lower capacity.* Within a configuration the count is galloped
   (1, 2, 4, ...) then bisected, and a count's verdict is inferred from a smaller passing
   or a larger failing one without a simulation.
2. *Branch and bound.* Configurations are visited cheapest lower bound first, the lower
   bound being the cost at the fewest replicas not known to fail (1, or one more than the
   largest count a run directory records as failing). One whose lower bound exceeds the
   cheapest feasible cost found so far (or the budget) is skipped without a simulation, and
   a configuration's count search stops at the largest count that costs no more than that.
3. *A configuration that fails at R replicas is not tried below R*, within a search and
   across restarts (the run directory keeps every verdict).

Ties in cost go to the configuration that comes first in the space's order (the
catalogue's rows, then the scheduler, ``max_num_seqs``, ``max_num_batched_tokens`` and
chunked prefill in the order given), so both searches name the same one.

The space (:mod:`simpy_llm.explore.deploy_space`) may also hold calibrated profiles standing
in for catalogue rows (*profiles*), each configuration with and without the scenario's
speculative decoding (*speculation*), and disaggregated fleets whose two counts are searched
by :mod:`simpy_llm.explore.deploy_pools` (*disaggregated*), with rules 1-3 over the pairs.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from simpy_llm.config.errors import ScenarioError
from simpy_llm.explore.capacity.criteria import StabilityCriteria, _check_before_probes
from simpy_llm.explore.capacity.probing import Probe, _build, _Prober, _run_probe, _unjson, _Window, _window
from simpy_llm.explore.capacity.searches import _check_common, _name, _positive, fewest_passing
from simpy_llm.explore.deploy_pools import (
    DECODE_KEY,
    PREFILL_KEY,
    _pool_outcome,
    _PoolRecord,
    _search_pools,
    hand_off,
    kv_refusal,
    pool_overrides,
)
from simpy_llm.explore.deploy_results import Configuration, DeployResult, Outcome, Pool
from simpy_llm.explore.deploy_space import _model_of, _names_model, _positive_int, _profiles, _space

__all__ = ["Configuration", "DeployResult", "Outcome", "Pool", "deploy"]

LOAD_KEY = "workload.aggregate_rate"
REPLICAS_KEY = "serving.replicas"
EXECUTORS = ("serial", "process", "dask")
"""The executors named by a string; a :class:`concurrent.futures.Executor` is taken too."""


def replicas(n: int) -> str:
    """*n* replicas in words, for a reason or a progress line.

    >>> replicas(1), replicas(3)
    ('1 replica', '3 replicas')
    """
    return f"{n} replica" if n == 1 else f"{n} replicas"


# --- one configuration's count search (a job, run in this process or a worker) ------
def _search_counts(
    scenario: Any, fixed: Mapping[str, Any], load: float, window: _Window, criteria: StabilityCriteria,
    seeds: list[int | None], known: Mapping[int, tuple[bool, bool]], cap: int,
) -> dict[str, Any]:
    """The fewest replicas up to *cap* meeting the criteria, given *known* verdicts (rule 3:
    no count at or below one known to fail is run): gallop from one above the largest known
    failing count, doubling, then bisect. Returns the verdicts and the new probes as data."""

    def probe(n: float, ov: dict[str, Any]) -> Probe:
        return _run_probe(scenario, ov, load=load, replicas=int(n), window=window, criteria=criteria)

    prober = _Prober(scenario, fixed, REPLICAS_KEY, seeds, probe, False, more_is_harder=False)
    prober.verdicts.update({float(n): v for n, v in known.items()})
    bad = max((n for n, (_s, meets) in known.items() if not meets), default=0)
    good = min((n for n, (_s, meets) in known.items() if meets), default=None)
    if good is not None and good > cap:
        good = None
    fewest_passing(lambda n: prober(n)[1], cap, bad=bad, good=good)
    return {
        "verdicts": {str(int(n)): [s, m] for n, (s, m) in prober.verdicts.items()},
        "probes": [p.to_dict() for p in prober.probes],
    }


class _Record:
    """Everything known of one configuration: its verdicts by count and its probes."""

    def __init__(self, verdicts: Mapping[int, tuple[bool, bool]] | None = None, probes: list[dict[str, Any]] | None = None) -> None:
        self.verdicts: dict[int, tuple[bool, bool]] = dict(verdicts or {})
        self.probes: list[dict[str, Any]] = list(probes or [])

    def add(self, job: Mapping[str, Any]) -> None:
        self.verdicts.update({int(n): (bool(v[0]), bool(v[1])) for n, v in job["verdicts"].items()})
        self.probes.extend(job["probes"])

    @property
    def failing(self) -> int:
        return max((n for n, (_s, m) in self.verdicts.items() if not m), default=0)

    @property
    def passing(self) -> int | None:
        return min((n for n, (_s, m) in self.verdicts.items() if m), default=None)

    def settled(self, cap: int) -> bool:
        """Whether the fewest passing count up to *cap* is known without another probe."""
        good = self.passing
        if good is not None and good <= cap:
            return good == 1 or (good - 1) in self.verdicts or self.failing == good - 1
        return self.failing >= cap

    def data(self) -> dict[str, Any]:
        return {"verdicts": {str(n): list(v) for n, v in sorted(self.verdicts.items())}, "probes": self.probes}


class _RunDir:
    """A run directory: one JSON file per configuration (its verdicts and probes), named by a
    hash of everything that decides them, so a restart reuses what was run and a change of
    scenario, load, criteria, window or seeds starts afresh."""

    def __init__(self, directory: str | Path, base: Mapping[str, Any]) -> None:
        self.runs = Path(directory) / "runs"
        self.base = dict(base)

    def _path(self, config: Configuration) -> Path:
        text = json.dumps({**self.base, "configuration": config.overrides()}, sort_keys=True, default=repr)
        return self.runs / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"

    def load(self, config: Configuration) -> _Record | _PoolRecord | None:
        try:
            data = json.loads(self._path(config).read_text())
            record = _Record() if config.decode is None else _PoolRecord()
            record.add(data)
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None  # missing or unreadable: run it again
        return record

    def save(self, config: Configuration, record: _Record | _PoolRecord) -> None:
        from simpy_llm.explore.sweeps import _atomic_write

        self.runs.mkdir(parents=True, exist_ok=True)
        _atomic_write(self._path(config), json.dumps(record.data(), indent=1))


def _scenario_digest(scenario: Any) -> str:
    if isinstance(scenario, Mapping):
        text = json.dumps(scenario, sort_keys=True, default=repr).encode()
    else:
        try:
            text = Path(scenario).read_bytes()
        except OSError:
            text = str(scenario).encode()
    return hashlib.sha256(text).hexdigest()


def _nothing() -> None:
    return None


def _executor(executor: Any, max_workers: int | None) -> tuple[concurrent.futures.Executor | None, int, Callable[[], None]]:
    """``(executor, width, close)``: None runs in this process; *close* ends what was started here."""
    if max_workers is not None and not _positive_int(max_workers):
        raise ValueError(f"max_workers must be an integer >= 1, got {max_workers!r}")
    if isinstance(executor, str) and executor == "serial":
        return None, 1, _nothing
    width = max_workers or 2
    if isinstance(executor, str) and executor == "process":
        from simpy_llm.explore.sweeps import _pool_context

        pool = concurrent.futures.ProcessPoolExecutor(width, mp_context=_pool_context())
        return pool, width, lambda: pool.shutdown(wait=True, cancel_futures=True)
    if isinstance(executor, str) and executor == "dask":
        try:  # dask is an optional extra
            from dask.distributed import Client
        except ImportError:
            raise ValueError("executor='dask' needs dask.distributed: pip install 'simpy-llm[explore]'") from None
        client = Client(n_workers=width, threads_per_worker=1, processes=True)
        return client.get_executor(), width, client.close
    if isinstance(executor, concurrent.futures.Executor):
        return executor, max_workers or getattr(executor, "_max_workers", None) or 2, _nothing
    raise ValueError(f"executor must be one of {', '.join(EXECUTORS)} or a concurrent.futures.Executor, got {executor!r}")


# --- the search ----------------------------------------------------------------------
def deploy(
    scenario: str | Path | Mapping[str, Any],
    *,
    load: float,
    slo: StabilityCriteria | Mapping[str, float] | Sequence[str],
    gpus: Sequence[str],
    tp: Iterable[int] | None = None,
    schedulers: Iterable[str] | None = None,
    max_num_seqs: Iterable[int] | None = None,
    max_num_batched_tokens: Iterable[int] | None = None,
    chunked_prefill: Iterable[bool] | None = None,
    model: str | None = None,
    budget: float | None = None,
    max_replicas: int = 64,
    prices: str | Path | Mapping[str, float] | None = None,
    warmup_requests: int | None = None,
    measure_requests: int | None = None,
    seeds: Iterable[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    exhaustive: bool = False,
    executor: Any = "serial",
    max_workers: int | None = None,
    progress: bool = False,
    disaggregated: bool = False,
    prefill_gpus: Sequence[str] | None = None,
    decode_gpus: Sequence[str] | None = None,
    speculation: Iterable[bool] | None = None,
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
    pp: Iterable[int] | None = None,
) -> DeployResult:
    """The cheapest deployment of the scenario's model that carries *load* within the SLOs.

    Parameters
    ----------
    scenario
        A scenario YAML path or its plain data: its workload (run at *load*) and, unless
        *model* is given, its latency model's ``model``. It must be one group of co-located
        replicas (``serving.replicas``), or with *disaggregated* such a group split by
        ``serving.disaggregation`` (whose decode router and KV hand-off the disaggregated
        configurations keep; the co-located ones drop it).
    load
        Requests per second (``workload.aggregate_rate``) every configuration must carry.
    slo
        The criteria: a :class:`~simpy_llm.explore.capacity.StabilityCriteria`, or its SLO
        criteria (``{"ttft_p99": 0.5}`` or ``["ttft_p99=0.5"]``) with the default stability ones.
    gpus
        GPU names (``profiles/gpus.yaml`` names or aliases).
    tp, schedulers, max_num_seqs, max_num_batched_tokens, chunked_prefill
        The values of each axis (None: every TP degree the catalogue has; the scenario's own
        setting for the others).
    model
        The model (as the catalogue names it, with or without its organisation); default the
        scenario's latency model's ``model``.
    budget
        US dollars per hour the answer may cost at most; configurations above it are cut
        (None: no budget). A budget nothing fits is an answer (``best`` None), not an error.
    max_replicas
        The most replicas a configuration may have.
    prices
        A price file over the shipped one (:func:`~simpy_llm.serving.catalogue.gpu_prices`),
        or the prices themselves ``{GPU: USD per GPU-hour}``.
    warmup_requests, measure_requests, seeds, overrides
        As :func:`~simpy_llm.explore.capacity.min_replicas`.
    out
        A run directory: every configuration's verdicts and probes are kept in ``out/runs``
        as they finish, and a later call with the same arguments reuses them.
    exhaustive
        Search every configuration to *max_replicas* without the bound (to check it; the
        answer is the same).
    executor, max_workers
        ``"serial"`` (this process), ``"process"`` (a process pool of *max_workers*, default
        2), ``"dask"`` (a local Dask cluster) or a :class:`concurrent.futures.Executor`.
        With more than one worker, configurations are searched side by side with the bound
        known when each starts: the answer is the same, the count of simulations may differ.
    progress
        Print one line per configuration searched on standard error.
    disaggregated
        Search disaggregated fleets too: for each pair of a prefill row (a catalogue row on
        *prefill_gpus*) and a decode row (on *decode_gpus*), a prefill pool of ``P`` and a
        decode pool of ``D`` replicas with ``P + D <= max_replicas`` and the cheapest such
        split (:mod:`simpy_llm.explore.deploy_pools`).
    prefill_gpus, decode_gpus
        With *disaggregated*: the GPUs of each pool (default *gpus*); rows of different
        GPUs or TP degrees make heterogeneous fleets.
    speculation
        ``[True, False]``: every configuration with the scenario's speculative decoding
        (its ``speculation`` block) and without it (``[True]`` or ``[False]``: one arm);
        None: as the scenario has it. Draft devices with a price (their device profile's
        ``price_per_hour_usd`` times their count) add to the cost of the "on" arm; fused
        drafts run on the target's GPUs and add nothing.
    profiles
        Calibrated profiles (the YAML ``simpy-llm calibrate fit`` writes) standing in for
        catalogue rows, ``{NAME: {"file": FILE, "gpu": GPU, "tp": N}}`` (``tp`` default 1):
        each is a row of the space whose replicas run ``latency_model: {profile: FILE}``,
        priced as *N* of that GPU, with the scenario's engine but for the settings the
        space gives explicitly. A model without catalogue rows may have only these.
    pp
        Pipeline stages of each catalogue row (None: 1 only). A row at ``pp > 1`` runs the
        calibrated roofline (``kind: roofline``, ``efficiency: calibrated``) of its model,
        GPU and TP with *pp* stages, its KV cache sized from the GPU's memory, and costs
        ``replicas x tp x pp x price``: no catalogue row measures pipeline stages. The
        model needs a shipped configuration, the GPU calibrated efficiencies, and *pp* at
        most the model's layers. Not with *disaggregated*.

    Returns
    -------
    DeployResult

    Raises
    ------
    ValueError
        For an unknown GPU or scheduler, a GPU without a price, a model without a catalogue
        row on those GPUs and TP degrees, an axis value out of range, a scenario that is
        not one group of co-located replicas (disaggregated with *disaggregated*), a
        disaggregated search whose model's KV hand-off has no size on any prefill row, or
        pipeline stages the roofline cannot take (*pp*).
    ScenarioError
        If the scenario (with *overrides*) is not valid.

    Examples
    --------
    >>> from simpy_llm.explore.capacity import _doctest_scenario
    >>> s = _doctest_scenario()
    >>> s["workload"]["clients"][0]["input_distribution"]["params"]["value"] = 200
    >>> result = deploy(s, load=4.0, slo={"ttft_p99": 1.0}, gpus=["H100", "A100-80"], tp=[1],
    ...                 model="llama-3.1-8b-instruct", warmup_requests=20, measure_requests=100)
    >>> best = result.best
    >>> best.configuration.gpu, best.min_replicas, best.cost_per_hour
    ('A100-80', 1, 2.4984)
    >>> result.outcomes[1].status, result.outcomes[1].simulations   # H100 costs more at 1 replica
    ('pruned', 0)
    """
    seed_list = _check_common(scenario, None, seeds)
    if not (isinstance(executor, str) and executor in EXECUTORS) and not isinstance(executor, concurrent.futures.Executor):
        raise ValueError(f"executor must be one of {', '.join(EXECUTORS)} or a concurrent.futures.Executor, got {executor!r}")
    criteria = slo if isinstance(slo, StabilityCriteria) else StabilityCriteria(slo=slo)
    if not isinstance(disaggregated, bool):
        raise ValueError(f"disaggregated must be True or False, got {disaggregated!r}")
    if not disaggregated and (prefill_gpus is not None or decode_gpus is not None):
        raise ValueError("prefill_gpus and decode_gpus choose a disaggregated fleet's pools: give disaggregated=True "
                         "(--disaggregated) too")
    load_f = _positive("load", load)
    assert load_f is not None  # load is required
    budget = _positive("budget", budget)
    if not _positive_int(max_replicas):
        raise ValueError(f"max_replicas must be an integer >= 1, got {max_replicas!r}")
    from simpy_llm.serving.catalogue import gpu_prices

    price_table = dict(prices) if isinstance(prices, Mapping) else gpu_prices(prices)
    window = _window(warmup_requests, measure_requests, None, None)
    fixed = {**dict(overrides or {}), **window.overrides(), LOAD_KEY: load_f}
    loaded = _build(scenario, fixed)
    _check_before_probes(criteria, loaded)
    serving = loaded.serving
    if serving.replica_groups or serving.clusters or serving.batch_server is not None or (
            serving.disaggregation is not None and not disaggregated):
        raise ValueError("deploy searches one group of co-located replicas (serving.replicas, serving.engine, "
                         "serving.latency_model): replica groups, clusters, disaggregated pools and batch servers "
                         "are not searched" + (" (a disaggregated scenario's pools are, with disaggregated=True, "
                                               "--disaggregated)" if serving.disaggregation is not None else ""))
    fits = _profiles(profiles, price_table)
    name = _model_of(loaded, model) if not fits or model is not None or _names_model(loaded) else fits[0][0]
    pools = None if not disaggregated else (gpus if prefill_gpus is None else prefill_gpus,
                                            gpus if decode_gpus is None else decode_gpus)
    space = _space(loaded, name, gpus, tp, schedulers, max_num_seqs, max_num_batched_tokens, chunked_prefill, price_table,
                   pools, speculation, fits, pp)
    staged = any(c.pp > 1 for c in space)
    if staged and disaggregated:
        raise ValueError("pp: pipeline stages with disaggregated: a disaggregated fleet's pools run catalogue rows, "
                         "which have one stage; give pp=None (no --pp) or disaggregated=False")
    from simpy_llm.config.plain import unstructure

    hand = hand_off(loaded) if disaggregated else {}
    engine = unstructure(serving.engine) if disaggregated else {}
    # A co-located configuration of a disaggregated scenario is its fleet without the split.
    colocated = {"serving.disaggregation": None} if serving.disaggregation is not None else {}
    runs = None if out is None else _RunDir(out, {
        "scenario": _scenario_digest(scenario), "overrides": fixed, "criteria": criteria.to_dict(),
        "window": attrs.asdict(window), "seeds": seed_list, "simpy_llm": _version(),
    })

    records: dict[int, _Record | _PoolRecord] = {}
    refused: dict[int, str] = {}
    loaded_count = 0
    for config in space:
        pooled = config.decode is not None
        why = kv_refusal(config, hand) if pooled else None
        if why is not None:
            refused[config.index] = why
            continue
        try:
            _build(scenario, {**fixed, **pool_overrides(config, engine, hand), PREFILL_KEY: 1, DECODE_KEY: 1} if pooled
                   else {**fixed, **config.overrides(), **colocated, REPLICAS_KEY: 1})
        except ScenarioError as exc:  # the scenario's checks refuse this combination: say why, search the rest
            refused[config.index] = " ".join(str(exc).split())
            continue
        record = runs.load(config) if runs is not None else None
        if record is not None:
            loaded_count += len(record.probes)
        records[config.index] = record or (_PoolRecord() if pooled else _Record())
    pooled_space = [c for c in space if c.decode is not None]
    if pooled_space and all(c.index in refused for c in pooled_space):
        raise ValueError(f"disaggregated: no disaggregated configuration can be searched: {refused[pooled_space[0].index]}")

    search = _Search(scenario, fixed, load_f, window, criteria, seed_list, max_replicas, budget, exhaustive, progress,
                     colocated=colocated, engine=engine, hand=hand)
    pool, width, close = _executor(executor, max_workers)
    try:
        search.run([c for c in space if c.index in records], records, runs, pool, width)
    finally:
        close()
    outcomes = search.outcomes(space, records, refused, load_f)
    result = DeployResult(
        scenario=_name(scenario, loaded), model=name, load=load_f, criteria=criteria, budget=budget,
        max_replicas=max_replicas, exhaustive=exhaustive, outcomes=tuple(outcomes), simulations=search.ran,
        loaded=loaded_count, disaggregated=disaggregated, speculation=speculation is not None, profiles=bool(fits),
        pp=staged,
    )
    if out is not None:
        result.save(out)
    return result


def _version() -> str:
    from simpy_llm import __version__

    return __version__


class _Search:
    """The branch and bound over the configurations (rules 1-3 of the module's docstring)."""

    def __init__(
        self, scenario: Any, fixed: Mapping[str, Any], load: float, window: _Window, criteria: StabilityCriteria,
        seeds: list[int | None], max_replicas: int, budget: float | None, exhaustive: bool, progress: bool,
        *, colocated: Mapping[str, Any], engine: Mapping[str, Any], hand: Mapping[str, Any],
    ) -> None:
        self.scenario, self.fixed, self.load, self.window = scenario, dict(fixed), load, window
        self.criteria, self.seeds, self.max_replicas = criteria, seeds, max_replicas
        self.budget, self.exhaustive, self.progress = budget, exhaustive, progress
        self.best: tuple[float, int] | None = None
        """``(cost, index)`` of the cheapest feasible configuration found so far."""
        self.caps: dict[int, int] = {}
        """The count each configuration's search went up to."""
        self.skipped: set[int] = set()
        """Configurations whose lower bound was above the limit when their turn came."""
        self.ran = 0
        self.limits: dict[int, float] = {}
        """The cost each disaggregated configuration's search went up to."""
        self.colocated = dict(colocated)
        """What a co-located configuration sets besides its own keys (a disaggregated scenario's split removed)."""
        self.engine = dict(engine)
        """The scenario's engine settings, under a disaggregated configuration's pools'."""
        self.hand = dict(hand)
        """The scenario's KV hand-off settings (:func:`~simpy_llm.explore.deploy_pools.hand_off`)."""

    def limit(self) -> float:
        """What a configuration may cost to be worth searching: the cheapest found, the budget."""
        if self.exhaustive:
            return math.inf
        bound = math.inf if self.budget is None else self.budget
        return bound if self.best is None else min(bound, self.best[0])

    def cap(self, config: Configuration, limit: float) -> int:
        """The most replicas costing no more than *limit* (up to ``max_replicas``)."""
        if math.isinf(limit):
            return self.max_replicas
        n = min(self.max_replicas, max(0, math.floor(limit / config.cost(1))))
        while n < self.max_replicas and config.cost(n + 1) <= limit:
            n += 1
        while n > 0 and config.cost(n) > limit:
            n -= 1
        return n

    def found(self, config: Configuration, record: _Record | _PoolRecord) -> None:
        if isinstance(record, _PoolRecord):
            pair = record.found(config, self.max_replicas, self.limits[config.index], not self.exhaustive)
            key = None if pair is None else (config.cost(*pair), config.index)
            if key is not None and (self.budget is None or key[0] <= self.budget) and (self.best is None or key < self.best):
                self.best = key
            return
        good = record.passing
        if good is not None and good <= self.caps[config.index]:
            key = (config.cost(good), config.index)
            if self.budget is not None and key[0] > self.budget:
                return  # only an exhaustive search, without the bound, gets here
            if self.best is None or key < self.best:
                self.best = key

    def bound(self, config: Configuration, record: _Record | _PoolRecord) -> float:
        """The least cost *config* may have: at the fewest replicas not known to fail."""
        if isinstance(record, _PoolRecord):
            return record.bound(config, self.max_replicas)
        return config.cost(record.failing + 1)

    def run(
        self, space: list[Configuration], records: dict[int, _Record | _PoolRecord], runs: _RunDir | None,
        pool: concurrent.futures.Executor | None, width: int,
    ) -> None:
        # Rule 2: cheapest lower bound first (the count above the largest known to fail).
        queue = sorted(space, key=lambda c: (self.bound(c, records[c.index]), c.index))
        running: dict[concurrent.futures.Future[dict[str, Any]], Configuration] = {}
        while queue or running:
            while queue and len(running) < width:
                config = queue.pop(0)
                record = records[config.index]
                if isinstance(record, _PoolRecord):
                    job = self._pool_job(config, record)
                    if job is None:
                        continue
                    if pool is None:
                        self._finish(config, _search_pools(*job), records, runs)
                    else:
                        running[pool.submit(_search_pools, *job)] = config
                    continue
                cap = self.cap(config, self.limit())
                self.caps[config.index] = cap
                if cap <= record.failing:
                    self.skipped.add(config.index)
                if cap <= record.failing or record.settled(cap):
                    self.found(config, record)  # decided by the bound or by what the run directory holds
                    continue
                args = (self.scenario, {**self.fixed, **config.overrides(), **self.colocated}, self.load, self.window,
                        self.criteria, self.seeds, dict(record.verdicts), cap)
                if pool is None:
                    self._finish(config, _search_counts(*args), records, runs)
                else:
                    running[pool.submit(_search_counts, *args)] = config
            if running:
                done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: running[f].index):
                    self._finish(running.pop(future), future.result(), records, runs)

    def _pool_job(self, config: Configuration, record: _PoolRecord) -> tuple[Any, ...] | None:
        """The arguments of a disaggregated configuration's search (None: decided without one,
        by the bound or by what the run directory holds)."""
        limit = self.limit() if self.exhaustive else min(self.limit(), record.passing_cost(config, self.max_replicas))
        self.limits[config.index] = limit
        if record.bound(config, self.max_replicas) > limit:
            self.skipped.add(config.index)
            return None
        if record.settled(config, self.max_replicas, limit, not self.exhaustive):
            self.found(config, record)
            return None
        overrides = {**self.fixed, **pool_overrides(config, self.engine, self.hand)}
        return (self.scenario, overrides, self.load, self.window, self.criteria, self.seeds, config,
                record.data()["verdicts"], self.max_replicas, limit, not self.exhaustive)

    def _finish(
        self, config: Configuration, job: dict[str, Any], records: dict[int, _Record | _PoolRecord], runs: _RunDir | None,
    ) -> None:
        record = records[config.index]
        record.add(job)
        self.ran += len(job["probes"])
        if runs is not None and job["probes"]:
            runs.save(config, record)
        self.found(config, record)
        if isinstance(record, _PoolRecord):
            if self.progress:
                pair = record.found(config, self.max_replicas, self.limits[config.index], not self.exhaustive)
                print(f"deploy: {config.label()}: "
                      + (f"{pair[0]}P+{pair[1]}D replicas, {config.cost(*pair):.4g} USD/h" if pair is not None
                         else f"no split within {self.limits[config.index]:.4g} USD/h")
                      + f" ({len(job['probes'])} simulations)", file=sys.stderr, flush=True)
            return
        if self.progress:
            good = record.passing
            print(f"deploy: {config.label()}: "
                  + (f"{replicas(good)}, {config.cost(good):.4g} USD/h" if good is not None and good <= self.caps[config.index]
                     else f"fails at {replicas(record.failing)}")
                  + f" ({len(job['probes'])} simulations)", file=sys.stderr, flush=True)

    def outcomes(
        self, space: list[Configuration], records: dict[int, _Record | _PoolRecord], refused: Mapping[int, str], load: float,
    ) -> list[Outcome]:
        best = self.best
        out = []
        for config in space:
            nan = math.nan
            if config.index in refused:
                out.append(Outcome(configuration=config, status="refused", min_replicas=None, failing_replicas=0,
                                   cost_per_hour=nan, ttft_p99_s=nan, tpot_p99_s=nan, qps_per_usd_hour=nan,
                                   simulations=0, reason=f"the scenario's checks refuse it: {refused[config.index]}"))
                continue
            record = records[config.index]
            if isinstance(record, _PoolRecord):
                out.append(_pool_outcome(
                    config, record, limit=self.limits[config.index], bound=not self.exhaustive, best=best,
                    budget=self.budget, max_total=self.max_replicas, load=load, skipped=config.index in self.skipped))
                continue
            cap = self.caps.get(config.index, 0)
            good = record.passing
            sims = len(record.probes)
            if good is not None and good > cap and not (good <= self.max_replicas and record.settled(good)):
                good = None  # beyond this search's bound, and not known to be the fewest
            ttft = tpot = cost = qps = nan
            if good is not None:
                cost = config.cost(good)
                at = [p for p in record.probes if p["replicas"] == good]
                ttft = max((_unjson(p["latency_s"]["ttft_p99"]) for p in at), default=nan)
                tpot = max((_unjson(p["latency_s"]["tpot_p99"]) for p in at), default=nan)
                qps = load / cost
            if good is not None and self.budget is not None and cost > self.budget:
                status, reason = "over_budget", f"{replicas(good)} cost {cost:.4g} USD/h > the budget {self.budget:g}"
            elif good is not None and best is not None and (cost, config.index) == best:
                status, reason = "cheapest", f"the cheapest meeting the criteria: {replicas(good)}"
            elif good is not None:
                assert best is not None  # a feasible configuration within the budget sets best
                status = "costlier"
                reason = (f"{replicas(good)} cost {cost:.4g} USD/h > {best[0]:.4g}" if cost > best[0]
                          else f"costs the same as the cheapest ({cost:.4g} USD/h), which comes first")
            elif cap >= self.max_replicas:
                status = "misses_slo"
                reason = f"misses the criteria even at {replicas(self.max_replicas)}"
                failing = [p for p in record.probes if p["replicas"] == record.failing]
                if failing:
                    reason += f" ({failing[0]['reason']})"
            else:
                over_budget = self.budget is not None and (best is None or config.cost(cap + 1) > self.budget)
                status = "over_budget" if over_budget else "pruned"
                against = f"the budget {self.budget:g}" if over_budget else f"the cheapest found ({best[0]:.4g})" if best else ""
                if config.index in self.skipped:
                    known = f" (fails at {record.failing}, in the run directory)" if record.failing else ""
                    reason = (f"skipped: {replicas(record.failing + 1)} would cost "
                              f"{config.cost(record.failing + 1):.4g} USD/h > {against}{known}")
                else:
                    reason = f"fails at {replicas(record.failing)}, and {cap + 1} would cost {config.cost(cap + 1):.4g} USD/h > {against}"
            out.append(Outcome(configuration=config, status=status, min_replicas=good, failing_replicas=record.failing,
                               cost_per_hour=cost, ttft_p99_s=ttft, tpot_p99_s=tpot, qps_per_usd_hour=qps,
                               simulations=sims, reason=reason))
        return out
