"""Prefill/decode disaggregation: the hand-off from a prefill pool to a decode pool.

A disaggregated fleet (``serving.disaggregation``, ``docs/network.md``) has prefill
replicas (``role: prefill``) and decode replicas (``role: decode``). The entry router
sends each arrival to a prefill replica, which computes its prompt and first token and
puts it into the handoffs Wire. :class:`KvHandoff` takes it from there:

1. the decode router chooses its decode replica (a session's later rounds are pinned to
   the decode replica its first round used: seed 003's "Pool Isolation and Draft
   Affinity"; the router never sees a decode job for the prefill pool or the reverse,
   since each router's outboxes are its own pool's);
2. its KV (``prompt_tokens x kv_bytes_per_token`` bytes) crosses the
   :class:`~simpy_llm.network.link.Link` from its prefill replica to that decode replica,
   shared with the other transfers in flight on that link;
3. on delivery the client has its first token (the decode replica streams the response
   from there on: ``first_token_s`` is the delivery time plus the decode replica's
   per-token post-processing), and the request enters the decode replica holding its
   prompt's KV (``kv_received_tokens``); the decode replica's first step computes the KV
   of the first token and emits the second.

So an isolated request's TTFT is its prefill (queueing overhead and step) plus the
transfer, and its E2E adds one decode step per further token. A one-token response
completes on its prefill replica and crosses nothing. A transfer the link drops (its
``kv_transfer`` faults: loss beyond the retransmissions allowed, an outage in drop
mode) drops its request.

The prefill replica releases the request's blocks when it hands it off (they stay in its
prefix cache, findable if a later round of a session may reuse them): the transfer is
modelled as the copy a pull-based connector makes after the prefill, without holding
the prefill replica's memory meanwhile.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from simpy_llm.wire import Wire

if TYPE_CHECKING:
    import simpy

    from simpy_llm.entities import Request
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.network.link import Link, Message
    from simpy_llm.serving.router import Router

__all__ = ["KvHandoff"]


class KvHandoff:
    """Moves handed-off requests from prefill replicas to decode replicas over links.

    Parameters
    ----------
    env
        The SimPy environment.
    handoffs
        Wire the prefill replicas put requests into after their prefill (this component
        becomes its handler).
    decode_router
        Router over the decode pool whose outboxes are *transfers* (one per decode
        replica, in its position order).
    transfers
        One Wire per decode replica: the decode router's outboxes (this component
        becomes their handler and sends each request over its link).
    decode_inboxes
        The decode replicas' inboxes, by position.
    links
        The link from each prefill replica (fleet index) to each decode position:
        ``links[(prefill_index, decode_position)]``.
    delivered
        Wire every link delivers to (this component becomes its handler).
    kv_bytes_per_token
        KV bytes a prompt token takes on the wire.
    first_token_overheads_s
        Per decode position, its latency model's per-token post-processing, s.
    recorder
        Told of each transfer.
    lost
        Wire every link puts the messages it drops on (this component becomes its handler):
        the request is recorded as dropped (``kv_transfer_loss`` or ``kv_transfer_outage``),
        and the decode router's counts forget it.
    dropped
        Wire receiving those dropped requests (e.g. the completions Wire, so sessions see the
        drop); None: they are only recorded.
    """

    def __init__(
        self,
        env: simpy.Environment,
        handoffs: Wire,
        decode_router: Router,
        transfers: Sequence[Wire],
        decode_inboxes: Sequence[Wire],
        links: dict[tuple[int, int], Link],
        delivered: Wire,
        kv_bytes_per_token: float,
        first_token_overheads_s: Sequence[float],
        recorder: Recorder,
        lost: Wire | None = None,
        dropped: Wire | None = None,
    ) -> None:
        self.env = env
        self.decode_router = decode_router
        self.decode_inboxes = list(decode_inboxes)
        self._inbox_sends = [wire.send for wire in self.decode_inboxes]
        """Each decode inbox's send, by position."""
        self.links = links
        self.kv_bytes_per_token = kv_bytes_per_token
        self.first_token_overheads_s = list(first_token_overheads_s)
        self.recorder = recorder
        self._position = {index: pos for pos, index in enumerate(decode_router.indices)}
        self._pinned: dict[str, int] = {}
        """Decode position of each session that has been handed off once."""
        self.in_transfer: dict[int, Request] = {}
        """Requests whose KV is on a link, by id."""
        self.dropped = dropped
        handoffs.connect(self._handoff)
        for pos, wire in enumerate(transfers):
            wire.connect(functools.partial(self._send, pos))
        delivered.connect(self._deliver)
        if lost is not None:
            lost.connect(self._lost)

    def _handoff(self, req: Request) -> None:
        req.prefill_replica = req.replica
        sid = req.session_id
        pos = self._pinned.get(sid) if sid else None
        if pos is not None and not self.decode_router.is_active(pos):
            del self._pinned[sid]  # its decode replica left the pool (the planner): choose anew
            pos = None
        if pos is None:
            self.decode_router.route(req)
        else:
            self.decode_router.send(req, pos)

    def _send(self, pos: int, req: Request) -> None:
        if req.session_id:
            self._pinned.setdefault(req.session_id, pos)
        self.in_transfer[req.id] = req
        req.kv_transfer_s = self.env.now  # the transfer's start, until it ends
        self.links[(req.prefill_replica, pos)].send(req, req.prompt_tokens * self.kv_bytes_per_token)

    def _deliver(self, message: Message) -> None:
        req: Request = message.payload
        now = self.env.now
        del self.in_transfer[req.id]
        pos = self._position[req.replica]
        start = req.kv_transfer_s
        req.kv_transfer_s = now - start
        req.kv_received_tokens = req.prompt_tokens
        req.first_token_s = now + self.first_token_overheads_s[pos]
        req.last_token_engine_s = now
        self.recorder.on_kv_transfer(req.id, req.prefill_replica, req.replica, message.size_bytes, start, now)
        self._inbox_sends[pos](req)

    def _lost(self, message: Message) -> None:
        """A link dropped *message*: its request ends here, dropped, and the decode router's
        counts (routed, not yet departed) forget it."""
        req: Request = message.payload
        now = self.env.now
        del self.in_transfer[req.id]
        counts = self.decode_router.counts
        counts.routed[req.replica] -= 1
        counts.routed_tokens[req.replica] -= req.prompt_tokens
        req.kv_transfer_s = math.nan
        req.dropped_reason = f"kv_transfer_{message.dropped_reason}"
        self.recorder.on_drop(req)
        self.recorder.on_departure(now)
        if self.dropped is not None:
            self.dropped.send(req)
