"""Speculation on a disaggregated fleet: the decode pool's verify servers.

With ``serving.disaggregation`` and a ``speculation`` section the prefill pool is made of
ordinary engine replicas (``role: prefill``): each computes a request's prompt and first
token and hands it off; its KV crosses to a decode replica over the KV links
(:class:`~simpy_llm.serving.disaggregation.KvHandoff`), and the decode replicas are
:class:`DecodeVerifyServer` s, which run the request's verify rounds (distributed, fused or,
under ``mode: hybrid``, the mode selector's choice) as a co-located verify server does
after its own prefill.

A decode-pool verify server **receives** a request whose prefill is done, never prefilling
it again. The KV hand-off delivers it holding its prompt's KV and its first token
(``kv_received_tokens``, ``first_token_s`` set by the hand-off); the server admits it at
that instant when the KV guard and ``max_num_seqs`` allow, its reservation (prompt +
output, as for a prefilled request) starting with the transferred prompt. Admitting it is
when its mode is chosen, and its first round starts then: a fused round is queued, or
the first token goes to the draft device as the verdict of the prefill, carrying the first
round's γ. A request that does not fit waits, first come first served, and is admitted
the moment a departure frees room. A server whose model is unloaded starts loading when
a request reaches it (a distributed round drafts meanwhile).

:class:`VerifyPool` gives the draft fleet the verify servers by fleet index: the decode
pool's only, since a request's rounds and verdicts start after its hand-off.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from simpy_llm.speculative.verify import VerifyServer

if TYPE_CHECKING:
    from simpy_llm.entities import Request

__all__ = ["DecodeVerifyServer", "VerifyPool", "VerifyServers"]


class DecodeVerifyServer(VerifyServer):
    """A verify server of a disaggregated fleet's decode pool (module docstring).

    Its parameters are :class:`~simpy_llm.speculative.verify.VerifyServer`'s; its inbox
    receives the requests the KV hand-off delivers, prefilled on the prefill pool.
    """

    @functools.cached_property
    def received(self) -> deque[Request]:
        """Delivered requests waiting for room (KV or ``max_num_seqs``), in delivery order."""
        return deque()

    def in_flight(self) -> list[Request]:
        """Requests delivered here that have not left (admitted or waiting for room)."""
        return sorted([*self.running.values(), *self.received], key=lambda r: r.id)

    def arrive(self, req: Request) -> None:
        """A request whose KV has arrived: admitted now if it fits, else queued for room
        (dropped at once when longer than ``max_model_len`` or than the whole KV)."""
        limit = self.max_model_len
        need = req.prompt_tokens + req.output_tokens
        if (limit is not None and need > limit) or need > self._kv_capacity:
            self.abort(req, "max_model_len" if limit is not None and need > limit else "kv_capacity")
            self.send_verdict(req, 0)
            return
        self.received.append(req)
        self._admit_received()

    def _admit_received(self) -> None:
        """Admit the waiting delivered requests, in order, while the head fits; each starts
        its first round (a fused job, or the prefill's verdict to its device)."""
        waiting = self.received
        memory = self._memory
        while waiting and self._admissible(waiting[0]):
            req = waiting.popleft()
            self._kv_change(req.prompt_tokens + req.output_tokens)
            if memory.used_blocks > memory.peak_used_blocks:
                memory.peak_used_blocks = memory.used_blocks
            self.running[req.id] = req
            if not self._busy and self.cold_wait_s() > 0.0:
                self._start_load()  # the load starts as the request arrives; a draft device drafts meanwhile
            self._choose_mode(req)
            spec = req.spec
            assert spec is not None  # set while its device runs it
            spec.last_token_s = req.last_token_engine_s  # the first token: the prefill's, delivered now
            if spec.mode == "fused":
                self._next_fused(req, self.env.now)
            else:
                self.send_verdict(req, 1)

    def _leave(self, req: Request) -> None:
        super()._leave(req)
        if self.received:
            self._admit_received()

    def set_max_num_seqs(self, value: int) -> None:
        """As :meth:`VerifyServer.set_max_num_seqs`, and a raised limit admits waiting requests."""
        super().set_max_num_seqs(value)
        if self.received:
            self._admit_received()


class VerifyServers(Protocol):
    """What the draft fleet asks of its targets: the verify server at a fleet index, and
    every verify server (a co-located fleet's list, or a disaggregated one's :class:`VerifyPool`)."""

    def __getitem__(self, index: int, /) -> VerifyServer: ...

    def __iter__(self) -> Iterator[VerifyServer]: ...

    def __len__(self) -> int: ...


class VerifyPool:
    """The verify servers of a disaggregated fleet, by fleet index (:class:`VerifyServers`):
    indexing takes a decode replica's fleet index; iterating and ``len`` go over the
    servers in fleet order.

    >>> pool = VerifyPool({5: "b", 3: "a"})  # verify servers in a run; strings show the lookup
    >>> pool[5], len(pool), list(pool)
    ('b', 2, ['a', 'b'])
    """

    def __init__(self, servers: dict[int, VerifyServer]) -> None:
        self._by_index = dict(sorted(servers.items()))

    def __getitem__(self, index: int, /) -> VerifyServer:
        return self._by_index[index]

    def __len__(self) -> int:
        return len(self._by_index)

    def __iter__(self) -> Iterator[VerifyServer]:
        return iter(self._by_index.values())
