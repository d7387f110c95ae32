"""A sharded run's arrivals (``simpy_llm.explore.sharded``): made as a single run makes them.

The coordinator and every executor slot make the scenario's arrivals from the same
sources and random streams, window by window, without a SimPy environment
(:class:`_Arrivals`): the same requests, to the bit, as a single run's generator makes
through its environment.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

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

    def make(self, request_id: int, at: float, source: int, prompt: int, output: int,
             extra: dict[str, Any] | None) -> Request:
        """The request of one row, as the generator makes it (by position where it can)."""
        tail = self.tails[source]
        if tail is not None and extra is None:  # by position, as the generator: no keyword matching
            return Request(request_id, tail[0], prompt, output, at, *tail[1])
        return make_request(request_id, at, self.bases[source], prompt, output, extra)

    def _rows(self, until: float) -> Iterator[tuple[float, tuple[float, int, int, int, dict[str, Any] | None]]]:
        """The window's rows before *until* with their arrival times, in order; a row's
        request id is :attr:`made` while it is handled (counted after)."""
        stop = self.stop = self.stop + (until - self.stop)
        row = self.pending if self.pending is not None else self._next()
        now = self.now
        while row is not None:
            t = row[0]
            at = now + (t - now) if t > now else now
            if at >= stop:
                break
            now = self.now = at
            yield at, row
            self.made += 1
            row = self._next()
        self.pending = row

    def every(self, until: float) -> list[Request]:
        """Every request arriving before *until* (after the previous window's), in arrival order."""
        out: list[Request] = []
        make, replayed, n_clients = self.make, self.replayed, self.n_clients
        for at, row in self._rows(until):
            req = make(self.made, at, row[1], row[2], row[3], row[4])
            if replayed is not None and row[1] >= n_clients:
                replayed(req)
            out.append(req)
        return out

    def window(self, until: float) -> _Window:
        """The rows arriving before *until* (after the previous window's), in order: what a
        slot can make of a window before it is routed. With trace sources every row's
        request is made, in order (a replayed round takes its session's previous one as
        context)."""
        first = self.made
        arrival_s: list[float] = []
        rows: list[tuple[float, int, int, int, dict[str, Any] | None]] = []
        for at, row in self._rows(until):
            arrival_s.append(at)
            rows.append(row)
        made = None
        if self.replayed is not None:
            made, replayed, n_clients = [], self.replayed, self.n_clients
            for k, (at, row) in enumerate(zip(arrival_s, rows, strict=True)):
                req = self.make(first + k, at, row[1], row[2], row[3], row[4])
                if row[1] >= n_clients:
                    replayed(req)
                made.append(req)
        return _Window(until, first, arrival_s, rows, made)

    def share(self, window: _Window, targets: np.ndarray, shard_of: np.ndarray, shares: Sequence[_Share]) -> None:
        """Hand the rows of *window* to *shares*: row *k* (routed to the entry router's
        *targets[k]*) to ``shares[shard_of[k]]``, none where ``shard_of[k]`` is negative
        (another slot's).

        A share keeps the rows, not requests: the shard makes each request at its arrival
        (:meth:`_Share.request`), so that a window's requests are not all alive at once
        (each made is an object the garbage collector tracks; a window's worth made
        together set off collections a single run does not have). With trace sources the
        requests are made already, and shared made.
        """
        n = len(shard_of)
        if n != len(window.rows):
            raise RuntimeError(f"a slot made {len(window.rows)} arrivals where the coordinator routed {n}")
        arrival_s, rows, made = window.arrival_s, window.rows, window.made
        for s, share in enumerate(shares):
            picked = np.flatnonzero(shard_of == s)
            share.targets = targets[picked].tolist()
            picked_list = picked.tolist()
            share.arrival_s = [arrival_s[k] for k in picked_list]
            if made is not None:
                share.made = [made[k] for k in picked_list]
            else:
                share.ids = (picked + window.first).tolist()
                share.rows = [rows[k] for k in picked_list]


class _Window(NamedTuple):
    """A window's rows, made before it is routed (:meth:`_Arrivals.window`)."""

    until: float
    """The window's end."""
    first: int
    """The first row's request id (the others follow in order)."""
    arrival_s: list[float]
    """Each row's arrival time, s."""
    rows: list[tuple[float, int, int, int, dict[str, Any] | None]]
    """The rows, as the sources merged them."""
    made: list[Request] | None
    """The rows' requests, made already (trace sources), else None."""


class _Share:
    """The rows of a window routed to one shard, in arrival order (or, with trace sources,
    their requests made already)."""

    __slots__ = ("_arrivals", "arrival_s", "ids", "made", "rows", "targets")

    def __init__(self, arrivals: _Arrivals) -> None:
        self._arrivals = arrivals
        self.targets: list[int] = []
        """The entry router's target of each row."""
        self.arrival_s: list[float] = []
        """Each row's arrival time, s."""
        self.ids: list[int] = []
        self.rows: list[tuple[float, int, int, int, dict[str, Any] | None]] = []
        self.made: list[Request] = []
        """The rows' requests, where made already (trace sources)."""

    def __len__(self) -> int:
        return len(self.targets)

    def request(self, k: int) -> Request:
        """Row *k*'s request (made now, unless made already)."""
        if self.made:
            return self.made[k]
        row = self.rows[k]
        return self._arrivals.make(self.ids[k], self.arrival_s[k], row[1], row[2], row[3], row[4])
