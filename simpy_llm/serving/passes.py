"""How one engine step is cut into forward passes (``EngineConfig.ubatch_split``).

A step computes every decoder's next token and some prefill chunks. A server with a
physical batch of ``ubatch`` tokens runs it as several forward passes, each timed by the
latency model alone, so each pays the model's fixed cost. Two ways of cutting, both
llama.cpp's (``llama_batch_allocr``):

* ``simple`` (a unified KV cache, and every engine with ``ubatch_tokens``): the step's
  tokens in order, decode tokens first and then each chunk, cut every ``ubatch`` tokens
  (``split_simple``);
* ``by_slot`` (a KV stream per slot, llama.cpp's server with ``kv_unified`` off): a pass
  takes the first sequence with tokens left and, scanning on in the step's order (decoders
  by slot, then prompts by slot), every sequence on the next slot id, then the next, as
  long as the ids run on; it takes the same number of tokens from each, as many as the
  shortest has left and ``ubatch`` allows (``split_equal`` with ``sequential``). So
  decoders on slots {0, 2, 3} take two passes where {0, 1, 2} take one, and a prompt
  beside decoders adds a pass for the tokens after its first.

A pass is ``(prefill tokens, decoders, attention pairs)``; the engine times it with the
latency model's ``step_time_s`` (each decoder's context is its share of the step's).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Pass", "simple_passes", "slot_passes"]

Pass = tuple[int, int, int]
"""One forward pass: (prefill tokens, decoders, causal-attention pairs of its prefill tokens)."""


def _pairs(cached: int, a: int, b: int) -> int:
    """Causal-attention pairs of tokens ``a .. b-1`` of a chunk computed after *cached*
    tokens: token ``i`` attends to ``cached + i + 1`` keys."""
    return (b - a) * cached + (b * (b + 1) - a * (a + 1)) // 2


def simple_passes(chunks: Sequence[tuple[int, int]], n_decode: int, ubatch: int) -> list[Pass]:
    """The step's tokens in order, decode tokens first, cut every *ubatch* tokens.

    *chunks* are ``(cached tokens, chunk tokens)`` of each prefill chunk, in the step's order.

    Examples
    --------
    >>> simple_passes([(0, 600)], 3, 512)     # 3 decode tokens and 509 prompt tokens, then 91
    [(509, 3, 129795), (91, 0, 50505)]
    >>> simple_passes([], 5, 2)
    [(0, 2, 0), (0, 2, 0), (0, 1, 0)]
    """
    passes: list[Pass] = []
    decoders = n_decode
    while decoders > ubatch:
        passes.append((0, ubatch, 0))
        decoders -= ubatch
    prefill, pairs, room = 0, 0, ubatch - decoders
    for cached, chunk in chunks:
        a = 0
        while a < chunk:
            if not room:
                passes.append((prefill, decoders, pairs))
                decoders = prefill = pairs = 0
                room = ubatch
            b = min(chunk, a + room)
            prefill += b - a
            pairs += _pairs(cached, a, b)
            room -= b - a
            a = b
    passes.append((prefill, decoders, pairs))
    return passes


def slot_passes(decode_slots: Sequence[int], chunks: Sequence[tuple[int, int, int]], ubatch: int) -> list[Pass]:
    """The passes of a step on a server with a KV stream per slot (module docstring).

    Parameters
    ----------
    decode_slots
        The slot of each decoder (one token each), in any order.
    chunks
        ``(slot, cached tokens, chunk tokens)`` of each prefill chunk, in any order; one
        chunk per slot.
    ubatch
        Tokens of one pass at most.

    Examples
    --------
    Decoders on slots 0 and 1 run together, the one on 3 alone:

    >>> slot_passes([3, 0, 1], [], 512)
    [(0, 2, 0), (0, 1, 0)]

    A 100-token prompt on slot 2 beside them: its first token joins the run 0, 1, 2, the
    other 99 take a pass of their own:

    >>> slot_passes([3, 0, 1], [(2, 0, 100)], 512)
    [(1, 2, 1), (0, 1, 0), (99, 0, 5049)]

    Two prompts on slots 1 and 2 share a pass, 100 tokens each, until the shorter ends:

    >>> slot_passes([], [(1, 0, 300), (2, 50, 100)], 512)
    [(200, 0, 15100), (200, 0, 40100)]
    """
    # The step's sequences in llama.cpp's batch order: decode tokens by slot, then prompts by slot.
    seqs = [(s, 0, 1, True) for s in sorted(decode_slots)]
    seqs += [(s, cached, chunk, False) for s, cached, chunk in sorted(chunks)]
    done = [0] * len(seqs)
    passes: list[Pass] = []
    left = len(seqs)
    while left:
        members: list[int] = []
        last = -2
        for i, (slot, _cached, n, _dec) in enumerate(seqs):
            if done[i] < n and (not members or slot == last + 1):
                members.append(i)
                last = slot
        take = min(min(seqs[i][2] - done[i] for i in members), max(1, ubatch // len(members)))
        prefill = decoders = pairs = 0
        for i in members:
            _slot, cached, n, decoder = seqs[i]
            if decoder:
                decoders += 1
            else:
                prefill += take
                pairs += _pairs(cached, done[i], done[i] + take)
            done[i] += take
            if done[i] == n:
                left -= 1
        passes.append((prefill, decoders, pairs))
    return passes
