"""A sharded run's arrivals (``simpy_llm.explore.sharded``): made as a single run makes them.

The coordinator and every executor slot make the scenario's arrivals from the same
sources and random streams, window by window, without a SimPy environment
(:class:`_Arrivals`): the same requests, to the bit, as a single run's generator makes
through its environment.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from simpy_llm.entities import Request
from simpy_llm.workload.checks import check_spec_files, warn_unknown_trace_classes
from simpy_llm.workload.distributions import SamplingError
from simpy_llm.workload.generator import make_request, merge_sources, positional_fields, sampling_scenario_error
from simpy_llm.workload.sessions import ReplayedContexts
from simpy_llm.workload.sources import build_sources

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario

__all__: list[str] = []


def _delay_to(now: float, at: float) -> float:
    """A delay *d* with ``now + d == at`` exactly (``at - now`` can miss by an ulp): the
    arrival lands on the very float the single run's generator reached."""
    d = at - now
    if now + d == at:
        return d
    step = math.inf if now + d < at else -math.inf
    for _ in range(64):
        d = math.nextafter(d, step)
        if now + d == at:
            return d
    raise ArithmeticError(f"no delay from {now!r} lands on {at!r}")  # pragma: no cover - not met with binary64


class _Arrivals:
    """The scenario's arrivals window by window, as a single run's generator makes them
    (the same rows, times and request ids), made without an environment: for the
    coordinator, every request (:meth:`every`); for an executor slot, a request only for a
    row routed to its shards (making a request costs more than merging its row).

    The times are those of a single run's generator: the generator's clock moves
    to ``now + (t - now)``, as its timeout's time is computed, and a window ends at its stop
    event's time, which an arrival at that very time follows (SimPy's stop is urgent). With
    trace sources every row's request is made, in order: a replayed round takes its
    session's previous one as context.

    Parameters
    ----------
    scenario
        The scenario.
    quiet
        Keep the sources' warnings to oneself (an executor slot's: the coordinator, built
        with ``quiet=False``, tells them once).
    """

    def __init__(self, scenario: Scenario, *, quiet: bool = True) -> None:
        self.scenario = scenario
        wl = scenario.workload
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore")
            check_spec_files(scenario)
            self.sources = build_sources(wl, default_seed=scenario.seed, stacklevel=5)
            if not quiet:
                warn_unknown_trace_classes(scenario, self.sources.traces, stacklevel=5)
        generator_sources = self.sources.generator_sources()
        self.bases = [base for base, _ in generator_sources]
        self.tails = [positional_fields(base) for base in self.bases]
        """Per source, its base fields by position (None: by keyword), as the generator makes them."""
        self.rows = merge_sources([rows for _, rows in generator_sources], wl.num_requests, wl.horizon_s)
        self.replayed = ReplayedContexts() if self.sources.traces else None
        self.n_clients = len(self.sources.clients)
        self.pending: tuple[float, int, int, int, dict[str, Any] | None] | None = None
        self.now = 0.0
        """The generator's clock: the last arrival's time."""
        self.stop = 0.0
        """The last window's stop time: where the environment's clock stood at its end."""
        self.made = 0
        self.exhausted = False
        """Whether every row has been made (the generator is done)."""

    def _next(self) -> tuple[float, int, int, int, dict[str, Any] | None] | None:
        try:
            row = next(self.rows, None)
        except SamplingError as exc:
            raise sampling_scenario_error(exc, self.scenario, self.sources.clients) from None
        if row is None:
            self.exhausted = True
        return row

    def every(self, until: float) -> list[Request]:
        """Every request arriving before *until* (after the previous window's), in arrival order."""
        return self.window(until, None)  # type: ignore[return-value]  # None: every row's request is made

    def window(self, until: float, shard_of: Sequence[int | None] | None) -> list[Request | None]:
        """The requests arriving before *until*: one per row, made where *shard_of* (the
        routed shard of each row of the window, in arrival order) names a shard (None:
        every row's)."""
        stop = self.stop = self.stop + (until - self.stop)
        make_all = self.replayed is not None or shard_of is None
        out: list[Request | None] = []
        n = len(shard_of) if shard_of is not None else -1
        row = self.pending if self.pending is not None else self._next()
        now, tails = self.now, self.tails
        while row is not None:
            t = row[0]
            at = now + (t - now) if t > now else now
            if at >= stop:
                break
            now = at
            k = len(out)
            if make_all or (k < n and shard_of[k] is not None):  # type: ignore[index]  # not None here
                tail = tails[row[1]]
                if tail is not None and row[4] is None:  # by position, as the generator: no keyword matching
                    req: Request | None = Request(self.made, tail[0], row[2], row[3], at, *tail[1])
                else:
                    req = make_request(self.made, at, self.bases[row[1]], row[2], row[3], row[4])
            else:
                req = None
            if req is not None and self.replayed is not None and row[1] >= self.n_clients:
                self.replayed(req)
            out.append(req)
            self.made += 1
            row = self._next()
        self.pending, self.now = row, now
        if n >= 0 and len(out) != n:
            raise RuntimeError(f"a shard made {len(out)} arrivals where the coordinator routed {n}")
        return out

