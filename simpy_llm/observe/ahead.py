"""Request bodies built ahead of their targets, within a bound on the bytes they hold.

Benchmark tools such as ``vllm bench`` and guidellm sample and tokenize their dataset before
the clock starts, so that what the client does per request between a target and its send is
the send alone. :class:`Lookahead` is the load generator's version of that, with a bound: it
builds the bodies (spec, JSON bytes, the prompt's length by the token rule) of the requests
next in line, in target order, while the bytes it holds stay under its budget. The
:class:`~simpy_llm.observe.loadgen.LoadGenerator` fills it before its clock starts and tops it
up during the run in the time before each target, so a run whose bodies all fit builds every
one before its first send, and a longer run holds at most the budget (plus one body). A body
built is kept without the prompt text it was made from (its spec keeps the rest: the send needs
no more), so the budget holds about twice the requests it would hold with the text.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import attrs

from simpy_llm.observe.client import RequestSpec

__all__ = ["Built", "Lookahead", "held_bytes"]

R = TypeVar("R")

Built = tuple[RequestSpec, bytes | None, int]
"""A body built ahead: the spec, its JSON bytes (``None``: the spec could not be encoded, and
the send encodes it again to record why), and ``approx_prompt_tokens``. A spec whose body was
built has an empty prompt: the body holds it, and a send given the body does not read it."""


def held_bytes(spec: RequestSpec, body: bytes | None) -> int:
    """Bytes a built body holds: its JSON and the prompt text it was made from.

    >>> held_bytes(RequestSpec("four", 1), b"0123456789")
    14
    """
    prompt = spec.prompt
    text = len(prompt) if isinstance(prompt, str) else sum(len(str(m.get("content", ""))) for m in prompt)
    return (len(body) if body is not None else 0) + text


class Lookahead(Generic[R]):
    """The bodies of *order*'s requests built ahead, in order, holding at most *budget_bytes*.

    Parameters
    ----------
    order
        The requests in the order they are sent.
    budget_bytes
        The most the built bodies hold at once (:func:`held_bytes`); one more is built while
        they hold less, so the bound is exceeded by at most one body.
    make
        A request's spec and its prompt's length by the token rule.
    encode
        A spec's JSON body (:meth:`~simpy_llm.observe.client.OpenAIClient.encode`); an exception
        leaves the body ``None`` (the send then encodes it, and its record says why it failed).

    Examples
    --------
    >>> ahead = Lookahead(["a b", "c"], 20, lambda r: (RequestSpec(r, 1), len(r.split())), lambda s: s.prompt.encode())
    >>> ahead.fill(), ahead.take(0)[1:], ahead.take(1)[1:], ahead.take(1)
    (2, (b'a b', 2), (b'c', 1), None)
    """

    def __init__(
        self,
        order: Sequence[R],
        budget_bytes: int,
        make: Callable[[R], tuple[RequestSpec, int]],
        encode: Callable[[RequestSpec], bytes],
    ) -> None:
        self.order = order
        self.budget_bytes = budget_bytes
        self.make = make
        self.encode = encode
        self.held = 0
        """Bytes the built bodies hold."""
        self._items: deque[tuple[int, Built, int]] = deque()  # (position in order, built, bytes held)
        self._next = 0  # position of the next request to build
        self._build_s = 0.0  # how long the last build took

    def __len__(self) -> int:
        return len(self._items)

    def room(self) -> bool:
        """Whether a request is left to build and the budget has room for it."""
        return self._next < len(self.order) and self.held < self.budget_bytes

    def build_one(self) -> bool:
        """Build the next request's body if the budget has room; whether it did."""
        if not self.room():
            return False
        position = self._next
        self._next = position + 1
        spec, approx = self.make(self.order[position])
        body: bytes | None
        try:
            body = self.encode(spec)
        except Exception:  # noqa: BLE001 - encoded again at the send, whose record then says why it failed
            body = None
        else:
            # The prompt is in the body: its text need not be held twice until the send.
            spec = attrs.evolve(spec, prompt="")
        size = held_bytes(spec, body)
        self.held += size
        self._items.append((position, (spec, body, approx), size))
        return True

    def fill(self) -> int:
        """Build until the budget is reached or every request is built; how many are held."""
        while self.build_one():
            pass
        return len(self._items)

    def top_up(self, now: Callable[[], float], until_s: float) -> None:
        """Build while the clock *now* leaves the time the last build took before *until_s*."""
        perf = time.perf_counter
        while now() + self._build_s < until_s:
            t0 = perf()
            if not self.build_one():
                return
            self._build_s = perf() - t0

    def take(self, position: int) -> Built | None:
        """The body of the request at *position*, taken out, or ``None`` when it was not built
        ahead (the caller builds it; building ahead goes on after it)."""
        items = self._items
        if items and items[0][0] == position:
            _, built, size = items.popleft()
            self.held -= size
            return built
        self._next = max(self._next, position + 1)
        return None

    def same_order(self, order: Sequence[Any]) -> bool:
        """Whether *order* holds the very requests this window was built for, in the same order."""
        return len(order) == len(self.order) and all(a is b for a, b in zip(order, self.order, strict=True))
