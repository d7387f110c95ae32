"""Your own SimPy process in the fleet: between two components, or instead of one.

The components of a simulation talk through :class:`~simpy_llm.wire.Wire` objects, each
named by a *seam* (``docs/processes.md`` lists them with the item types on each). A user
process is a generator function ``process(env, ports)`` (plus keyword parameters of its own)
placed at a seam in one of two ways:

``between(seam, process)``
    Every item put on the seam's Wire goes to ``ports.inbox`` instead; whatever the process
    puts on ``ports.outbox`` reaches the component that read the seam before. A process that
    forwards each item at once changes nothing in the records.
``instead_of(seam, process)``
    The process takes the component's place: it reads the component's inbox, and its
    :class:`Ports` carry the component's outboxes (``router``: one per replica, plus
    ``rejected``; ``replica:<i>``: ``done``). The built-in component is still built, so
    what reads it (the router's views of a replica) sees it idle.

A Wire read by a process behaves as a :class:`simpy.Store`: ``item = yield
ports.inbox.get()`` takes items first in, first out, at the instant they are put (when the
process waits) or as soon as it asks; ``yield ports.outbox.put(item)`` never waits. The
built-in components keep their handlers: only the processes a scenario adds cost events.

Examples
--------
>>> from simpy_llm import Simulation, load_scenario
>>> def hold(env, ports, delay_s=0.5):
...     while True:
...         req = yield ports.inbox.get()
...         yield env.timeout(delay_s)       # one request at a time, each held half a second
...         yield ports.outbox.put(req)
>>> scenario = load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=20"])
>>> results = Simulation(scenario, processes=[between("arrivals", hold)]).run(progress=False)
>>> frame = results.to_dataframe()
>>> bool((frame["enqueue_s"] - frame["arrival_s"]).min() >= 0.5)
True
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.registry import Registry

if TYPE_CHECKING:
    import simpy

    from simpy_llm.wire import Wire

__all__ = ["SEAM_PATTERN", "Ports", "UserProcess", "between", "check_place", "instead_of", "process_kinds", "rate_limit"]

ProcessFunction = Callable[..., Generator[Any, Any, Any]]
"""``process(env, ports, **params)``: a generator function, as :meth:`simpy.Environment.process` takes."""

process_kinds: Registry[ProcessFunction] = Registry("process kind")
"""Process functions a scenario's ``processes:`` section names by ``kind`` (register yours
with ``@process_kinds.register("name")`` in a module the scenario's ``plugins:`` lists)."""

SEAM_PATTERN = re.compile(r"sent|arrivals|router|completions|handoffs|replica:\d+|cluster:[^\s:]+")
"""The form of a seam name (which seams a scenario has depends on it: ``docs/processes.md``)."""


@attrs.frozen
class UserProcess:
    """A process placed at a seam (build with :func:`between` or :func:`instead_of`)."""

    seam: str
    """Where: ``arrivals``, ``replica:0``... (:data:`SEAM_PATTERN`)."""
    function: ProcessFunction
    """``function(env, ports)`` returns the process's generator."""
    instead: bool = False
    """True: the process takes the place of the component reading the seam."""

    def __attrs_post_init__(self) -> None:
        check_place(self.seam, instead=self.instead)
        if not callable(self.function):
            raise TypeError(f"a process is a generator function, got {self.function!r}")


def check_place(seam: str, *, instead: bool) -> None:
    """Raise ValueError unless *seam* is a seam's form and the place suits it.

    >>> check_place("replica:2", instead=True)
    >>> check_place("replica", instead=False)
    Traceback (most recent call last):
    ...
    ValueError: unknown seam 'replica'; seams are sent, arrivals, completions, handoffs, replica:<index> and cluster:<name> (and the component router)
    """
    if not SEAM_PATTERN.fullmatch(seam):
        raise ValueError(f"unknown seam {seam!r}; seams are sent, arrivals, completions, handoffs, replica:<index> "
                         "and cluster:<name> (and the component router)")
    if instead and not (seam == "router" or seam.startswith("replica:")):
        raise ValueError(f"instead_of takes 'router' or 'replica:<index>', not {seam!r}; "
                         "put a process between two components at any other seam")
    if not instead and seam == "router":
        raise ValueError("'router' is a component, not a Wire: put a process between at 'arrivals' "
                         "(before the router) or instead_of the router")


def between(seam: str, function: ProcessFunction, **params: Any) -> UserProcess:
    """Place *function* on the Wire *seam*: it reads what was put there and passes on what it puts.

    >>> def gate(env, ports):
    ...     while True:
    ...         yield ports.outbox.put((yield ports.inbox.get()))
    >>> between("replica:0", gate).seam
    'replica:0'
    """
    return UserProcess(seam, functools.partial(function, **params) if params else function)


def instead_of(component: str, function: ProcessFunction, **params: Any) -> UserProcess:
    """Let *function* stand in for the component *component* (``router`` or ``replica:<index>``).

    >>> instead_of("arrivals", lambda env, ports: iter(()))
    Traceback (most recent call last):
    ...
    ValueError: instead_of takes 'router' or 'replica:<index>', not 'arrivals'; put a process between two components at any other seam
    """
    return UserProcess(component, functools.partial(function, **params) if params else function, instead=True)


@attrs.frozen(kw_only=True)
class Ports:
    """The Wires a user process reads and writes, and what it may consult.

    Every outbox is a :class:`~simpy_llm.wire.Wire` (``yield outbox.put(item)`` never waits);
    those of a stood-in component do that component's bookkeeping as they pass an item on.
    """

    seam: str
    """The seam the process is at."""
    inbox: Wire
    """Items put on the seam, first in, first out."""
    outbox: Wire | None = None
    """``between``: the Wire to the component that read the seam before."""
    outboxes: tuple[Wire, ...] = ()
    """``instead_of("router")``: one per replica the router chose among (a put there is routed
    to it, counted and recorded as the built-in router's choice would be)."""
    rejected: Wire | None = None
    """A put there drops the request (reason: its ``dropped_reason``, or ``"rejected"``),
    recorded and passed on as an admission policy's rejection is (None at ``completions`` and
    ``handoffs``, and for a stood-in replica: past the router, only a replica drops)."""
    views: tuple[Any, ...] = ()
    """Read-only views of the replicas the entry router chooses among, as its policies see them
    (``docs/policies.md``; none for a stood-in replica)."""
    done: Wire | None = None
    """``instead_of("replica:<i>")``: a put there completes the request now (it keeps the
    ``first_scheduled_s``, ``first_token_s`` and ``generated_tokens`` the process set; unset
    ones become now and its ``output_tokens``), recorded as a replica's completion is."""
    replica: Any = None
    """``instead_of("replica:<i>")``: the built-in replica (or batch server) it stands in for,
    for its settings (``config``, ``service``, latency model); it receives nothing."""


@process_kinds.register("rate_limit")
def rate_limit(env: simpy.Environment, ports: Ports, rate_per_s: float, burst: int = 1) -> Generator[Any, Any, None]:
    """Pass items on at most *rate_per_s* per second on average, *burst* at once (a token
    bucket, full at the start): an item that finds the bucket empty waits for a token. It
    goes :func:`between` two components (it passes items on to ``ports.outbox``).

    Examples
    --------
    >>> import simpy
    >>> from simpy_llm.wire import Wire
    >>> env = simpy.Environment(); inbox, outbox, seen = Wire(env), Wire(env), []
    >>> outbox.connect(lambda item: seen.append((env.now, item)))
    >>> _ = env.process(rate_limit(env, Ports(seam="arrivals", inbox=inbox, outbox=outbox), rate_per_s=2.0))
    >>> for i in range(3):
    ...     _ = inbox.put(i)
    >>> env.run(); seen
    [(0, 0), (0.5, 1), (1.0, 2)]
    """
    if not rate_per_s > 0 or burst < 1:
        raise ValueError("rate_limit needs rate_per_s > 0 and burst >= 1")
    outbox = ports.outbox
    if outbox is None:
        raise ValueError(f"rate_limit passes items on: place it between two components, not instead of {ports.seam!r}")
    tokens, last, gap = float(burst), env.now, 1.0 / rate_per_s
    while True:
        item = yield ports.inbox.get()
        tokens = min(float(burst), tokens + (env.now - last) * rate_per_s)
        last = env.now
        if tokens < 1.0:
            yield env.timeout((1.0 - tokens) * gap)
            tokens, last = 1.0, env.now
        tokens -= 1.0
        yield outbox.put(item)


def seam_error(seam: str, available: Sequence[str]) -> str:
    """The message for a seam this simulation does not have."""
    return f"this scenario has no seam {seam!r}; its seams: {', '.join(available)}"
