"""Prefix groups and synthetic token ids.

Requests of clients in the same ``prefix_group`` share their first
``prefix_length`` prompt tokens. The shared prefix is described by block
hashes (:data:`PREFIX_BLOCK_TOKENS` tokens per block) that depend only on the
seed and the group name, so a prefix-aware KV cache can match them; the
token ids themselves are generated on demand (:func:`synthetic_token_ids`),
never stored per request.
"""

from __future__ import annotations

import functools
import zlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from simpy_llm.entities import Request

__all__ = [
    "MAX_TRACE_BLOCK_ID",
    "PREFIX_BLOCK_TOKENS",
    "VOCAB_SIZE",
    "Segment",
    "content_segments",
    "namespaced_blocks",
    "prefix_blocks",
    "synthetic_token_ids",
]

Segment = tuple[int, int]
"""``(segment id, tokens)``: a run of tokens from one fixed token stream."""

PREFIX_BLOCK_TOKENS = 16
"""Tokens per prefix block hash."""
VOCAB_SIZE = 32_000
"""Token ids are drawn from [0, VOCAB_SIZE)."""


def _rng(seed: int, *key: str | int) -> np.random.Generator:
    spawn = tuple(zlib.crc32(k.encode()) if isinstance(k, str) else int(k) for k in key)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=spawn)))


@functools.lru_cache(maxsize=1024)
def prefix_blocks(seed: int, group: str, prefix_tokens: int) -> tuple[int, ...]:
    """Hashes of the blocks covering the first *prefix_tokens* tokens of *group*'s prefix.

    A shorter prefix of the same group is a prefix of a longer one.

    >>> a = prefix_blocks(1, "sys", 40); b = prefix_blocks(1, "sys", 16)
    >>> len(a), len(b), a[:1] == b
    (3, 1, True)
    >>> prefix_blocks(1, "sys", 4000)[:249] == prefix_blocks(1, "sys", 4000 - 16)
    True
    >>> prefix_blocks(1, "sys", 40) != prefix_blocks(2, "sys", 40)
    True
    """
    n = -(-prefix_tokens // PREFIX_BLOCK_TOKENS)
    # numpy draws element by element, so a shorter run is a prefix of a longer one.
    hashes = _rng(seed, "prefix", group).integers(0, 2**63 - 1, size=n, dtype=np.int64)
    return tuple(int(h) for h in hashes)


MAX_TRACE_BLOCK_ID = 2**63 - 1
"""Largest prefix-block id a trace may give (Mooncake ``hash_ids``, a trace v2 ``prefix_blocks``
column): ids are whole numbers in [0, 2**63), as the synthetic ones, so the traces of one
workload can be given disjoint ranges (:func:`namespaced_blocks`)."""


def namespaced_blocks(blocks: tuple[int, ...], namespace: int) -> tuple[int, ...]:
    """The prefix-block ids *blocks* of the trace numbered *namespace* in its workload, moved to
    that trace's own range: ``id + namespace * 2**63``.

    Block ids only mean something inside the trace that gave them (Mooncake numbers each
    trace's blocks from 0), so two traces replayed together must not share them: with ids in
    [0, 2**63) the ranges of different namespaces are disjoint, while equal ids of one trace
    stay equal (its own prefix hits are unchanged). Namespace 0, the workload's first trace,
    keeps its ids.

    >>> namespaced_blocks((0, 7), 0)
    (0, 7)
    >>> namespaced_blocks((0, 7), 1)
    (9223372036854775808, 9223372036854775815)
    """
    if not namespace:
        return blocks
    offset = namespace * (MAX_TRACE_BLOCK_ID + 1)
    return tuple(h + offset for h in blocks)


def synthetic_token_ids(seed: int, request_id: int, prompt_tokens: int, group: str = "", prefix_tokens: int = 0) -> np.ndarray:
    """Deterministic token ids for a request's prompt: the group's shared prefix, then
    tokens unique to the request.

    >>> a = synthetic_token_ids(7, 1, 50, "sys", 20); b = synthetic_token_ids(7, 2, 30, "sys", 20)
    >>> bool((a[:20] == b[:20]).all()), bool((a[20:30] == b[20:30]).all()), len(a)
    (True, False, 50)
    """
    prefix_tokens = min(prefix_tokens, prompt_tokens) if group else 0
    head = _rng(seed, "prefix-ids", group).integers(0, VOCAB_SIZE, size=prefix_tokens) if prefix_tokens else np.empty(0, np.int64)
    tail = _rng(seed, "request-ids", request_id).integers(0, VOCAB_SIZE, size=prompt_tokens - prefix_tokens)
    return np.concatenate([head, tail]).astype(np.int64)


def content_segments(req: Request) -> list[Segment]:
    """The segments of *req*'s token sequence (prompt, then output); ``docs/model.md``,
    "Requests and their content".

    Shared segments have the ids the workload gave them (prefix-block hashes, trace
    ``hash_ids``: non-negative); the request's own prompt tail and its output get
    negative ids derived from its id, which no other request shares.

    >>> from simpy_llm.entities import Request
    >>> r = Request(id=3, client_id="c", prompt_tokens=40, output_tokens=5, arrival_s=0.0,
    ...             prefix_tokens=20, prefix_blocks=(11, 12), prefix_block_tokens=16)
    >>> content_segments(r)                      # trace block hashes
    [(11, 16), (12, 4), (-8, 20), (-7, 5)]
    >>> import attrs
    >>> content_segments(attrs.evolve(r, prefix_group="sys"))   # a client's prefix group: one stream
    [(11, 20), (-8, 20), (-7, 5)]
    >>> nxt = Request(id=9, client_id="c", prompt_tokens=60, output_tokens=2, arrival_s=1.0,
    ...               context=tuple(content_segments(r)))
    >>> content_segments(nxt)
    [(11, 16), (12, 4), (-8, 20), (-7, 5), (-20, 15), (-19, 2)]
    """
    prompt = req.prompt_tokens
    segs: list[Segment] = []
    covered = 0
    if req.context:
        for seg_id, tokens in req.context:
            if covered >= prompt:
                break
            take = min(tokens, prompt - covered)
            segs.append((seg_id, take))
            covered += take
    elif req.prefix_blocks:
        per = req.prefix_block_tokens
        cover = req.prefix_tokens if req.prefix_tokens > 0 else len(req.prefix_blocks) * per
        cover = min(cover, prompt)
        if req.prefix_group and req.prefix_tokens > 0:
            # A client's prefix group is one token stream (a shorter prefix of the group
            # is a prefix of a longer one), named by its first block's hash.
            segs.append((req.prefix_blocks[0], cover))
            covered = cover
        else:
            for h in req.prefix_blocks:  # trace block hashes: each names its block given its prefix
                if covered >= cover:
                    break
                take = min(per, cover - covered)
                segs.append((h, take))
                covered += take
    if prompt > covered:
        segs.append((-(2 * req.id + 2), prompt - covered))
    segs.append((-(2 * req.id + 1), req.output_tokens))
    return segs
