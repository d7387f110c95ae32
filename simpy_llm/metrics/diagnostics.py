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
``outside_fitted_range``      warning  the workload goes outside the operating ranges
                                       the scenario's fitted latency profile was
                                       fitted on (:func:`outside_fitted_ranges`)
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

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from simpy_llm.config.profile import RANGE_QUANTITIES
from simpy_llm.metrics.stats import squeeze
from simpy_llm.serving.fleet import plan_fleet

if TYPE_CHECKING:
    from simpy_llm.metrics.results import Results
    from simpy_llm.metrics.summary import DiagnosticEntry
    from simpy_llm.serving.fleet import ReplicaPlan

__all__ = [
    "IDLE_UTILIZATION",
    "OVERLOAD_EXCESS_SHARE",
    "OVERLOAD_MIN_REQUESTS",
    "STEP_FLOOR_SHARE",
    "Diagnostic",
    "diagnose",
    "idle_engine",
    "in_flight_at",
    "latency_model_oddities",
    "outside_fitted_ranges",
    "outside_ranges",
    "overload",
    "overload_judged",
    "range_message",
    "run_range_values",
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
    ``outside_fitted_range``, ``idle_engine``)."""
    severity: str = attrs.field(validator=attrs.validators.in_(_SEVERITIES))
    """``warning`` (the figures do not mean what they seem) or ``info``."""
    message: str
    """What was found, in plain words, with the figures."""
    figures: dict[str, float] = attrs.field(factory=dict)
    """The figures behind the message, by name (units in the names): numbers only, so
    they fit a JSON summary and its long format as they are."""
    group: str | None = None
    """The replica group the finding is about (``None``: the run as a whole)."""

    def to_dict(self) -> DiagnosticEntry:
        """The diagnostic as plain data (what ``Results.summary()`` lists).

        Examples
        --------
        >>> Diagnostic(code="idle_engine", severity="info", message="m", figures={"x": 1.0}).to_dict()
        {'code': 'idle_engine', 'severity': 'info', 'message': 'm', 'figures': {'x': 1.0}, 'group': None}
        """
        return {"code": self.code, "severity": self.severity, "message": self.message, "figures": dict(self.figures),
                "group": self.group}


def diagnose(results: Results, *, plans: Sequence[ReplicaPlan] | None = None) -> list[Diagnostic]:
    """Everything worth warning about in *results*, in a fixed order: overload, the
    latency models' oddities (group by group), workloads outside the ranges a fitted
    profile was fitted on (group by group), idle engines.

    *plans* is the fleet the run used (``Simulation.plans``); by default it is planned
    again from ``results.scenario`` (so a latency model passed to ``Simulation`` in
    place of the scenario's is not seen unless given here). Reads *results* only.
    """
    found: list[Diagnostic] = []
    over = overload(results)
    if over is not None:
        found.append(over)
    if plans is None:
        try:
            plans = plan_fleet(results.scenario.serving)
        except ValueError:
            # A hand-built Results may name a fleet that cannot be planned; the run's
            # own figures are still worth diagnosing.
            plans = []
    found.extend(latency_model_oddities(results, plans))
    found.extend(outside_fitted_ranges(results))
    idle = idle_engine(results)
    if idle is not None:
        found.append(idle)
    return found


# --- overload ------------------------------------------------------------------
_PART_RECORDS = 1 << 16
"""Records of an in-memory run that :func:`_record_chunks` gives at a time."""


def _record_chunks(results: Results, names: tuple[str, ...]) -> Iterator[Mapping[str, np.ndarray]]:
    """The record columns *names* of *results*, in parts: views of :data:`_PART_RECORDS`
    records of the columns at a time in memory, one chunk at a time for a streamed run
    (figures that do not depend on the records' order are summed over the parts, so what
    is taken from a part is never a copy of a whole column)."""
    streamed = results.streamed_records
    if streamed is not None:
        yield from streamed.chunks(names)
        return
    columns = {name: results.columns[name] for name in names}
    size = len(next(iter(columns.values()))) if columns else 0
    for start in range(0, max(size, 1), _PART_RECORDS):
        yield {name: values[start:start + _PART_RECORDS] for name, values in columns.items()}


def _arrival_extent(results: Results) -> tuple[int, float, float]:
    """``(records, first arrival, last arrival)`` (NaN when some arrival is NaN, as
    :func:`numpy.min` gives it; the run's end with no record)."""
    n, lows, highs = 0, [], []
    for c in _record_chunks(results, ("arrival_s",)):
        arrival = np.asarray(c["arrival_s"], dtype=np.float64)
        if arrival.size:
            n += arrival.size
            lows.append(arrival.min())
            highs.append(arrival.max())
    if not n:
        return 0, math.nan, math.nan
    return n, float(np.min(lows)), float(np.max(highs))


def _sorted(values: np.ndarray) -> np.ndarray:
    """*values* when in ascending order, else a sorted copy."""
    return values if bool((values[:-1] <= values[1:]).all()) else np.sort(values)


def _events(starts: np.ndarray, ends: np.ndarray, block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The times of *starts* and *ends* (each sorted) merged in time order, about *block* of
    each at a time, each block with the net count of starts less ends at or before each of
    its times. A block ends where a time ends (every event at that time is in it), so the
    count after its last event is that after every event up to then."""
    i = j = 0
    while i < starts.size or j < ends.size:
        t = min(starts[min(i + block, starts.size) - 1] if i < starts.size else np.inf,
                ends[min(j + block, ends.size) - 1] if j < ends.size else np.inf)
        si, ej = int(np.searchsorted(starts, t, side="right")), int(np.searchsorted(ends, t, side="right"))
        s, e = starts[i:si], ends[j:ej]
        times = np.concatenate((s, e))
        times.sort()
        net = np.searchsorted(s, times, side="right")
        net -= np.searchsorted(e, times, side="right")
        net += i - j
        yield times, net
        i, j = si, ej


def _spells(starts: np.ndarray, ends: np.ndarray, level_a: int, a: float, b: float, block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The spells ``[a, t_1), [t_1, t_2), ... [t_m, b)`` between the events strictly inside
    ``(a, b)`` (*starts* and *ends* there, each sorted; *level_a* intervals open at *a*) that
    have a positive length, in time order, in blocks: (the number of intervals open during
    each, its length). Each length is the same subtraction as between consecutive events of
    the whole run."""
    last_t, last_level = a, level_a  # the spell whose end the next event gives
    for times, net in _events(starts, ends, block):
        levels = np.empty(times.size + 1, dtype=np.int64)
        levels[0] = last_level
        np.add(net, level_a, out=levels[1:])
        durations = np.empty(times.size + 1, dtype=np.float64)
        durations[0] = times[0] - last_t
        np.subtract(times[1:], times[:-1], out=durations[1:-1])
        last_t, last_level = times[-1], int(levels[-1])
        keep = durations[:-1] > 0
        yield levels[:-1][keep], durations[:-1][keep]
    final = np.array([b - last_t])
    yield np.array([last_level])[final > 0], final[final > 0]


def _third_median(starts: np.ndarray, ends: np.ndarray, level_a: int, a: float, b: float, block: int) -> float:
    """The time-weighted median of the number of intervals open over ``[a, b)``, from the
    starts and ends strictly inside ``(a, b)`` (each sorted) and the *level_a* open at *a*.

    The spells at each count are taken in time order, sorted by count (stable) and summed.
    The sort is a counting sort, *block* events at a time: one pass counts the spells at
    each count, a second puts each spell's length in its place, so besides the events only
    the spells' lengths are held (a number an event), not their counts or a sort order.
    """
    # Spells at each count from `low` up (a count below zero only if some end came before its start).
    low, counts = 0, np.zeros(1, dtype=np.int64)
    for levels, _ in _spells(starts, ends, level_a, a, b, block):
        if not levels.size:
            continue
        if levels.min() < low:
            counts = np.concatenate((np.zeros(low - int(levels.min()), dtype=np.int64), counts))
            low = int(levels.min())
        here = np.bincount(levels - low)
        if here.size > counts.size:
            counts = np.concatenate((counts, np.zeros(here.size - counts.size, dtype=np.int64)))
        counts[:here.size] += here
    ends_at = np.cumsum(counts)
    cursor = ends_at - counts  # where the next spell of each count goes
    by_level = np.empty(int(ends_at[-1]), dtype=np.float64)
    for levels, durations in _spells(starts, ends, level_a, a, b, block):
        order = np.argsort(levels, kind="stable")
        ranked = levels[order] - low
        # Each spell's place: after those of lower counts and the earlier ones of its count.
        place = cursor[ranked] + np.arange(ranked.size) - np.searchsorted(ranked, ranked, side="left")
        by_level[place] = durations[order]
        present, n = np.unique(ranked, return_counts=True)
        cursor[present] += n
    np.cumsum(by_level, out=by_level)
    k = int(np.searchsorted(by_level, 0.5 * by_level[-1]))
    return float(low + np.searchsorted(ends_at, k, side="right"))


_SPELL_BLOCK = 1 << 13
"""Events of each kind whose spells :func:`_third_median` takes at a time (their temporaries: ~1 MB)."""


def _time_weighted_medians(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray, *, block: int = _SPELL_BLOCK) -> list[float]:
    """Time-weighted median of the number of intervals ``[start_i, end_i)`` open, over each
    ``[edges[k], edges[k + 1])`` (an infinite end: still open; *starts* and *ends* are
    sorted here unless they already are).

    Over ``[a, b)`` the count changes only at the starts and ends inside it, so only those
    are looked at: the count at ``a`` and after each of them is the starts at or before it
    less the ends at or before it. The spells at each count are taken in time order, sorted
    by count (stable) and summed, so the median is the same to the bit as over every event
    of the run at once (:func:`_third_median`).
    """
    starts, ends = _sorted(starts), _sorted(ends)
    out = []
    for a, b in itertools.pairwise(edges):
        level_a = int(np.searchsorted(starts, a, side="right") - np.searchsorted(ends, a, side="right"))
        inside_starts = starts[np.searchsorted(starts, a, side="right"):np.searchsorted(starts, b, side="left")]
        inside_ends = ends[np.searchsorted(ends, a, side="right"):np.searchsorted(ends, b, side="left")]
        out.append(_third_median(inside_starts, inside_ends, level_a, a, b, block))
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
    n, a0, a1 = _arrival_extent(results)
    return n >= OVERLOAD_MIN_REQUESTS and a1 > a0


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
    n, a0, a1 = _arrival_extent(results)
    if not (n >= OVERLOAD_MIN_REQUESTS and a1 > a0):
        return None
    window = a1 - a0
    edges = np.linspace(a0, a1, 4)
    # Each waiting spell runs from entering a queue to the first step (never scheduled: to the
    # end). A first pass notes which records have one (a byte each); then each third gathers
    # only the starts and ends inside it, part by part, so that at most a third's events are
    # held, never two numbers per request.
    queued = np.empty(n, dtype=bool)
    started = done = 0
    for c in _record_chunks(results, ("status", "enqueue_s", "first_scheduled_s")):
        enqueue = np.asarray(c["enqueue_s"], dtype=np.float64)
        scheduled = np.asarray(c["first_scheduled_s"], dtype=np.float64)
        queued[done:done + enqueue.size] = (c["status"] != "dropped") & np.isfinite(enqueue)
        done += enqueue.size
        started += int(((scheduled >= a0) & (scheduled <= a1)).sum())
    medians = []
    for a, b in itertools.pairwise(edges):
        level_a, done = 0, 0
        inside_starts, inside_ends = [], []
        for c in _record_chunks(results, ("enqueue_s", "first_scheduled_s")):
            size = len(c["enqueue_s"])
            mask = queued[done:done + size]
            done += size
            start = np.asarray(c["enqueue_s"], dtype=np.float64)[mask]
            end = np.asarray(c["first_scheduled_s"], dtype=np.float64)[mask]
            end[np.isnan(end)] = np.inf
            level_a += int((start <= a).sum()) - int((end <= a).sum())
            inside_starts.append(start[(start > a) & (start < b)])
            inside_ends.append(end[(end > a) & (end < b)])
        starts, ends = np.concatenate(inside_starts), np.concatenate(inside_ends)
        del inside_starts, inside_ends
        starts.sort()
        ends.sort()
        medians.append(_third_median(starts, ends, level_a, a, b, _SPELL_BLOCK))
        del starts, ends
    w1, w2, w3 = medians
    rate = n / window
    excess = (w3 - w1) / (2 * window / 3) / rate
    if not (w1 < w2 < w3 and excess >= OVERLOAD_EXCESS_SHARE):
        return None
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
    """Mean KV context of a served request: its prompt plus half its output.

    Each context is a whole number of half tokens, so while their total stays under 2**52
    every partial sum of them is exact in float64 and numpy's mean of the array is the
    total (summed here as integers, part by part: twice each context) divided once by the
    count, whatever the order; a larger total takes the mean of the array.
    """
    served_n = doubled = 0
    for c in _record_chunks(results, ("status", "prompt_tokens", "output_tokens")):
        served = np.asarray(c["status"] != "dropped")
        served_n += int(served.sum())
        doubled += 2 * int(np.asarray(c["prompt_tokens"])[served].sum()) + int(np.asarray(c["output_tokens"])[served].sum())
    if not served_n:
        return 0.0
    if doubled < 2**53:
        return doubled / 2 / served_n
    return _mean_context_tokens_array(results)


def _mean_context_tokens_array(results: Results) -> float:
    """:func:`_mean_context_tokens` as numpy's mean of every served request's context."""
    streamed = results.streamed_records
    if streamed is None:
        c = results.columns
        served = c["status"] != "dropped"
        context = 0.5 * c["output_tokens"]
        np.add(c["prompt_tokens"], context, out=context)  # prompt + 0.5 * output, in the one array
    else:
        # Filled chunk by chunk in request-id order: the mean sums the same values in the same order.
        served = np.empty(len(streamed), dtype=bool)
        context = np.empty(len(streamed), dtype=np.float64)
        for chunk in streamed.chunks(("request_id", "status", "prompt_tokens", "output_tokens")):
            at = streamed.positions(chunk["request_id"])
            served[at] = chunk["status"] != "dropped"
            context[at] = chunk["prompt_tokens"] + 0.5 * chunk["output_tokens"]
    if not served.any():
        return 0.0
    return float(np.mean(context if served.all() else squeeze(context, served)))


def _decode_step_s(latency: Any, batch: int, context_tokens: float) -> float:
    if latency.uses_context:
        return float(latency.step_time_s(0, batch, decode_context_tokens=round(batch * context_tokens)))
    return float(latency.step_time_s(0, batch))


def _weight_read_s(hardware: Any) -> float:
    """The roofline's step of one decoding request without context at peak bandwidth
    (``mbu`` 1): the weights a one-token step must read (an MoE layer's routed experts
    only), the LM head and the all-reduces; a lower bound on any real step."""
    from simpy_llm.serving.roofline import Roofline  # only a latency model with hardware is checked so

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
        hardware = latency.hardware
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
        overhead_s = float(latency.output_token_overhead_s)
        if overhead_s > 0:
            b = max(1, round(batch))
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


# --- fitted ranges -----------------------------------------------------------------
def in_flight_at(start_s: np.ndarray, end_s: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """How many of the intervals ``[start_s[i], end_s[i])`` hold each instant of *at_s*
    (every end at or after its start; an infinite end: still open).

    Examples
    --------
    >>> in_flight_at(np.array([0.0, 1.0, 2.0]), np.array([3.0, 2.0, np.inf]), np.array([0.0, 1.0, 2.0, 5.0]))
    array([1, 2, 2, 1])
    """
    starts = np.sort(np.asarray(start_s, dtype=np.float64))
    ends = np.sort(np.asarray(end_s, dtype=np.float64))
    at = np.asarray(at_s, dtype=np.float64)
    return np.searchsorted(starts, at, side="right") - np.searchsorted(ends, at, side="right")


def outside_ranges(
    fitted: Mapping[str, Sequence[float]], seen: Mapping[str, np.ndarray]
) -> list[dict[str, Any]]:
    """The quantities whose values in *seen* go outside their range in *fitted*
    (``{quantity: (min, max)}``; a quantity missing on either side is not judged), in the
    order of *fitted*: each ``{quantity, fitted: (min, max), seen: (min, max), outside:
    values outside, values: values judged}``. A share (``cached_fraction``) may exceed its
    range by 1e-9 (rounding); counts are compared exactly.

    Examples
    --------
    >>> found = outside_ranges({"prompt_tokens": (20, 286), "decoders": (1, 4)},
    ...                        {"prompt_tokens": np.array([35, 300, 1210]), "decoders": np.array([1, 2])})
    >>> [(f["quantity"], f["seen"], f["outside"]) for f in found]
    [('prompt_tokens', (35.0, 1210.0), 2)]
    """
    found = []
    for quantity, (lo, hi) in fitted.items():
        values = np.asarray(seen.get(quantity, ()), dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            continue
        slack = 1e-9 if quantity == "cached_fraction" else 0.0
        outside = int(np.count_nonzero((values < lo - slack) | (values > hi + slack)))
        if outside:
            found.append({"quantity": quantity, "fitted": (float(lo), float(hi)),
                          "seen": (float(values.min()), float(values.max())), "outside": outside, "values": int(values.size)})
    return found


def range_message(finding: Mapping[str, Any]) -> str:
    """One finding of :func:`outside_ranges` in words: the quantity, the fitted range, the
    range seen and how many values lie outside.

    Examples
    --------
    >>> range_message({"quantity": "prompt_tokens", "fitted": (20.0, 286.0), "seen": (35.0, 1210.0),
    ...                "outside": 2, "values": 3})
    'prompt_tokens 35-1210 outside the fitted range 20-286 (prompt tokens per request; 2 of 3 values outside)'
    """
    q = finding["quantity"]
    (lo, hi), (slo, shi) = finding["fitted"], finding["seen"]
    return (f"{q} {slo:.4g}-{shi:.4g} outside the fitted range {lo:.4g}-{hi:.4g} "
            f"({RANGE_QUANTITIES.get(q, q)}; {finding['outside']} of {finding['values']} values outside)")


def run_range_values(results: Results, replicas: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The values of each operating-range quantity (:data:`~simpy_llm.config.profile.RANGE_QUANTITIES`)
    in a run, over the requests served by *replicas* (default: all), as a profile's
    ``fit.ranges`` count them on an observed trace:

    * ``prompt_tokens``, ``output_tokens``, ``uncached_prompt_tokens`` (prompt less cached
      tokens) and ``cached_fraction`` (cached / prompt tokens): one value per completed request;
    * ``concurrency``: at each completed request's arrival, the requests on its replica that
      arrived and are not complete (itself included; one still running at the end counts as
      in flight);
    * ``decoders``: at each first token of a completed request with two or more output tokens,
      the requests on its replica between their first token and their completion (itself
      included): the decoders of the step that follows.
    """
    c = results.columns
    replica = np.asarray(c["replica"], dtype=np.int64)
    done = np.asarray(c["status"] == "completed")
    mine = np.isin(replica, np.asarray(replicas, dtype=np.int64)) if replicas is not None else np.ones(replica.size, dtype=bool)
    kept = done & mine
    prompt = np.asarray(c["prompt_tokens"], dtype=np.float64)
    cached = np.asarray(c["cached_tokens"], dtype=np.float64)
    output = np.asarray(c["output_tokens"], dtype=np.float64)
    arrival = np.asarray(c["arrival_s"], dtype=np.float64)
    first = np.asarray(c["first_token_s"], dtype=np.float64)
    completion = np.asarray(c["completion_s"], dtype=np.float64)
    end = np.where(np.isfinite(completion), completion, np.inf)
    concurrency, decoders = [], []
    for r in np.unique(replica[kept]):
        on = mine & (replica == r) & np.isfinite(arrival)
        concurrency.append(in_flight_at(arrival[on], np.maximum(end[on], arrival[on]), arrival[kept & (replica == r)]))
        started = on & np.isfinite(first)
        decoding = kept & (replica == r) & np.isfinite(first) & (output >= 2)
        decoders.append(in_flight_at(first[started], np.maximum(end[started], first[started]), first[decoding]))
    with np.errstate(invalid="ignore", divide="ignore"):
        fraction = np.where(prompt[kept] > 0, cached[kept] / prompt[kept], np.nan)
    return {
        "prompt_tokens": prompt[kept],
        "uncached_prompt_tokens": prompt[kept] - cached[kept],
        "output_tokens": output[kept],
        "decoders": np.concatenate(decoders) if decoders else np.empty(0),
        "concurrency": np.concatenate(concurrency) if concurrency else np.empty(0),
        "cached_fraction": fraction,
    }


def outside_fitted_ranges(results: Results) -> list[Diagnostic]:
    """``outside_fitted_range`` for each replica group whose latency model carries the
    ranges it was fitted on (``latency_model: {profile: FILE}`` with a profile that records
    ``fit.ranges``, or ``fitted_ranges`` given beside ``kind`` and ``params``) and whose
    requests go outside one of them (:func:`run_range_values`, :func:`outside_ranges`).

    A fitted profile knows the lengths, batch sizes, load and cache hits its trace showed;
    beyond them its coefficients are extrapolated (a per-pair attention cost fitted on
    short prompts, a decode step for more decoders than the trace had), and the run's
    figures may be far off without any other sign. The message names each quantity, the
    fitted range and the range the run reached.
    """
    found: list[Diagnostic] = []
    first_replica = 0
    for group in results.scenario.serving.groups():
        replicas = range(first_replica, first_replica + group.count)
        first_replica += group.count
        ranges = getattr(group.latency_model, "fitted_ranges", None)
        if not ranges:
            continue
        findings = outside_ranges(ranges, run_range_values(results, list(replicas)))
        if not findings:
            continue
        figures: dict[str, float] = {}
        for f in findings:
            q = f["quantity"]
            figures.update({f"{q}_min": f["seen"][0], f"{q}_max": f["seen"][1], f"fitted_{q}_min": f["fitted"][0],
                            f"fitted_{q}_max": f["fitted"][1], f"{q}_outside": float(f["outside"])})
        found.append(
            Diagnostic(
                code="outside_fitted_range",
                severity="warning",
                message=(
                    f"Outside the fitted range (group {group.name!r}): the latency profile was fitted on a narrower "
                    f"workload than this run's, so its coefficients are extrapolated here: "
                    + "; ".join(range_message(f) for f in findings)
                    + ". Fit on a trace that covers this workload, or give the fit priors from a probe."
                ),
                group=group.name,
                figures=figures,
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
