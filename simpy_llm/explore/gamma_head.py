"""Fitting the latency-aware γ head offline, on oracle labels from simulator sweeps.

:class:`~simpy_llm.policies.latency_head.LatencyHead` is a linear head on the telemetry
vector :data:`~simpy_llm.policies.latency_head.LATENCY_HEAD_FEATURES`; its ``weights`` and
``bias`` are parameters. Seed 003 §6.4.1 fits them offline with scikit-learn on
**oracle labels** produced by simulator sweeps. This module is that procedure:

1. :func:`oracle_labels` sweeps *conditions*: every pair of a round-trip multiplier
   (each draft group's ``network.rtt_ms`` scaled) and an offered-load multiplier (the
   workload's ``aggregate_rate`` scaled). At each condition it simulates every
   candidate action once, the whole workload under one action:

   * **fused** (label ``γ = 1``): ``speculation.mode: fused``, the target drafting with
     its own draft model (``speculation.fused``) at a static *base γ*;
   * **distributed γ = g** for each g of ``gammas``: ``speculation.mode: distributed``
     with ``gamma_policy: {kind: static, params: {gamma: g}}``.

   A run's latency is the mean TPOT of its completed requests
   (``summary()["latency_s"]["tpot"]["mean"]``). The condition's label is the action
   of least latency among those whose latency meets the TPOT SLO (the tightest
   ``tpot_s`` over the scenario's SLO classes), or of least latency overall when none
   meets it (or the scenario sets no TPOT target). Its features are the telemetry of
   the run *distributed at the base γ* at that condition (:func:`oracle_labels` lists
   how each is measured).
   With ``per="arrival"`` each *request* of a condition is labelled instead (below).
2. :func:`fit_head` regresses the label on the features (Huber or least squares: the
   linear head; or a small MLP) and returns the ``params:`` of a ``latency_head`` γ policy.
3. ``python -m simpy_llm.explore.gamma_head SCENARIO --out head.yaml`` does both and writes
   ``{kind: latency_head, params: {...}}``, ready for ``speculation.gamma_policy``.

Using the fitted head: an output of 1 means "run fused" only under ``mode: hybrid``
with ``mode_selector: {kind: gamma_head}``, and that selector decides once per request,
from the head's *first* answer. With :class:`~simpy_llm.policies.latency_head.LatencyHead`'s
defaults (``min_samples: 2``, ``fused_rounds: 2``) the first answer is always
``default_gamma``, so no request would run fused: add ``min_samples: 1`` and
``fused_rounds: 1`` to the params for the fused decision to take effect. In
``distributed`` mode an output of 1 just drafts one token per round.

**Per condition or per arrival.** By default (``per="condition"``) a label belongs to a
whole *condition*: one simulated run per candidate action, the action applied to every
request throughout, and one feature row per condition made of run-level means (the
end-of-run smoothed verify wait and pass time, the run's acceptance rate, the nominal RTT
and draft speed). So the table has ``len(rtt_multipliers) x len(load_multipliers)`` rows,
and the head learns how the best *static* action varies with the operating point.

With ``per="arrival"`` (the seed's "per-arrival oracle") the same runs label each
*request*: every run of a condition draws the same workload (the workload's own random
streams, the scenario's seed), so a request id names the same arrival in each; a request's
label is the action that gave *that request* the least TPOT over the runs (ties: the
smaller γ, fused counting as 1), and its features are the telemetry vector the head would
read at that request's first γ decision in the distributed run at the base γ (recorded by
wrapping that run's static policy; the run itself is unchanged). The table has one row per
(condition, request). It still differs from the seed: each candidate action is applied to
*every* request of its run, not to one request of an otherwise common run (the seed clones
or fast-forwards the simulation per arrival), so a request's TPOT under an action also
reflects the load that action puts on the target from the other requests.

The fused action drafts at the base γ, standing for the seed's "γ = 1" (run fused),
which the head reports as 1.

Every run is a deterministic function of its scenario (the scenario's seed), so the
labels are the same run serially or through any :class:`concurrent.futures.Executor`.

Examples
--------
From the shell, four worker processes::

    python -m simpy_llm.explore.gamma_head scenario.yaml --workers 4 --out head.yaml

writes ``{kind: latency_head, params: {weights: [...], bias: ...}}`` to ``head.yaml``:
put that mapping under the scenario's ``speculation.gamma_policy``. :func:`fit_head`
shows the fit on a hand-made table.
"""

from __future__ import annotations

import argparse
import math
import numbers
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml

from simpy_llm.config.paths import base_dir
from simpy_llm.loading import load_scenario, scenario_from_dict, scenario_to_dict
from simpy_llm.policies.gamma import GammaState, StaticGamma
from simpy_llm.policies.latency_head import LATENCY_HEAD_FEATURES, LatencyHead
from simpy_llm.simulation import Simulation

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import PolicySpec, Scenario
    from simpy_llm.config.speculation import SpeculationConfig
    from simpy_llm.entities import Request
    from simpy_llm.speculative.draft import DraftFleet

__all__ = ["ARRIVAL_LABEL_COLUMNS", "LABEL_COLUMNS", "fit_head", "main", "oracle_labels"]

LABEL_COLUMNS: tuple[str, ...] = (
    *LATENCY_HEAD_FEATURES,
    "gamma_label",
    "latency_label_s",
    "slo_met",
    "rtt_multiplier",
    "load_multiplier",
)
"""Columns of :func:`oracle_labels`' table, in order: the features of
:data:`~simpy_llm.policies.latency_head.LATENCY_HEAD_FEATURES`, then ``gamma_label`` (1: fused,
else the distributed γ), ``latency_label_s`` (mean TPOT of the labelled action, s),
``slo_met`` (whether it meets the TPOT SLO), and the condition's two multipliers."""

ARRIVAL_LABEL_COLUMNS: tuple[str, ...] = (*LABEL_COLUMNS, "request_id")
"""Columns of :func:`oracle_labels`' table with ``per="arrival"``: :data:`LABEL_COLUMNS`, then
the labelled request's id (one row per condition and request)."""

FUSED_LABEL = 1
"""``gamma_label`` of the fused action."""


# ---------------------------------------------------------------------------- one run
class _FirstDecision:
    """A request's γ policy in the base run of a per-arrival sweep: answers as the static policy
    it wraps, and logs, once per request, the features and TPOT target of its first decision
    (the telemetry :class:`~simpy_llm.policies.latency_head.LatencyHead` would read there).

    The answers, and so the run, are those of the static policy alone: the wrapper only builds
    the telemetry the static policy's fast path skips, and reading it changes nothing.
    """

    reads_position_probabilities = False

    def __init__(self, inner: StaticGamma, log: dict[int, tuple[tuple[float, ...], float | None]]) -> None:
        self.inner = inner
        self.gamma = inner.gamma  # the starting γ the mechanism reads, as of the static policy
        self.log = log
        self.request_id: int | None = None

    def bind_request(self, request: Request, scope: object) -> None:
        self.request_id = request.id

    def next_gamma(self, state: GammaState) -> int:
        request_id = self.request_id
        if request_id is not None:
            self.log[request_id] = (LatencyHead.features(state), state.slo_tpot_s)
            self.request_id = None  # the first decision only
        return self.inner.next_gamma(state)


def _recording(fleet: DraftFleet, log: dict[int, tuple[tuple[float, ...], float | None]]) -> None:
    """Wrap every request's γ policy of *fleet* in :class:`_FirstDecision` (the run's policy is static)."""
    make = fleet.new_policy

    def wrapped() -> _FirstDecision:
        inner = make()
        if not isinstance(inner, StaticGamma):
            raise TypeError(f"the base run's γ policy must be static, got {type(inner).__name__}")
        return _FirstDecision(inner, log)

    fleet.new_policy = wrapped


def _simulate(job: tuple[dict[str, Any], str | None, bool, bool]) -> dict[str, Any]:
    """Run one scenario given as plain data; return its latency and telemetry (plain data).

    *job* is ``(scenario_to_dict(scenario), file it was loaded from or None, per request,
    record)``: picklable, so an executor's worker process can run it. A top-level function for
    the same reason. With *per request*, the outcome also holds ``requests``: each measured
    (not warm-up) request's ``(tpot_s, prompt_tokens, output_tokens)`` by id (TPOT NaN when
    it has none). With *record*, ``first``: each request's features and TPOT target at its
    first γ decision, by id.
    """
    data, loaded_from, per_request, record = job
    if loaded_from is None:
        scenario = scenario_from_dict(data, "<oracle_labels>")
    else:
        with base_dir(Path(loaded_from).parent):
            scenario = scenario_from_dict(data, loaded_from)
    sim = Simulation(scenario)
    fleet = sim.draft_fleet
    assert fleet is not None  # the scenario has a speculation section (_check_args)
    first: dict[int, tuple[tuple[float, ...], float | None]] = {}
    if record:
        _recording(fleet, first)
    results = sim.run(progress=False)
    summary = results.summary()
    servers = fleet.servers  # the simulation's replicas: its verify servers
    devices = [d for group in fleet.devices.values() for d in group]
    kv = summary["kv_utilization"]["time_weighted_mean"]
    acceptance = summary["speculation"]["acceptance_rate"]
    tpot = summary["latency_s"]["tpot"]["mean"]
    outcome: dict[str, Any] = {
        "tpot_s": tpot,
        "verify_queue_wait_s": sum(s.queue_wait_s for s in servers) / len(servers),
        "kv_utilization": min(1.0, max(0.0, kv)) if kv is not None and math.isfinite(kv) else 0.0,
        "rtt_s": sum(d.rtt_s for d in devices) / len(devices),
        "acceptance_ewma": float(acceptance) if acceptance is not None else 0.0,
        "draft_step_s": sum(d.drafters[0].draft_token_s for d in devices) / len(devices),
        "verify_step_s": sum(s.pass_s for s in servers) / len(servers),
    }
    if per_request:
        table = results.to_dataframe()
        table = table[table["warm_up"] == 0]
        outcome["requests"] = {
            int(i): (float(t), int(p), int(o))
            for i, t, p, o in zip(table["request_id"], table["tpot_s"], table["prompt_tokens"], table["output_tokens"], strict=True)
        }
    if record:
        outcome["first"] = first
    return outcome


# ---------------------------------------------------------------------------- labels
def _base_gamma(spec: SpeculationConfig) -> int:
    """The scenario's starting γ (*spec*: its ``speculation``): its static policy's
    ``gamma``, else its policy's ``default_gamma``, else 4; clamped to ``[k_min, k_max]``."""
    policy = cast("PolicySpec", spec.gamma_policy)  # what the loader builds for it (the default too)
    params = dict(policy.params)
    gamma = params.get("gamma", 4) if policy.kind == "static" else params.get("default_gamma", 4)
    return max(spec.k_min, min(spec.k_max, int(gamma)))


def _slo_tpot_s(scenario: Scenario) -> float | None:
    """The tightest ``tpot_s`` over the scenario's SLO classes (None: no class sets one)."""
    targets = [t.tpot_s for t in scenario.slo.values() if t.tpot_s is not None]
    return min(targets) if targets else None


def _condition_changes(scenario: Scenario, spec: SpeculationConfig, rtt_multiplier: float, load_multiplier: float) -> dict[str, Any]:
    """Dotted-key changes scaling every draft group's round trip (*spec*: the scenario's
    ``speculation``) and the offered load."""
    changes: dict[str, Any] = {}
    for i, group in enumerate(spec.drafts):
        if group.network is not None:  # no network: a round trip of 0, nothing to scale
            changes[f"speculation.drafts.{i}.network.rtt_ms"] = group.network.rtt_ms * rtt_multiplier
    rate = scenario.workload.aggregate_rate
    if rate is not None:
        changes["workload.aggregate_rate"] = rate * load_multiplier
    elif load_multiplier != 1:
        raise ValueError("workload.aggregate_rate: not set, so the offered load cannot be scaled (use load_multipliers=(1,))")
    return changes


def _action_changes(spec: SpeculationConfig, mode: str, gamma: int) -> dict[str, Any]:
    """Dotted-key changes forcing *mode* at a static *gamma* (*spec*: the scenario's ``speculation``)."""
    changes: dict[str, Any] = {
        "speculation.mode": mode,
        "speculation.mode_selector": None,
        "speculation.gamma_policy": {"kind": "static", "params": {"gamma": gamma}},
    }
    if mode == "distributed" and spec.verify.kv_spill != "fused":
        changes["speculation.fused"] = None  # refused in distributed mode unless KV spills to fused
    return changes


def _check_args(scenario: Scenario, gammas: Sequence[int], rtt: Sequence[float], load: Sequence[float]) -> SpeculationConfig:
    """Check :func:`oracle_labels`' arguments; return the scenario's ``speculation``."""
    spec = scenario.speculation
    if spec is None:
        raise ValueError("speculation: the scenario has no speculation section")
    if spec.fused is None:
        raise ValueError("speculation.fused: required, the fused action (label 1) drafts with the target's own draft model")
    if not gammas:
        raise ValueError("gammas: give at least one distributed γ")
    for g in gammas:
        if isinstance(g, bool) or not isinstance(g, numbers.Integral) or g < 2:
            raise ValueError(f"gammas: each must be an integer >= 2 (1 is the fused label), got {g!r}")
        if not spec.k_min <= g <= spec.k_max:
            raise ValueError(f"speculation.k_max: γ = {g} is outside [k_min, k_max] = [{spec.k_min}, {spec.k_max}] "
                             "(a static γ is clamped there, so its label would be wrong)")
    if len(set(gammas)) != len(gammas):
        raise ValueError(f"gammas: must be unique, got {list(gammas)}")
    for name, values in (("rtt_multipliers", rtt), ("load_multipliers", load)):
        if not values:
            raise ValueError(f"{name}: give at least one multiplier")
        for m in values:
            if not (isinstance(m, (int, float)) and math.isfinite(m) and m >= 0):
                raise ValueError(f"{name}: each must be a finite number >= 0, got {m!r}")
    if any(m <= 0 for m in load):
        raise ValueError("load_multipliers: each must be > 0 (aggregate_rate must stay positive)")
    return spec


def oracle_labels(
    scenario: Scenario,
    rtt_multipliers: Iterable[float] = (0.5, 1, 1.5, 2),
    load_multipliers: Iterable[float] = (0.6, 1.0, 1.3),
    gammas: Iterable[int] = (2, 3, 4, 6),
    executor: Executor | None = None,
    *,
    base_gamma: int | None = None,
    per: str = "condition",
) -> pd.DataFrame:
    """Oracle γ labels of a speculative scenario over a sweep of conditions (module docstring).

    For each condition (each RTT multiplier x each load multiplier, in that nesting
    order) the scenario is changed with :meth:`~simpy_llm.config.schema.Scenario.replace`:
    every draft group's ``network.rtt_ms`` times the RTT multiplier (its jitter, bandwidth
    and faults unchanged; a group without a network has no round trip and stays so) and
    ``workload.aggregate_rate`` times the load multiplier. Then one run per candidate action:

    * fused, label 1: ``mode: fused`` with ``gamma_policy: {kind: static, params: {gamma:
      base γ}}``;
    * distributed, label g for each g of *gammas*: ``mode: distributed`` with a static γ g
      (``speculation.fused`` cleared, as distributed mode refuses it unless
      ``verify.kv_spill: fused``);

    with ``speculation.mode_selector`` cleared (a ``hybrid`` scenario is forced into each
    mode). When the base γ is not among *gammas*, a distributed run at the base γ is added
    for the features only.

    Labelling: a run's latency is its mean TPOT over completed requests
    (``summary()["latency_s"]["tpot"]["mean"]``; a run where none completed with two or
    more output tokens counts as infinitely slow). It meets the SLO when that mean is at
    most the tightest ``tpot_s`` of the scenario's SLO classes (every run meets it when no
    class sets one). The label is the action of least latency among those meeting the SLO,
    else of least latency; ties go to the earlier action in the order fused, then *gammas*
    as given.

    Per arrival (*per* ``"arrival"``): each measured (not warm-up) request of the
    condition is labelled with the action of least TPOT *for that request* (its own
    ``(completion - first token) / (output tokens - 1)``; infinite under an action where it
    has none), ties to the smaller γ (fused as 1); ``slo_met`` compares that TPOT with the
    request's own class target. Its features are those a ``latency_head`` reads at the
    request's first γ decision in the distributed run at the base γ (the
    :class:`~simpy_llm.policies.gamma.GammaState` there); a request that made no γ decision
    there (one output token, or dropped) or has no TPOT under any action gets no row.

    Features per condition, from the distributed run at the base γ at that condition, each a plain float:

    * ``verify_queue_wait_s``: mean over the verify servers of their smoothed verify
      queue wait (``VerifyServer.queue_wait_s``) at the end of the run;
    * ``kv_utilization``: ``summary()["kv_utilization"]["time_weighted_mean"]`` (0.0 when
      not a number). Note that a verify server reports its KV use only while a pass runs;
      KV held while it idles (waiting for bundles) adds nothing to this mean;
    * ``rtt_s``: the scaled round trip, mean over every draft device (so over the groups
      weighted by their ``count``), 0 for a group without a network;
    * ``acceptance_ewma``: the run's ``summary()["speculation"]["acceptance_rate"]`` (0.0
      when no round ran);
    * ``draft_step_s``: each device's first drafter's time per draft token, mean over every
      device;
    * ``verify_step_s``: mean over the verify servers of their smoothed pass time
      (``VerifyServer.pass_s``);
    * ``slo_tpot_s``: the tightest TPOT target (0.0 without one);
    * ``gamma``: the base γ.

    Parameters
    ----------
    scenario
        A scenario with a ``speculation`` section that has a ``fused`` section.
    rtt_multipliers
        Factors on every draft group's ``network.rtt_ms`` (>= 0).
    load_multipliers
        Factors on ``workload.aggregate_rate`` (> 0; only 1 when the workload sets no
        ``aggregate_rate``). Draft devices run closed loop (one request at a time each), so
        the load a target sees is bounded by the devices as well.
    gammas
        The distributed candidates, integers >= 2 within ``[k_min, k_max]``.
    executor
        When given, runs go through ``executor.map`` (e.g. a
        :class:`~concurrent.futures.ProcessPoolExecutor`); each is sent as plain data (the
        scenario's :func:`~simpy_llm.config.plain.scenario_to_dict`), so custom policies a
        worker process cannot import are not available there. Otherwise runs are serial.
        The table is the same either way.
    base_gamma
        γ of the fused action and of the feature run (and the ``gamma`` feature). Default:
        the scenario's static ``gamma``, else its γ policy's ``default_gamma``, else 4,
        clamped to ``[k_min, k_max]``.
    per
        ``"condition"`` (one row per condition) or ``"arrival"`` (one per request of each
        condition).

    Returns
    -------
    pandas.DataFrame
        One row per condition, columns :data:`LABEL_COLUMNS`; per arrival, one row per
        condition and request (in that order, requests by id), columns
        :data:`ARRIVAL_LABEL_COLUMNS`.

    Raises
    ------
    ValueError
        If the scenario lacks ``speculation`` or ``speculation.fused``, a candidate γ is
        invalid or outside ``[k_min, k_max]``, a multiplier is invalid, *per* is unknown,
        every action of a condition completed no request (per condition), or a request id
        has other lengths in two runs of a condition (per arrival).

    Examples
    --------
    Four phones 20 ms from one target: with no round trip distributed γ = 4 wins; at
    200 ms every round pays it, and fused wins.

    >>> from simpy_llm import scenario_from_dict
    >>> drafter = {"name": "d", "acceptance": "illustrative-mobile", "draft_token_ms": 0.5}
    >>> client = {"id": "c", "arrival": {"process": "poisson"},
    ...           "input_distribution": {"type": "constant", "params": {"value": 128}},
    ...           "output_distribution": {"type": "constant", "params": {"value": 32}}}
    >>> scenario = scenario_from_dict({
    ...     "workload": {"aggregate_rate": 5.0, "num_requests": 20, "clients": [client]},
    ...     "serving": {"replicas": 1, "latency_model": {"kind": "blis_linear",
    ...                                                  "params": {"beta0_us": 5000.0, "beta2_us": 200.0}}},
    ...     "speculation": {"mode": "fused", "k_max": 6, "temperature": 0.0,
    ...                     "drafts": [{"name": "phones", "count": 4, "network": {"rtt_ms": 20}, "drafters": [drafter]}],
    ...                     "fused": {"draft_token_ms": 1.0, "acceptance": "illustrative-mobile"}},
    ... })
    >>> labels = oracle_labels(scenario, rtt_multipliers=(0, 10), load_multipliers=(1,), gammas=(2, 4))
    >>> labels["rtt_s"].round(3).tolist(), labels["gamma_label"].tolist(), labels["slo_met"].tolist()
    ([0.0, 0.2], [4, 1], [True, True])

    Per arrival, each of the 20 requests at each round trip gets its own label:

    >>> per_request = oracle_labels(scenario, rtt_multipliers=(0, 10), load_multipliers=(1,), gammas=(2, 4), per="arrival")
    >>> per_request.groupby("rtt_multiplier")["gamma_label"].value_counts().to_dict()
    {(0.0, 4): 10, (0.0, 2): 6, (0.0, 1): 4, (10.0, 1): 20}
    """
    import pandas as pd

    if per not in ("condition", "arrival"):
        raise ValueError(f"per: must be 'condition' or 'arrival', got {per!r}")
    rtt = [float(m) for m in rtt_multipliers]
    load = [float(m) for m in load_multipliers]
    gammas = [int(g) if isinstance(g, numbers.Integral) and not isinstance(g, bool) else g for g in gammas]
    spec = _check_args(scenario, gammas, rtt, load)
    base = _base_gamma(spec) if base_gamma is None else int(base_gamma)
    if not spec.k_min <= base <= spec.k_max:
        raise ValueError(f"base_gamma: must be within [k_min, k_max] = [{spec.k_min}, {spec.k_max}], got {base}")
    slo = _slo_tpot_s(scenario)
    actions = [("fused", base, FUSED_LABEL)] + [("distributed", g, g) for g in gammas]
    probe = None if base in gammas else ("distributed", base, None)  # features only
    feature_run = len(actions) if probe is not None else 1 + gammas.index(base)
    loaded_from = scenario.loaded_from
    arrival = per == "arrival"

    conditions = [(r, m) for r in rtt for m in load]
    jobs = []
    for r, m in conditions:
        scaled = _condition_changes(scenario, spec, r, m)
        for i, (mode, gamma, _label) in enumerate(actions + ([probe] if probe else [])):
            variant = scenario.replace(**scaled, **_action_changes(spec, mode, gamma))
            jobs.append((scenario_to_dict(variant), loaded_from, arrival, arrival and i == feature_run))
    outcomes = list(executor.map(_simulate, jobs)) if executor is not None else [_simulate(j) for j in jobs]

    per_condition = len(actions) + (probe is not None)
    rows = []
    for c, (r, m) in enumerate(conditions):
        runs = outcomes[c * per_condition:(c + 1) * per_condition]
        if arrival:
            rows += _arrival_rows(runs, feature_run, actions, r, m)
            continue
        latencies = [math.inf if o["tpot_s"] is None else float(o["tpot_s"]) for o in runs[: len(actions)]]
        if all(math.isinf(x) for x in latencies):
            raise ValueError(f"condition rtt x{r:g}, load x{m:g}: no action completed a request with two or more output tokens")
        met = [slo is None or x <= slo for x in latencies]
        pool = [i for i, ok in enumerate(met) if ok] or list(range(len(actions)))
        best = min(pool, key=lambda i: (latencies[i], i))
        telemetry = runs[feature_run]
        features = {name: float(telemetry[name]) for name in LATENCY_HEAD_FEATURES[:6]}
        features["slo_tpot_s"] = 0.0 if slo is None else float(slo)
        features["gamma"] = float(base)
        rows.append({
            **features,
            "gamma_label": actions[best][2],
            "latency_label_s": latencies[best],
            "slo_met": bool(met[best]) and not math.isinf(latencies[best]),
            "rtt_multiplier": r,
            "load_multiplier": m,
        })
    frame = pd.DataFrame(rows, columns=list(ARRIVAL_LABEL_COLUMNS if arrival else LABEL_COLUMNS))
    return frame.astype({"gamma_label": "int64", "slo_met": "bool"} | ({"request_id": "int64"} if arrival else {}))


def _arrival_rows(
    runs: list[dict[str, Any]], feature_run: int, actions: list[tuple[str, int, int]], rtt: float, load: float,
) -> list[dict[str, Any]]:
    """One condition's rows of a per-arrival table: one per request with a recorded first decision
    in the feature run and a TPOT under some action (module docstring)."""
    first = runs[feature_run]["first"]
    per_action = [run["requests"] for run in runs[: len(actions)]]
    reference = runs[feature_run]["requests"]
    rows = []
    for request_id in sorted(first):
        if request_id not in reference:  # a warm-up request: not labelled
            continue
        shape = reference[request_id][1:]
        latencies = []
        for requests in per_action:
            outcome = requests.get(request_id)
            if outcome is not None and outcome[1:] != shape:
                raise ValueError(f"condition rtt x{rtt:g}, load x{load:g}: request {request_id} has other lengths in another "
                                 "action's run; per-arrival labels need the same workload in every run")
            tpot = math.inf if outcome is None or not math.isfinite(outcome[0]) else outcome[0]
            latencies.append(tpot)
        if all(math.isinf(x) for x in latencies):
            continue  # no action gave it a time per output token
        best = min(range(len(actions)), key=lambda i: (latencies[i], actions[i][2]))  # ties: the smaller γ
        features, target = first[request_id]
        rows.append({
            **dict(zip(LATENCY_HEAD_FEATURES, map(float, features), strict=True)),
            "gamma_label": actions[best][2],
            "latency_label_s": latencies[best],
            "slo_met": target is None or latencies[best] <= target,
            "rtt_multiplier": rtt,
            "load_multiplier": load,
            "request_id": request_id,
        })
    return rows


# ---------------------------------------------------------------------------- fitting
def fit_head(
    labels: pd.DataFrame,
    *,
    loss: str = "huber",
    hidden: Sequence[int] = (16,),
    activation: str = "relu",
    random_state: int = 0,
    alpha: float = 1e-4,
    max_iter: int = 5000,
) -> dict[str, Any]:
    """Fit the latency head on a label table; returns the ``params:`` of a ``latency_head``.

    Regresses ``gamma_label`` on the columns :data:`~simpy_llm.policies.latency_head.LATENCY_HEAD_FEATURES`
    of *labels* (other columns are ignored) with scikit-learn:

    * ``loss="huber"``, a :class:`~sklearn.linear_model.HuberRegressor` (default ``epsilon``
      1.35, ``alpha`` 1e-4, up to 1000 iterations), robust to a few odd labels, and
      ``loss="l2"``, ordinary least squares (:class:`~sklearn.linear_model.LinearRegression`):
      the linear head, ``{weights, bias}``;
    * ``loss="mlp"``, an :class:`~sklearn.neural_network.MLPRegressor` with the hidden layers
      *hidden* (units per layer), *activation* (``relu`` or ``tanh``), squared loss with L2
      penalty *alpha*, the L-BFGS solver (suited to tables of a few thousand rows) for up to
      *max_iter* iterations, and ``random_state`` *random_state* (its initial weights), so the
      same table gives the same params: the MLP head,
      ``{layers: [{weights, bias}, ...], activation}``
      (:class:`~simpy_llm.policies.latency_head.LatencyMlp`).

    Each feature is standardised before the fit (a constant one is only centred) and the
    result mapped back, so the params apply to raw features as the head reads them: the
    linear weights are divided by the feature scales, and for the MLP the standardisation is
    folded into the first layer (``W / scale`` column by column, ``b - (W / scale) · mean``);
    the label is standardised too for the MLP and mapped back in its last layer. No
    ``mean``/``scale`` params are needed. A feature that does not vary in the table (e.g.
    ``gamma`` or ``slo_tpot_s`` from one sweep) gets weight 0: its effect is in the biases. A
    table of few rows (the default per-condition sweep gives 12 for 8 features) is nearly
    determined: a feature that varies only by noise (a smoothed wait of 1e-9 s in one run,
    1e-5 s in another) can get a very large weight. Sweep more conditions, label per arrival
    (:func:`oracle_labels`), or check the head's outputs on the table before using it.

    The head's other parameters (``history``, ``min_samples``, ``default_gamma``,
    ``smoothing``, ``fused_below``, ``fused_rounds``, ``history_scope``) are not fitted and
    keep their defaults unless the caller adds them.

    Parameters
    ----------
    labels
        A table with the feature columns and ``gamma_label`` (:func:`oracle_labels`), at
        least two rows.
    loss
        ``"huber"``, ``"l2"`` or ``"mlp"``.
    hidden
        ``"mlp"`` only: units of each hidden layer, first to last (each >= 1, at least one layer).
    activation
        ``"mlp"`` only: ``"relu"`` or ``"tanh"``.
    random_state
        ``"mlp"`` only: seed of the initial weights.
    alpha
        ``"mlp"`` only: L2 penalty (>= 0).
    max_iter
        ``"mlp"`` only: most L-BFGS iterations (>= 1).

    Raises
    ------
    ImportError
        If scikit-learn is not installed (the ``learn`` extra).
    ValueError
        If *loss* is unknown, an MLP setting is invalid, a column is missing, the table has
        fewer than two rows or a value is not finite.

    Examples
    --------
    A hand-made table whose label falls by 20 tokens per second of round trip (not run as
    a doctest: importing scikit-learn alone takes about a second; the unit tests check it)::

        rows = [dict.fromkeys(LATENCY_HEAD_FEATURES, 0.0) | {"rtt_s": r, "gamma_label": 6 - 20 * r}
                for r in (0.0, 0.1, 0.2)]
        params = fit_head(pd.DataFrame(rows), loss="l2")
        # params["weights"][2] == -20.0 and params["bias"] == 6.0 (to rounding)
        head = gamma_policies.get("latency_head")(**params)
        mlp = fit_head(pd.DataFrame(rows), loss="mlp", hidden=(8,))
        # {"layers": [{"weights": 8 rows of 8, "bias": 8}, {"weights": [[8 floats]], "bias": [1 float]}], "activation": "relu"}
        head = LatencyHead.from_params(mlp)
    """
    if loss not in ("huber", "l2", "mlp"):
        raise ValueError(f"loss: must be 'huber', 'l2' or 'mlp', got {loss!r}")
    if loss == "mlp":
        if not hidden or any(isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1 for h in hidden):
            raise ValueError(f"hidden: give one or more layer sizes, each an integer >= 1, got {list(hidden)!r}")
        if activation not in ("relu", "tanh"):
            raise ValueError(f"activation: must be 'relu' or 'tanh', got {activation!r}")
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha: must be a finite number >= 0, got {alpha!r}")
        if max_iter < 1:
            raise ValueError(f"max_iter: must be >= 1, got {max_iter!r}")
    try:
        from sklearn.linear_model import HuberRegressor, LinearRegression
        from sklearn.neural_network import MLPRegressor
    except ImportError as exc:
        raise ImportError(
            "fit_head needs scikit-learn: install the learn extra (pip install 'simpy-llm[learn]')"
        ) from exc
    import numpy as np

    missing = [c for c in (*LATENCY_HEAD_FEATURES, "gamma_label") if c not in labels.columns]
    if missing:
        raise ValueError(f"labels: missing columns {', '.join(missing)}")
    if len(labels) < 2:
        raise ValueError(f"labels: need at least two rows to fit, got {len(labels)}")
    x = labels[list(LATENCY_HEAD_FEATURES)].to_numpy(dtype=np.float64)
    y = labels["gamma_label"].to_numpy(dtype=np.float64)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("labels: every feature and gamma_label must be a finite number")
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    constant = scale <= 1e-12 * np.maximum(1.0, np.abs(mean))
    scale[constant] = 1.0
    z = (x - mean) / scale
    z[:, constant] = 0.0
    if loss == "mlp":
        y_mean, y_scale = float(y.mean()), float(y.std()) or 1.0
        net = MLPRegressor(
            hidden_layer_sizes=tuple(int(h) for h in hidden), activation=activation, solver="lbfgs",
            alpha=alpha, max_iter=max_iter, random_state=random_state,
        )
        net.fit(z, (y - y_mean) / y_scale)
        # sklearn's coefs_[i] is (inputs, units): the head's rows are units, so transpose.
        matrices = [np.asarray(c, dtype=np.float64).T for c in net.coefs_]
        biases = [np.asarray(b, dtype=np.float64) for b in net.intercepts_]
        first = np.where(constant, 0.0, matrices[0] / scale)  # z = (x - mean) / scale, folded in
        matrices[0], biases[0] = first, biases[0] - first @ mean
        matrices[-1], biases[-1] = matrices[-1] * y_scale, biases[-1] * y_scale + y_mean  # the label's scale
        layers = [
            {"weights": [[float(w) for w in row] for row in m], "bias": [float(b) for b in v]}
            for m, v in zip(matrices, biases, strict=True)
        ]
        return {"layers": layers, "activation": activation}
    model = HuberRegressor(max_iter=1000) if loss == "huber" else LinearRegression()
    model.fit(z, y)
    weights = np.where(constant, 0.0, model.coef_ / scale)
    bias = float(model.intercept_) - float(np.dot(weights, mean))
    return {"weights": [float(w) for w in weights], "bias": bias}


# ---------------------------------------------------------------------------- CLI
def _floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m simpy_llm.explore.gamma_head SCENARIO [--out FILE] [--workers N] [--model linear|mlp] [--per condition|arrival]``.

    Sweeps :func:`oracle_labels` (through a :class:`~concurrent.futures.ProcessPoolExecutor`
    of N workers when N > 1; ``--per arrival``: one row per request of each condition), prints
    the label table (per arrival: the count of each label per condition), writes it to
    ``--labels`` when given (with a first column ``scenario_id``, the scenario's ``name`` or
    its file's stem; Parquet for a ``.parquet`` name, else CSV), fits :func:`fit_head`, and writes
    ``{kind: latency_head, params: {weights: [...], bias: ...}}`` (``--model mlp``:
    ``params: {layers: [...], activation: ...}``, hidden sizes ``--hidden``) to ``--out``
    (standard output without it), usable as the scenario's ``speculation.gamma_policy``.
    """
    parser = argparse.ArgumentParser(
        prog="python -m simpy_llm.explore.gamma_head",
        description="Fit the latency_head γ policy on oracle labels from simulator sweeps (seed 003 §6.4.1).",
    )
    parser.add_argument("scenario", help="scenario YAML with a speculation section that has a fused section")
    parser.add_argument("--out", help="write the gamma_policy YAML here (default: standard output)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes for the runs (default 1: serial)")
    parser.add_argument("--rtt", type=_floats, default=[0.5, 1, 1.5, 2], help="RTT multipliers, comma-separated")
    parser.add_argument("--load", type=_floats, default=[0.6, 1.0, 1.3], help="offered-load multipliers, comma-separated")
    parser.add_argument("--gammas", type=_ints, default=[2, 3, 4, 6], help="distributed γ candidates, comma-separated")
    parser.add_argument("--loss", choices=("huber", "l2"), default="huber", help="the linear head's regression loss (default huber)")
    parser.add_argument("--model", choices=("linear", "mlp"), default="linear", help="the head: linear (default) or a small MLP")
    parser.add_argument("--hidden", type=_ints, default=[16], help="MLP hidden layer sizes, comma-separated (default 16)")
    parser.add_argument("--activation", choices=("relu", "tanh"), default="relu", help="MLP activation (default relu)")
    parser.add_argument("--per", choices=("condition", "arrival"), default="condition",
                        help="one label per condition (default) or per request of each condition")
    parser.add_argument("--labels", help="also write the label table here, with a scenario_id column (.parquet, else CSV)")
    args = parser.parse_args(argv)

    scenario = load_scenario(args.scenario)
    if args.workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            labels = oracle_labels(scenario, args.rtt, args.load, args.gammas, executor=pool, per=args.per)
    else:
        labels = oracle_labels(scenario, args.rtt, args.load, args.gammas, per=args.per)
    if args.per == "condition":
        print(labels.to_string(index=False))
    else:  # one row per request: the labels' counts per condition
        counts = labels.groupby(["rtt_multiplier", "load_multiplier"])["gamma_label"].value_counts().unstack(fill_value=0)
        print(counts.to_string())
    if args.labels:
        table = labels.copy()
        table.insert(0, "scenario_id", scenario.name or Path(args.scenario).stem)
        if args.labels.endswith(".parquet"):
            table.to_parquet(args.labels, index=False)
        else:
            table.to_csv(args.labels, index=False)
        print(f"wrote {args.labels}", file=sys.stderr)
    if args.model == "mlp":
        params = fit_head(labels, loss="mlp", hidden=args.hidden, activation=args.activation)
    else:
        params = fit_head(labels, loss=args.loss)
    policy = {"kind": "latency_head", "params": params}
    text = yaml.safe_dump(policy, sort_keys=False)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
