"""Disaggregated configurations of the deployment search: a prefill pool and a decode pool.

With ``deploy(..., disaggregated=True)`` the space of :func:`~simpy_llm.explore.deploy.deploy`
also holds, for each pair of catalogue rows (a prefill row of ``prefill_gpus``, a decode
row of ``decode_gpus``) and each combination of engine settings, a disaggregated fleet: the
scenario's ``serving.disaggregation`` model (its decode router and KV hand-off,
:mod:`simpy_llm.serving.disaggregation`; the defaults when the scenario has none) between a
``prefill`` replica group on the first row and a ``decode`` group on the second
(:func:`pool_overrides`). Its cost is ``P x tp_prefill x price_prefill + D x tp_decode x
price_decode``.

Its count search is over two counts, ``(P, D)`` with ``P + D <= max_replicas``
(:func:`~simpy_llm.explore.capacity.searches.cheapest_pair`): for ``P = 1, 2, ...`` the fewest
``D`` by :func:`~simpy_llm.explore.capacity.searches.fewest_passing`, stopping at the first
``P`` whose cost with one decode replica is above the cheapest found (or the bound the
search gives it). It is exact under the assumption the docs state (``docs/capacity.md``,
"Which deployment"): more prefill or more decode replicas never make a fleet fail, so a
pair's verdict follows from a smaller passing pair or a larger failing one (:class:`_PoolRecord`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from simpy_llm.explore.capacity.criteria import StabilityCriteria
from simpy_llm.explore.capacity.probing import Probe, _Prober, _run_probe, _unjson, _Window
from simpy_llm.explore.capacity.searches import cheapest_pair
from simpy_llm.explore.deploy_results import Configuration, Outcome

__all__ = ["DECODE_KEY", "PREFILL_KEY", "hand_off", "kv_refusal", "pool_overrides"]

PREFILL_KEY = "serving.replica_groups.0.count"
DECODE_KEY = "serving.replica_groups.1.count"


def hand_off(loaded: Any) -> dict[str, Any]:
    """The scenario's disaggregation settings for the searched pools, as plain data: its
    ``serving.disaggregation`` without ``prefill_replicas`` (the search sets the pools'
    counts), or ``{}`` (the defaults) for a co-located scenario.

    Raises
    ------
    ValueError
        If the scenario's disaggregation has a topology: its endpoints name fixed replicas,
        and the search varies the pools' sizes.

    Examples
    --------
    >>> from simpy_llm.explore.capacity import _doctest_scenario
    >>> from simpy_llm.loading import scenario_from_dict
    >>> s = _doctest_scenario()
    >>> hand_off(scenario_from_dict(s))
    {}
    >>> s["serving"].update(replicas=3, disaggregation={"prefill_replicas": 1, "kv_transfer": {"bandwidth_gbps": 50}})
    >>> hand = hand_off(scenario_from_dict(s))
    >>> hand["kv_transfer"]["bandwidth_gbps"], hand["decode_router"]["kind"], "prefill_replicas" in hand
    (50.0, 'round_robin', False)
    """
    from simpy_llm.config.plain import unstructure

    dis = loaded.serving.disaggregation
    if dis is None:
        return {}
    if dis.topology is not None:
        raise ValueError("disaggregated: serving.disaggregation.topology names a fixed set of replicas, and the search "
                         "varies the pools' sizes: remove it (--set serving.disaggregation.topology=null) and give the "
                         "hand-off's link in serving.disaggregation.kv_transfer (bandwidth_gbps, rtt_ms)")
    out: dict[str, Any] = unstructure(dis)
    out.pop("prefill_replicas", None)
    out.pop("topology", None)
    return out


def pool_overrides(config: Configuration, engine: Mapping[str, Any], hand: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario keys a disaggregated *config* sets: its two replica groups, each with the
    scenario's *engine* settings (plain data) under the configuration's, and the hand-off
    *hand* (:func:`hand_off`). The counts are set per probe (:data:`PREFILL_KEY`,
    :data:`DECODE_KEY`).

    >>> from simpy_llm.explore.deploy_results import Pool
    >>> c = Configuration(index=0, model="meta-llama/llama-3.1-8b-instruct", gpu="H100", tp=1, scheduler="fcfs",
    ...                   max_num_seqs=64, max_num_batched_tokens=2048, chunked_prefill=True, price_per_gpu_hour=3.9492,
    ...                   kv_auto=True, decode=Pool(gpu="A100-80", tp=1, price_per_gpu_hour=2.4984, kv_auto=True))
    >>> ov = pool_overrides(c, {"kv_block_size": 16, "max_num_seqs": 8}, {})
    >>> [(g["role"], g["latency_model"]["params"]["gpu"], g["engine"]["max_num_seqs"], g["engine"]["kv_block_size"])
    ...  for g in ov["serving.replica_groups"]]
    [('prefill', 'H100', 64, 16), ('decode', 'A100-80', 64, 16)]
    >>> ov["serving.latency_model"], ov["serving.disaggregation"]
    (None, {})
    """
    own = config.overrides()
    groups = own.pop("serving.replica_groups")
    return {
        "serving.latency_model": None,
        "serving.replica_groups": [{**g, "engine": {**engine, **g["engine"]}} for g in groups],
        "serving.disaggregation": dict(hand),
        **own,
    }


def kv_refusal(config: Configuration, hand: Mapping[str, Any]) -> str | None:
    """Why the KV hand-off of *config* has no size (None: it has one): without
    ``kv_transfer.bytes_per_token`` it is derived from the prefill pool's model on its GPU,
    which needs the model's configuration (the catalogue's ``hardware`` column).

    >>> from simpy_llm.explore.deploy_results import Pool
    >>> c = Configuration(index=0, model="openai/gpt-oss-20b", gpu="H100", tp=1, scheduler="fcfs", max_num_seqs=64,
    ...                   max_num_batched_tokens=2048, chunked_prefill=True, price_per_gpu_hour=3.9492, kv_auto=False,
    ...                   decode=Pool(gpu="H100", tp=1, price_per_gpu_hour=3.9492, kv_auto=False))
    >>> kv_refusal(c, {}).startswith("the model openai/gpt-oss-20b cannot be disaggregated on H100 tp1")
    True
    >>> kv_refusal(c, {"kv_transfer": {"bytes_per_token": 49152}}) is None
    True
    """
    given = hand.get("kv_transfer", {}).get("bytes_per_token")
    if given is not None or config.kv_auto:
        return None
    return (f"the model {config.model} cannot be disaggregated on {config.gpu} tp{config.tp}: its KV hand-off "
            "size needs the model's configuration (the catalogue's hardware column is false); give "
            "serving.disaggregation.kv_transfer.bytes_per_token")


class _Unknown(Exception):  # noqa: N818 - a control-flow signal, not an error
    """A pair's verdict is needed that neither a probe nor monotonicity gives."""


class _PoolRecord:
    """Everything known of one disaggregated configuration: verdicts by ``(P, D)``, probes."""

    def __init__(self) -> None:
        self.verdicts: dict[tuple[int, int], tuple[bool, bool]] = {}
        self.probes: list[dict[str, Any]] = []

    def add(self, job: Mapping[str, Any]) -> None:
        for key, v in job["verdicts"].items():
            p, d = (int(x) for x in key.split(","))
            self.verdicts[(p, d)] = (bool(v[0]), bool(v[1]))
        self.probes.extend(job["probes"])

    def data(self) -> dict[str, Any]:
        return {"verdicts": {f"{p},{d}": list(v) for (p, d), v in sorted(self.verdicts.items())}, "probes": self.probes}

    def meets(self, p: int, d: int) -> bool | None:
        """Whether ``(p, d)`` meets the criteria, probed or implied (None: not known): a
        larger pair failing fails it, a smaller pair passing passes it."""
        if (p, d) in self.verdicts:
            return self.verdicts[(p, d)][1]
        if any(not m and q >= p and e >= d for (q, e), (_s, m) in self.verdicts.items()):
            return False
        if any(m and q <= p and e <= d for (q, e), (_s, m) in self.verdicts.items()):
            return True
        return None

    def failing(self, p: int) -> int:
        """The largest decode count known to fail with *p* prefill replicas (0: none)."""
        return max((e for (q, e), (_s, m) in self.verdicts.items() if not m and q >= p), default=0)

    @property
    def failing_total(self) -> int:
        """The largest ``P + D`` known to fail (0: none)."""
        return max((q + e for (q, e), (_s, m) in self.verdicts.items() if not m), default=0)

    def bound(self, config: Configuration, max_total: int) -> float:
        """The least cost of a pair not known to fail (infinite: every pair is)."""
        costs = [config.cost(p, self.failing(p) + 1) for p in range(1, max_total) if p + self.failing(p) < max_total]
        return min(costs, default=math.inf)

    def passing_cost(self, config: Configuration, max_total: int) -> float:
        """The least cost of a pair known to pass (infinite: none): the configuration costs no
        more, so its search need not look above it (a restart's search does not go further than
        the search that found it, whatever the order)."""
        return min((config.cost(p, d) for (p, d), (_s, m) in self.verdicts.items() if m and p + d <= max_total),
                   default=math.inf)

    def answer(self, config: Configuration, max_total: int, limit: float, bound: bool) -> tuple[int, int] | None:
        """The cheapest passing pair within *limit*, from what is known (:class:`_Unknown`
        if a probe is needed): the pair the search that gathered these verdicts found."""

        def known(p: int, d: int) -> bool:
            verdict = self.meets(p, d)
            if verdict is None:
                raise _Unknown
            return verdict

        return cheapest_pair(known, config.cost, max_total, limit=limit, failing=self.failing, bound=bound)

    def settled(self, config: Configuration, max_total: int, limit: float, bound: bool) -> bool:
        try:
            self.answer(config, max_total, limit, bound)
        except _Unknown:
            return False
        return True

    def found(self, config: Configuration, max_total: int, limit: float, bound: bool) -> tuple[int, int] | None:
        """:meth:`answer` after the search within *limit*: None also if the verdicts leave a
        pair its path needs unknown, which only verdicts breaking the monotonicity the search
        assumes can do (a pair probed later contradicting one inferred earlier)."""
        try:
            return self.answer(config, max_total, limit, bound)
        except _Unknown:
            return None


def _search_pools(
    scenario: Any, overrides: Mapping[str, Any], load: float, window: _Window, criteria: StabilityCriteria,
    seeds: list[int | None], config: Configuration, known: Mapping[str, Any], max_total: int, limit: float, bound: bool,
) -> dict[str, Any]:
    """The cheapest ``(P, D)`` of *config* within *limit* (:func:`cheapest_pair`), given the
    *known* verdicts (``{"P,D": [stable, meets]}``): no pair implied by them is run. Returns
    the new verdicts and probes as data (a job, run in this process or a worker)."""
    record = _PoolRecord()
    record.add({"verdicts": known, "probes": []})
    new: dict[str, list[bool]] = {}
    probes: list[dict[str, Any]] = []
    probers: dict[int, _Prober] = {}

    def passes(p: int, d: int) -> bool:
        verdict = record.meets(p, d)
        if verdict is not None:
            return verdict
        prober = probers.get(p)
        if prober is None:

            def probe(n: float, ov: dict[str, Any], p: int = p) -> Probe:
                return _run_probe(scenario, ov, load=load, replicas=p + int(n), window=window, criteria=criteria)

            prober = probers[p] = _Prober(scenario, {**overrides, PREFILL_KEY: p}, DECODE_KEY, seeds, probe, False,
                                          more_is_harder=False)
        before = len(prober.probes)
        stable, meets = prober(d)
        record.verdicts[(p, d)] = (stable, meets)
        new[f"{p},{d}"] = [stable, meets]
        probes.extend({**x.to_dict(), "prefill_replicas": p} for x in prober.probes[before:])
        return meets

    cheapest_pair(passes, config.cost, max_total, limit=limit, failing=record.failing, bound=bound)
    return {"verdicts": new, "probes": probes}


def _pool_outcome(
    config: Configuration, record: _PoolRecord, *, limit: float, bound: bool, best: tuple[float, int] | None,
    budget: float | None, max_total: int, load: float, skipped: bool,
) -> Outcome:
    """What the search found of one disaggregated configuration searched within *limit*."""
    nan = math.nan
    pair = record.found(config, max_total, limit, bound)
    settled_none = False
    if pair is None:  # beyond the bound: reported if the verdicts show it is the cheapest pair
        try:
            pair = record.answer(config, max_total, math.inf, True)
            settled_none = pair is None
        except _Unknown:
            pair = None
    sims = len(record.probes)
    if pair is not None:
        p, d = pair
        cost = config.cost(p, d)
        at = [x for x in record.probes if x["replicas"] == p + d and x["prefill_replicas"] == p]
        ttft = max((_unjson(x["latency_s"]["ttft_p99"]) for x in at), default=nan)
        tpot = max((_unjson(x["latency_s"]["tpot_p99"]) for x in at), default=nan)
        split = f"{p} prefill + {d} decode replicas"
        if budget is not None and cost > budget:
            status, reason = "over_budget", f"{split} cost {cost:.4g} USD/h > the budget {budget:g}"
        elif best is not None and (cost, config.index) == best:
            status, reason = "cheapest", f"the cheapest meeting the criteria: {split}"
        else:
            assert best is not None  # a feasible configuration within the budget sets best
            status = "costlier"
            reason = (f"{split} cost {cost:.4g} USD/h > {best[0]:.4g}" if cost > best[0]
                      else f"costs the same as the cheapest ({cost:.4g} USD/h), which comes first")
        return Outcome(configuration=config, status=status, min_replicas=p + d, failing_replicas=record.failing_total,
                       cost_per_hour=cost, ttft_p99_s=ttft, tpot_p99_s=tpot, qps_per_usd_hour=load / cost,
                       simulations=sims, reason=reason, prefill_replicas=p, decode_replicas=d)
    if settled_none:
        status, reason = "misses_slo", f"misses the criteria with every P:D split of up to {max_total} replicas"
    else:
        over = budget is not None and limit >= budget
        status = "over_budget" if over else "pruned"
        against = f"the budget {budget:g}" if over else f"the cheapest found ({limit:.4g})"
        if skipped:
            reason = f"skipped: its cheapest split not known to fail would cost {record.bound(config, max_total):.4g} USD/h > {against}"
        else:
            reason = f"every P:D split costing no more than {against} fails"
    return Outcome(configuration=config, status=status, min_replicas=None, failing_replicas=record.failing_total,
                   cost_per_hour=nan, ttft_p99_s=nan, tpot_p99_s=nan, qps_per_usd_hour=nan, simulations=sims,
                   reason=reason)
