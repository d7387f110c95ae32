"""A sharded run's executor slots (``simpy_llm.explore.sharded``): the shards and how the coordinator calls them.

A slot (:class:`_ShardHost`) holds some shards (:class:`_Shard`: a Simulation of the
whole fleet of which only its own replicas receive requests) and advances them together
each window. The coordinator calls it through a :class:`_Host`: in this process
(:class:`_Local`), through a Dask actor (:class:`_Remote`), or, once the actor is built
on a worker reached over TCP, through a connection of its own to the worker
(:class:`_Piped`): a window's round trip then costs a socket's send and receive (~0.05 to
0.25 ms here) instead of a Dask actor call's (~2 ms: the scheduler's messages, the
worker's actor thread, the client's event loop).

The connection is ``multiprocessing.connection``'s: it listens on the worker's own host
(the address Dask reaches it at), accepts one client, which must answer a challenge with
the run's random key (sent through Dask), and carries length-prefixed pickles.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from simpy_llm.explore.sharded_arrivals import _Arrivals, _delay_to, _Share, _Window
from simpy_llm.kernel import Later
from simpy_llm.metrics.monitors import LevelMonitor
from simpy_llm.metrics.recorder import RECORD_FIELDS
from simpy_llm.simulation import Simulation

if TYPE_CHECKING:
    from simpy.events import Event

    from simpy_llm.config.schema import Scenario
    from simpy_llm.entities import Request

__all__: list[str] = []

SNAPSHOT_FIELDS = 7
"""Fields a shard reports per replica: waiting, running, queued prompt tokens, free and
used KV blocks, departures and departed prompt tokens."""


class _LoggedLevel(LevelMonitor):
    """A :class:`LevelMonitor` that keeps each change instead, so that the shards' levels
    can be merged into the fleet's (its peak is not the sum of theirs). Its own statistics
    stay at zero: a shard never reads them (the autoscaler, which would, is not sharded),
    and keeping them cost a slot about 1 % of its time."""

    __slots__ = ("deltas", "times")

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self.deltas: list[int] = []

    def change(self, now_s: float, delta: int) -> None:
        self.times.append(now_s)
        self.deltas.append(delta)

    def take(self) -> tuple[bytes, bytes]:
        """The changes kept since the last take, as float64 times and int64 deltas; forgets them."""
        out = (np.array(self.times, dtype=np.float64).tobytes(), np.array(self.deltas, dtype=np.int64).tobytes())
        self.times, self.deltas = [], []
        return out


class _Shard:
    """A Simulation of the whole fleet of which only *owned* replicas receive requests.

    Parameters
    ----------
    scenario
        The scenario (checked by :func:`sharding_problems`).
    targets
        The entry router's positions this shard serves: cluster positions with
        ``serving.clusters``, else replica positions.
    """

    def __init__(self, scenario: Scenario, targets: Sequence[int]) -> None:
        sim = self.sim = Simulation(scenario, external_arrivals=True)
        self.env = sim.env
        self.recorder = sim.recorder
        self.in_system = sim.recorder.in_system = _LoggedLevel()
        clusters = scenario.serving.clusters
        if clusters:
            names = [clusters[c].name for c in targets]
            self.owned = [i for i, plan in enumerate(sim.plans) if plan.cluster in names]
            inboxes = [sim.wires[f"cluster:{cl.name}"] for cl in clusters]
            self._deliver: Callable[[int, Request], None] = lambda c, req: inboxes[c].send(req)
        else:
            self.owned = list(targets)  # without disaggregation the router's positions are the fleet indices
            send = sim.router.send
            self._deliver = lambda position, req: send(req, position)
        self._views = [sim.views[i] for i in self.owned]

    def statics(self) -> list[tuple[int, str, float, int, float]]:
        """Per owned replica: fleet index, group, capacity, KV blocks and prefill seconds per token."""
        return [(v.index, v.group, v.capacity, v.kv_total_blocks, v.prefill_s_per_token) for v in self._views]

    def snapshot(self) -> list[int]:
        """The owned replicas' reported state now, :data:`SNAPSHOT_FIELDS` per replica."""
        out: list[int] = []
        for i in self.owned:
            rep = self.sim.replicas[i]
            kv = rep.kv
            out += (len(rep.waiting), len(rep.running), rep.queued_prompt_tokens, kv.free_blocks, kv.used_blocks,
                    rep.departed, rep.departed_tokens)
        return out

    def _inject(self, share: _Share) -> None:
        """Each row of *share* (in arrival order) reaches its target at its arrival time, as
        the generator's would: one timer per arrival time whose callback makes the request
        and delivers it (the queue entries a process waiting on timeouts would make, without
        resuming one).

        The first timer is made at the window's start, after every event already due then:
        an arrival at the window's very start comes after that instant's view refresh, as
        the generator's timer (made at the previous arrival, after the refresh's) does in a
        single run. Started as urgent, it came before the refresh, and a trace whose
        arrivals fall on the window boundaries got other records."""
        env, on_arrival, deliver = self.env, self.recorder.on_arrival, self._deliver
        times, targets, request = share.arrival_s, share.targets, share.request
        n = len(times)
        k = 0

        def arrive(_event: Event) -> None:
            nonlocal k
            now = env.now
            while k < n and times[k] <= now:
                req = request(k)
                on_arrival(req, now)
                deliver(targets[k], req)
                k += 1
            if k < n:
                Later(env, _delay_to(now, times[k]), arrive)

        Later(env, _delay_to(env.now, times[0]), arrive)

    def advance(self, share: _Share, until: float) -> tuple[list[int], int, tuple[bytes, bytes]]:
        """Inject the requests of *share*, run to *until*; return the snapshot, the
        requests still in the system and the window's changes of their number (times and
        deltas, which the coordinator replays while the next window runs)."""
        if len(share):
            self._inject(share)
        self.env.run(until=until)
        return self.snapshot(), len(self.recorder.live), self.in_system.take()

    def finish(self, until_s: float | None) -> dict[str, Any]:
        """Close the run (at *until_s*: settle, record what is in flight) and hand over what
        the merged Results need."""
        rec, sim = self.recorder, self.sim
        if until_s is not None:
            for i in self.owned:
                sim.replicas[i].settle(until_s)
        for req in sorted(rec.live.values(), key=lambda r: r.id):
            rec.on_in_flight(req)
        owned = set(self.owned)
        itl_values, itl_weights = rec.itl.arrays()
        # A column holding one value in every record (35 of the 46 in a plain open-loop
        # run) is handed over as that value: 8 bytes instead of 8 a record.
        single = {name: rec.single_value(name) for name, _ in RECORD_FIELDS}
        return {
            "owned": self.owned,
            "rows": rec.rows,
            "single": {name: value for name, value in single.items() if value is not None},
            "columns": {name: bytes(rec.take_column(name)) for name, value in single.items() if value is None},
            "codes": {name: list(codes.names) for name, codes in rec.codes.items()},
            "arrived": rec.arrived,
            "per_replica": {
                name: [getattr(rec, name)[i] for i in self.owned]
                for name in ("steps", "busy_s", "energy_j", "kv_block_seconds", "prefill_tokens", "decode_tokens")
            },
            "replica_steps": [sim.replicas[i].step for i in self.owned],
            "itl": (itl_values.tobytes(), itl_weights.tobytes()),
            "batch_steps": dict(rec.batch_steps),
            "in_system": self.in_system.take(),  # the changes since the last window's
            "preemptions": [p for p in rec.preemptions if p[1] in owned],
            "cold_starts": [c for c in rec.cold_starts if c[0] in owned],
            "batches": [b for b in rec.batches if b[0] in owned],
            "events": self.env.events_scheduled(),
        }


def _window_end(scenario: Scenario, t: float) -> float:
    """The end of the window that starts at *t*: Δ later, or ``simulation.until_s``."""
    delta = scenario.serving.view_refresh_s
    assert delta is not None  # sharding_problems requires it
    until = scenario.simulation.until_s
    return t + delta if until is None else min(t + delta, until)


class _ShardHost:
    """The shards one executor slot (a Dask worker) runs, advanced together each window.

    Served over a connection of its own (:meth:`listen`), a slot makes the next window's
    rows right after replying (:meth:`make_ahead`): they need no routing, and the slot
    would otherwise wait, for the other slots or for the coordinator's routing."""

    def __init__(self, scenario: Scenario, shard_targets: Sequence[Sequence[int]]) -> None:
        self.scenario = scenario
        self.shards = [_Shard(scenario, targets) for targets in shard_targets]
        units = len(scenario.serving.clusters) if scenario.serving.clusters else len(self.shards[0].sim.plans)
        self._local = np.full(units, -1, dtype=np.int64)
        """The shard (position here) serving each entry-router target: -1 for another slot's."""
        for k, targets in enumerate(shard_targets):
            self._local[list(targets)] = k
        self._arrivals = _Arrivals(scenario)
        self._until = 0.0
        """The end of the last window advanced."""
        self._ahead: _Window | Exception | None = None
        """The next window's rows, made ahead (or the error making them raised)."""
        self._ahead_cpu = 0.0

    def statics(self) -> list[list[tuple[int, str, float, int, float]]]:
        return [s.statics() for s in self.shards]

    def snapshot(self) -> list[list[int]]:
        return [s.snapshot() for s in self.shards]

    def advance(self, message: bytes) -> tuple[list[tuple[list[int], int, tuple[bytes, bytes]]], float, float, float, float]:
        """Advance every shard to the window's end; return their replies, the wall and CPU
        seconds it took here, the CPU seconds of it spent before the shards advanced
        (reading the message, making the window's rows unless made ahead, and handing the
        slot's out), and the CPU seconds spent making them ahead.

        *message* is the pickled ``(targets, until)``: the entry router's target of each
        request of the window, in arrival order, as ``int32`` bytes. The slot makes the
        rows routed to its shards itself and gives each shard its own.
        """
        t0, cpu0 = time.perf_counter(), time.thread_time()
        raw, until = pickle.loads(message)
        window = self._window(until)
        targets = np.frombuffer(raw, dtype=np.int32)
        shares = [_Share(self._arrivals) for _ in self.shards]
        self._arrivals.share(window, targets, self._local[targets], shares)
        cpu1 = time.thread_time()
        replies = [s.advance(share, until) for s, share in zip(self.shards, shares, strict=True)]
        self._until = until
        ahead_cpu, self._ahead_cpu = self._ahead_cpu, 0.0
        return replies, time.perf_counter() - t0, time.thread_time() - cpu0, cpu1 - cpu0, ahead_cpu

    def _window(self, until: float) -> _Window:
        """The rows of the window that ends at *until*: made ahead, or made now."""
        ahead, self._ahead = self._ahead, None
        if isinstance(ahead, Exception):
            raise ahead
        if ahead is None:
            return self._arrivals.window(until)
        if ahead.until != until:
            raise RuntimeError(f"a slot made the window to {ahead.until!r} ahead; the coordinator sent {until!r}")
        return ahead

    def make_ahead(self) -> None:
        """Make the next window's rows now, unless the run is at its end; an error is kept
        for that window's call to raise, as if made there."""
        until_s = self.scenario.simulation.until_s
        if self._ahead is not None or (until_s is not None and self._until >= until_s):
            return
        cpu0 = time.thread_time()
        try:
            self._ahead = self._arrivals.window(_window_end(self.scenario, self._until))
        except Exception as exc:
            self._ahead = exc
        self._ahead_cpu += time.thread_time() - cpu0

    def finish(self, until_s: float | None) -> list[dict[str, Any]]:
        return [s.finish(until_s) for s in self.shards]

    def listen(self, host: str, key: bytes) -> tuple[str, int]:
        """Serve this slot's calls on a connection of its own: listen on *host* (a free
        port), accept one client that knows *key*, and answer its calls in a thread until
        it says ``close`` or goes away. Return the address to connect to."""
        from multiprocessing.connection import Listener  # only a run on workers reached over TCP needs it

        listener = Listener((host, 0), authkey=key)
        threading.Thread(target=self._serve, args=(listener,), name="simpy-llm-shard-slot", daemon=True).start()
        address: tuple[str, int] = listener.address
        return address

    def _serve(self, listener: Any) -> None:
        from multiprocessing import AuthenticationError

        with listener:
            try:
                conn = listener.accept()
            except (AuthenticationError, OSError):  # not the coordinator: serve nobody (its run fails to connect)
                return
        _no_delay(conn)
        with conn:
            while True:
                try:
                    method, args = pickle.loads(conn.recv_bytes())
                except EOFError:  # the coordinator went away
                    return
                if method == "close":
                    return
                try:
                    reply: tuple[bool, Any] = (True, getattr(self, method)(*args))
                except Exception as exc:  # handed to the coordinator, which raises it
                    reply = (False, exc)
                conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
                if method == "advance" and reply[0]:
                    self.make_ahead()  # while the coordinator waits for the other slots, or routes


class _Host:
    """An executor slot's shards, as the coordinator calls them."""

    def call(self, method: str, *args: Any) -> Any:
        return self.wait(self.start(method, *args))

    def start(self, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def wait(self, pending: Any) -> Any:
        raise NotImplementedError


class _Local(_Host):
    """Shards in this process, run one after another when asked."""

    def __init__(self, host: _ShardHost) -> None:
        self.host = host

    def start(self, method: str, *args: Any) -> Any:
        return functools.partial(getattr(self.host, method), *args)

    def wait(self, pending: Any) -> Any:
        return pending()


class _Remote(_Host):
    """Shards in a Dask actor: a call starts at once, the coordinator waits for its reply."""

    def __init__(self, actor: Any, n: int) -> None:
        self.actor = actor
        self.n = n

    def start(self, method: str, *args: Any) -> Any:
        return getattr(self.actor, method)(*args)

    def wait(self, pending: Any) -> Any:
        return pending.result()


class _Piped(_Host):
    """Shards in a Dask actor, called over a connection of their own (:meth:`_ShardHost.listen`).

    One call at a time: :meth:`start` sends it, :meth:`wait` receives its reply.
    """

    def __init__(self, address: tuple[str, int], key: bytes) -> None:
        from multiprocessing.connection import Client

        self.conn = Client(address, authkey=key)
        _no_delay(self.conn)

    def start(self, method: str, *args: Any) -> Any:
        self.conn.send_bytes(pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL))
        return method

    def wait(self, pending: Any) -> Any:
        ok, value = pickle.loads(self.conn.recv_bytes())
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Tell the slot to stop serving, and close the connection."""
        try:
            self.conn.send_bytes(pickle.dumps(("close", ()), protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # the slot is gone already (its worker died): nothing to tell
            pass
        finally:
            self.conn.close()


def _no_delay(conn: Any) -> None:
    """Send each message of *conn* (a ``multiprocessing.connection`` over TCP) at once.

    Above 16 kB a message goes out as its length, then its body: with Nagle's algorithm
    the body waits for the length's acknowledgement, which the peer delays (~40 ms on
    Linux), so a window whose reply is that large would wait for it every time.
    """
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # a second handle on the same socket, closed here
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # not a TCP socket here (the option only saves time): send as it comes
        pass


def piped_host(address: str) -> str | None:
    """The host to serve a slot's connection on, for a Dask worker at *address* (None: call
    it through Dask): the worker's own host over ``tcp://``, the loopback for an in-process
    worker; other transports (TLS, UCX, websockets) keep Dask's own."""
    scheme, _, rest = address.partition("://")
    if scheme == "tcp":
        host = rest.rsplit(":", 1)[0]
        return None if ":" in host else host  # an IPv6 worker keeps Dask's (the connection's listener is IPv4)
    if scheme == "inproc":
        return "127.0.0.1"
    return None

