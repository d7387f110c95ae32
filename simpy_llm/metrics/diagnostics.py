"""Run diagnostics: warnings about a run whose figures would mislead if read at face value.

:func:`diagnose` reads a finished run (its records, the engine's counters and the
latency models its scenario names) and returns a list of :class:`Diagnostic`, each
with a stable ``code``, a ``severity`` (``"warning"``: the figures do not mean what
they seem; ``"info"``: worth knowing when reading them), a message in plain words
that quotes the figures, and the figures themselves. A healthy run gets an empty
list: low KV use, no preemption or every SLO met are not problems by themselves
and are not reported.

============================= ======== ================================================
code                          severity fires when
============================= ======== ================================================
``overload``                  warning  the replicas' waiting queues grow throughout
                                       the arrival window (:func:`overload`)
``step_below_weight_read``    warning  the latency model's step for one decoding
                                       request is under half the time it takes to
                                       read its weights at peak bandwidth
``post_processing_dominates`` warning  the per-output-token overhead (BLIS's
                                       ``alpha2``) exceeds the decode step at the
                                       run's mean batch
``idle_engine``               info     the engines were busy less than 5 % of the run
============================= ======== ================================================

Examples
--------
The BLIS H100 TP4 profile of Llama-3.1-8B fits a 42 µs step intercept and 6 ms of
post-processing per output token; both show:

>>> from simpy_llm import Simulation, load_scenario
>>> overrides = ["workload.num_requests=200", "serving.latency_model.params.tp=4"]
>>> results = Simulation(load_scenario("scenarios/quickstart.yaml", overrides)).run()
>>> [d.code for d in diagnose(results)]
['step_below_weight_read', 'post_processing_dominates']
>>> print(diagnose(results)[1].message)  # doctest: +ELLIPSIS
Post-processing dominates TPOT (group 'default'): the latency model adds 6.00 ms per output token ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

if TYPE_CHECKING:
    from simpy_llm.metrics.results import Results
    from simpy_llm.serving.fleet import ReplicaPlan

__all__ = [
    "IDLE_UTILIZATION",
    "OVERLOAD_EXCESS_SHARE",
    "OVERLOAD_MIN_REQUESTS",
    "STEP_FLOOR_SHARE",
    "Diagnostic",
    "diagnose",
    "idle_engine",
    "latency_model_oddities",
    "overload",
    "overload_judged",
]

OVERLOAD_EXCESS_SHARE = 0.05
"""Least share of the offered requests the fleet must fail to start for ``overload``."""
OVERLOAD_MIN_REQUESTS = 300
"""Fewest arrivals for ``overload`` to be judged at all."""
STEP_FLOOR_SHARE = 0.5
"""``step_below_weight_read`` fires when a one-request step is below this share of the
time to read the weights it needs at peak bandwidth."""
IDLE_UTILIZATION = 0.05
"""``idle_engine`` fires below this mean engine utilisation (busy time / run duration)."""

_SEVERITIES = ("warning", "info")


@attrs.frozen(kw_only=True)
class Diagnostic:
    """One finding about a run."""

    code: str
    """Stable identifier (``overload``, ``step_below_weight_read``, ``post_processing_dominates``,
    ``idle_engine``)."""
    severity: str = attrs.field(validator=attrs.validators.in_(_SEVERITIES))
    """``warning`` (the figures do not mean what they seem) or ``info``."""
    message: str
    """What was found, in plain words, with the figures."""
    figures: dict[str, float] = attrs.field(factory=dict)
    """The figures behind the message, by name (units in the names): numbers only, so
    they fit a JSON summary and its long format as they are."""
    group: str | None = None
    """The replica group the finding is about (``None``: the run as a whole)."""

    def to_dict(self) -> dict[str, Any]:
        """The diagnostic as plain data (what ``Results.summary()`` lists).

        Examples
        --------
        >>> Diagnostic(code="idle_engine", severity="info", message="m", figures={"x": 1.0}).to_dict()
        {'code': 'idle_engine', 'severity': 'info', 'message': 'm', 'figures': {'x': 1.0}, 'group': None}
        """
        return attrs.asdict(self)


def diagnose(results: Results, *, plans: Sequence[ReplicaPlan] | None = None) -> list[Diagnostic]:
    """Everything worth warning about in *results*, in a fixed order: overload, the
    latency models' oddities (group by group), idle engines.

    *plans* is the fleet the run used (``Simulation.plans``); by default it is planned
    again from ``results.scenario`` (so a latency model passed to ``Simulation`` in
    place of the scenario's is not seen unless given here). Reads *results* only.
    """
    found: list[Diagnostic] = []
    over = overload(results)
    if over is not None:
        found.append(over)
    if plans is None:
        from simpy_llm.serving.fleet import plan_fleet

        try:
            plans = plan_fleet(results.scenario.serving)
        except ValueError:
            # A hand-built Results may name a fleet that cannot be planned; the run's
            # own figures are still worth diagnosing.
            plans = []
    found.extend(latency_model_oddities(results, plans))
    idle = idle_engine(results)
    if idle is not None:
        found.append(idle)
    return found


# --- overload ------------------------------------------------------------------
def _time_weighted_medians(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> list[float]:
    """Time-weighted median of the number of intervals ``[start_i, end_i)`` open,
    over each ``[edges[k], edges[k + 1])``."""
    times = np.concatenate([start, end])
    deltas = np.concatenate([np.ones(start.size), -np.ones(end.size)])
    order = np.argsort(times, kind="stable")
    times = times[order]
    # Level on [bounds[j], bounds[j + 1]): 0 before the first change.
    levels = np.concatenate([[0.0], np.cumsum(deltas[order])])
    bounds = np.concatenate([[-np.inf], times, [np.inf]])
    out = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        durations = np.clip(bounds[1:], a, b) - np.clip(bounds[:-1], a, b)
        keep = durations > 0
        lv, du = levels[keep], durations[keep]
        by_level = np.argsort(lv, kind="stable")
        cum = np.cumsum(du[by_level])
        out.append(float(lv[by_level][np.searchsorted(cum, 0.5 * cum[-1])]))
    return out


def overload_judged(results: Results) -> bool:
    """Whether :func:`overload` can judge *results* at all: at least
    :data:`OVERLOAD_MIN_REQUESTS` arrivals, spread over an arrival window of some length.
    When it cannot, "no ``overload`` diagnostic" means "not known", not "not overloaded".

    Examples
    --------
    >>> from simpy_llm import Simulation, load_scenario
    >>> few = Simulation(load_scenario("scenarios/quickstart.yaml", {"workload.num_requests": 50})).run()
    >>> overload_judged(few), overload(few) is None
    (False, True)
    """
    arrival = np.asarray(results.columns["arrival_s"], dtype=np.float64)
    return arrival.size >= OVERLOAD_MIN_REQUESTS and float(arrival.max()) > float(arrival.min())


def overload(results: Results) -> Diagnostic | None:
    """``overload`` when the fleet cannot keep up with the offered load, else None.

    The evidence is the number of requests waiting in the replicas' queues (from
    entering a waiting queue to their first step; a request never scheduled waits to
    the end), rebuilt from the records. The arrival window (first to last arrival) is
    cut in thirds and the waiting count's *time-weighted median* taken over each:
    ``W1``, ``W2``, ``W3``. It fires when

    * the run has at least :data:`OVERLOAD_MIN_REQUESTS` arrivals;
    * ``W1 < W2 < W3``: the queue grows through the whole window, not in one spell;
    * ``(W3 - W1) / (2/3 of the window) / arrival rate >= OVERLOAD_EXCESS_SHARE``.

    Why these. In a fluid model of overload, arrivals at rate λ and first steps at
    the fleet's rate μ < λ make the queue grow at λ − μ, so the median of each third
    rises by (λ − μ) × window / 3 and the last ratio estimates 1 − μ/λ, the share of
    offered requests the fleet cannot start; 0.05 means the offered load is at
    least ~5 % above capacity. In a stable run the queue empties again: its median
    over a third moves only if the queue stays up for more than half of that third,
    so a burst whose backlog (the burst and the time it takes to drain) lasts less
    than a sixth of the window cannot raise the medians, and two rises in a row are
    needed besides. Random wandering of a stable queue by *k*
    requests gives a ratio of about k / (2n/3) for *n* arrivals: with n ≥ 300 it
    takes a monotone wander of 10 requests to reach 0.05. A run that sheds load
    (admission drops) or serves closed-loop sessions keeps its queue bounded and is
    not flagged; its drops and latencies say what happened.

    A run overloaded only in its busiest spell (a daily peak followed by a quiet
    night) is not flagged unless its queue keeps growing through all three thirds:
    the queue drains, and the latency figures show the spell.
    """
    if not overload_judged(results):
        return None
    c = results.columns
    arrival = np.asarray(c["arrival_s"], dtype=np.float64)
    n = arrival.size
    a0, a1 = float(arrival.min()), float(arrival.max())
    window = a1 - a0
    enqueue = np.asarray(c["enqueue_s"], dtype=np.float64)
    scheduled = np.asarray(c["first_scheduled_s"], dtype=np.float64)
    queued = (c["status"] != "dropped") & np.isfinite(enqueue)
    start = enqueue[queued]
    end = np.where(np.isnan(scheduled[queued]), np.inf, scheduled[queued])
    edges = np.linspace(a0, a1, 4)
    w1, w2, w3 = _time_weighted_medians(start, end, edges)
    rate = n / window
    excess = (w3 - w1) / (2 * window / 3) / rate
    if not (w1 < w2 < w3 and excess >= OVERLOAD_EXCESS_SHARE):
        return None
    started = int(((scheduled >= a0) & (scheduled <= a1)).sum())
    return Diagnostic(
        code="overload",
        severity="warning",
        message=(
            f"Overload: the offered load exceeds the fleet's capacity. Requests waiting in the "
            f"replicas' queues grew from a median of {w1:.0f} over the first third of the arrival "
            f"window ({a0:.0f}-{edges[1]:.0f} s) to {w2:.0f} over the middle third and {w3:.0f} over "
            f"the last ({edges[2]:.0f}-{a1:.0f} s): about {excess:.0%} of the {rate:.3g} requests/s "
            f"offered could not be started ({started / window:.3g}/s were). Queueing delay and every "
            f"latency figure grow with the length of the run; add replicas, lower the rate, or "
            f"shed load with an admission policy."
        ),
        figures={
            "arrival_window_start_s": a0,
            "arrival_window_end_s": a1,
            "arrival_rate_per_s": rate,
            "started_per_s": started / window,
            "waiting_median_first_third": w1,
            "waiting_median_middle_third": w2,
            "waiting_median_last_third": w3,
            "excess_share": excess,
            "threshold_excess_share": OVERLOAD_EXCESS_SHARE,
        },
    )


# --- latency models ----------------------------------------------------------------
def _mean_batch(results: Results) -> float:
    steps = results._recorder.batch_steps  # noqa: SLF001 - the engine's step tally lives there
    total = sum(steps.values())
    if total == 0:
        return 1.0
    return max(1.0, sum(size * n for size, n in steps.items()) / total)


def _mean_context_tokens(results: Results) -> float:
    """Mean KV context of a decoding request: its prompt plus half its output."""
    c = results.columns
    served = c["status"] != "dropped"
    if not served.any():
        return 0.0
    return float(np.mean(c["prompt_tokens"][served] + 0.5 * c["output_tokens"][served]))


def _decode_step_s(latency: Any, batch: int, context_tokens: float) -> float:
    if getattr(latency, "uses_context", False):
        return float(latency.step_time_s(0, batch, decode_context_tokens=int(round(batch * context_tokens))))
    return float(latency.step_time_s(0, batch))


def _weight_read_s(hardware: Any) -> float:
    """The roofline's step of one decoding request without context at peak bandwidth
    (``mbu`` 1): the weights a one-token step must read (an MoE layer's routed experts
    only), the LM head and the all-reduces; a lower bound on any real step."""
    from simpy_llm.serving.roofline import Roofline

    gpu = hardware.gpu
    return Roofline(hardware=hardware, mfu=gpu.mfu_prefill, mfu_decode=gpu.mfu_decode).step_time_s(0, 1)


def _describe(latency: Any) -> str:
    kind = type(latency).__name__
    names = [f"{k}={getattr(latency, k)}" for k in ("model", "gpu", "tp") if getattr(latency, k, None) is not None]
    return f"{kind}({', '.join(names)})" if names else kind


def latency_model_oddities(results: Results, plans: Sequence[ReplicaPlan]) -> list[Diagnostic]:
    """``step_below_weight_read`` and ``post_processing_dominates`` for each replica group of *plans*.

    * ``step_below_weight_read`` (warning): for a latency model that names its
      hardware, the step of one decoding request (``step_time_s(0, 1)``, with the
      run's mean context for context-aware models) is shorter than half the time it
      takes to read the weights that step needs once at the GPU's peak memory
      bandwidth (the roofline of that step at ``mbu`` 1: every layer's weights, only
      the routed experts of an MoE layer, the LM head, not the embedding table).
      That read is a lower bound on any real step; a fit may dip a little below it at
      small batches, but at less than half of it the profile is wrong by more than a
      factor of two where small batches live: they finish too soon, and queues, batch
      sizes and KV use come out too small. (BLIS's H100 TP4 fit for Llama-3.1-8B:
      48 µs against 1.1 ms.)
    * ``post_processing_dominates`` (warning): the per-output-token overhead
      (``output_token_overhead_s``, BLIS's ``alpha2``), which the engine adds to every
      token the client sees, exceeds the GPU's decode step at the run's mean batch
      size. Then most of TPOT (and of a long answer's latency) is a fitted constant
      that no batching, KV or load setting moves.
    """
    found: list[Diagnostic] = []
    seen: set[str] = set()
    batch = _mean_batch(results)
    context = _mean_context_tokens(results)
    for plan in plans:
        if plan.group in seen or plan.batch_server is not None:
            continue  # a batch server's latency model (if any) runs static batches, not engine steps
        seen.add(plan.group)
        latency = plan.latency
        one_step_s = _decode_step_s(latency, 1, context)
        hardware = getattr(latency, "hardware", None)
        if hardware is not None:
            weight_s = _weight_read_s(hardware)
            if one_step_s < STEP_FLOOR_SHARE * weight_s:
                found.append(
                    Diagnostic(
                        code="step_below_weight_read",
                        severity="warning",
                        message=(
                            f"Implausibly fast steps (group {plan.group!r}): {_describe(latency)} gives "
                            f"{one_step_s * 1e3:.3f} ms for a step of one decoding request, "
                            f"{weight_s / one_step_s:.0f} times less than reading the weights that step "
                            f"needs once at the GPU's peak bandwidth ({weight_s * 1e3:.2f} ms on "
                            f"{hardware.gpu.name} at tp {hardware.tp}). No kernel is that fast, so small "
                            f"batches finish too soon and queues, batch sizes and KV use come out too "
                            f"small; use another profile or the roofline model."
                        ),
                        group=plan.group,
                        figures={
                            "one_request_step_s": one_step_s,
                            "weight_read_s": weight_s,
                            "threshold_share": STEP_FLOOR_SHARE,
                        },
                    )
                )
        overhead_s = float(getattr(latency, "output_token_overhead_s", 0.0))
        if overhead_s > 0:
            b = max(1, int(round(batch)))
            step_s = _decode_step_s(latency, b, context)
            if overhead_s > step_s:
                share = overhead_s / (overhead_s + step_s)
                found.append(
                    Diagnostic(
                        code="post_processing_dominates",
                        severity="warning",
                        message=(
                            f"Post-processing dominates TPOT (group {plan.group!r}): the latency model "
                            f"adds {overhead_s * 1e3:.2f} ms per output token (alpha2) against a "
                            f"{step_s * 1e3:.3f} ms decode step at this run's mean batch of {batch:.1f}, "
                            f"so {share:.0%} of each token's time is a fixed overhead, not GPU work; "
                            f"batching, KV use and load barely move TPOT. Check the profile "
                            f"({_describe(latency)})."
                        ),
                        group=plan.group,
                        figures={
                            "output_token_overhead_s": overhead_s,
                            "decode_step_s": step_s,
                            "mean_batch": batch,
                            "overhead_share_of_token_time": share,
                        },
                    )
                )
    return found


# --- idle engines ---------------------------------------------------------------------
def idle_engine(results: Results) -> Diagnostic | None:
    """``idle_engine`` (info) when the engines were busy less than :data:`IDLE_UTILIZATION`
    of the run on average, else None.

    A request arriving at a random time finds its engine busy with probability about
    the utilisation (exactly so for Poisson arrivals), so below 5 % requests almost
    never wait for a step or share a batch: the latency figures are those of an
    unloaded system, whatever the scenario meant to study.
    """
    busy = list(results._recorder.busy_s)  # noqa: SLF001 - the engine's busy tally lives there
    if not busy or not results.end_s > 0 or len(results) == 0:
        return None
    per_replica = [b / results.end_s for b in busy]
    mean = float(np.mean(per_replica))
    if mean >= IDLE_UTILIZATION:
        return None
    return Diagnostic(
        code="idle_engine",
        severity="info",
        message=(
            f"Mostly idle: the engines were busy {mean:.1%} of the run on average (below "
            f"{IDLE_UTILIZATION:.0%}), so requests rarely met a busy engine or each other in a batch "
            f"and the latency figures are those of an unloaded system. Raise the rate or use fewer "
            f"replicas to study load."
        ),
        figures={
            "gpu_utilization_mean": mean,
            "gpu_utilization_min": float(min(per_replica)),
            "gpu_utilization_max": float(max(per_replica)),
            "threshold": IDLE_UTILIZATION,
        },
    )
