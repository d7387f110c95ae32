"""Prompt text for the load generator: synthetic words, or a user's prompt dataset.

The workload gives each request a length in tokens; the server's tokenizer is
unknown to the client, so a prompt source writes text of about that many
tokens under a stated **token rule**, and measures what it sends by the same
rule (the trace's ``approx_input_tokens``; the server's own count is
``input_tokens`` when it reports ``usage``):

- :class:`SyntheticPrompts` (the default), rule ``words``: one token per
  whitespace-separated word. Its words are short, common English words, each
  one token for the usual BPE vocabularies, drawn with a generator seeded by
  the workload's seed and the request id: the same workload and seed send the
  same words, and workloads of different seeds share no prompt (nor a prefix
  group's text), so a warm-up or an earlier workload leaves nothing in a
  server's prefix cache that a later one could reuse by accident.
- :class:`DatasetPrompts`, rule ``chars/4``: ``ceil(characters / 4)`` tokens
  (the usual rule of thumb for English text and GPT-style BPE tokenizers; it
  undercounts code and non-Latin scripts). A request of *n* tokens gets the
  dataset prompt whose length is closest to *n* (ties broken at random, seeded
  by the workload seed and the request id), cut to ``4 n`` characters or
  repeated (joined by a space) up to them, so that it measures exactly *n*.

:func:`load_prompts` reads a dataset: ShareGPT JSON (a list of
``{"conversations": [{"from": "human", "value": ...}, ...]}``, the first
human turn is the prompt), or JSON / JSONL records with a text column
(``prompt``, ``text`` or ``question`` found by itself, any other by name), or
a JSON list of strings.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import random
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np

__all__ = [
    "AUTO_FIELDS",
    "CHARS_PER_TOKEN",
    "DatasetPrompts",
    "PromptDataset",
    "PromptDatasetError",
    "PromptSource",
    "SyntheticPrompts",
    "approx_prompt_tokens",
    "chars_tokens",
    "fit_text",
    "load_prompts",
    "prefix_text",
    "request_seed",
    "synthetic_prompt",
]

CHARS_PER_TOKEN = 4
"""Characters per token of the ``chars/4`` rule."""

AUTO_FIELDS = ("prompt", "text", "question", "conversations")
"""Fields looked for, in this order, when no prompt field is named (``conversations``: ShareGPT)."""

_HUMAN = frozenset(("human", "user"))

# Short, common English words: each is one token in the BPE vocabularies of the usual
# open models (Llama, Qwen, Gemma, GPT-style), also with the leading space.
_WORDS = (
    "the of and to in is was for on are with as at be by this have from or one had not but what all were "
    "when we there can an your which their said if do will each about how up out them then she many some so "
    "these would other into has more her two like him see time could no make than first been its who now "
    "people my made over did down only way find use may water long little very after words called just where "
    "most know get through back much before go good new write our used me man too any day same right look "
    "think also around another came come work three word must because does part even place well such here take "
    "why things help put years different away again off went old number great tell men say small every found "
    "still between name should home big give air line set own under read last never us left end along while "
    "might next sound below saw something thought both few those always looked show large often together asked "
    "house world going want school important until form food keep children feet land side without boy once "
    "animals life enough took sometimes four head above kind began almost live page got earth need far hand "
    "high year mother light parts country father let night following picture being study second eyes soon times"
).split()
_WORD_ARRAY = np.array(_WORDS, dtype=object)
_N_WORDS = float(len(_WORDS))
_THREAD = threading.local()


def synthetic_prompt(n_tokens: int, seed: int | str = 0) -> str:
    """About *n_tokens* tokens of synthetic text: *n_tokens* words drawn (seeded) from common words.

    Each word is about one token for BPE tokenizers, so the text is about
    *n_tokens* tokens; the server's count also includes its chat template
    (a few tokens) and may differ by a few percent. The words differ with
    *seed* (an integer, or a string: hashed with SHA-512 by :class:`random.Random`,
    the same draw in every process), so prompts of different seeds share no
    prefix that a server's prefix cache could reuse; the text of fewer tokens
    is a prefix of the text of more with the same seed.

    >>> len(synthetic_prompt(5, seed=1).split()), synthetic_prompt(3, 7) == synthetic_prompt(3, 7)
    (5, True)
    >>> synthetic_prompt(6, "4/request/0").startswith(synthetic_prompt(2, "4/request/0"))
    True
    """
    k = max(int(n_tokens), 1)
    if not isinstance(seed, str):
        return " ".join(random.Random(seed).choices(_WORDS, k=k))
    # The words random.Random(seed).choices(_WORDS, k=k) draws, in 2/3 of the time: choices
    # takes word floor(random() * 238) per draw; random() is CPython's genrand_res53 of the
    # Mersenne Twister, and a str seed seeds it with init_by_array over the 32-bit words
    # (least significant first) of int.from_bytes(seed + sha512(seed)). numpy's legacy
    # RandomState is the same generator with the same seeding from such an array (of more
    # than one word: a sha512 alone has 16) and the same random(): the same words. numpy
    # keeps RandomState's streams unchanged across versions (NEP 19).
    raw = seed.encode()
    key = int.from_bytes(raw + hashlib.sha512(raw).digest(), "big")
    words = np.frombuffer(key.to_bytes(-(-key.bit_length() // 32) * 4, "little"), dtype="<u4")
    state = getattr(_THREAD, "state", None)
    if state is None:  # one per thread: seeding then drawing must not interleave with another's
        state = _THREAD.state = np.random.RandomState()
    state.seed(words)
    return " ".join(_WORD_ARRAY[(state.random_sample(k) * _N_WORDS).astype(np.intp)].tolist())


def request_seed(workload_seed: int, request_id: int) -> str:
    """The seed of request *request_id*'s words in a workload of seed *workload_seed*.

    >>> request_seed(4, 17)
    '4/request/17'
    """
    return f"{workload_seed}/request/{request_id}"


def prefix_text(group: str, n_tokens: int, seed: int = 0) -> str:
    """The shared prefix of *group* in a workload of seed *seed*: the same *n_tokens* words for
    every request of the group, so a server's prefix cache can reuse it as it would a real
    system prompt; another group, or the same group in a workload of another seed, gets other
    words.

    >>> prefix_text("sys", 4) == prefix_text("sys", 4) != prefix_text("other", 4)
    True
    >>> prefix_text("sys", 4, seed=1) != prefix_text("sys", 4, seed=2)
    True
    """
    return synthetic_prompt(n_tokens, seed=f"{seed}/prefix/{group}")


class PromptSource(Protocol):
    """Where the load generator's prompt text comes from (see the module docstring)."""

    @property
    def token_rule(self) -> str:
        """The name of the rule that measures text in tokens (``words``, ``chars/4``)."""
        ...

    def text(self, n_tokens: int, request_id: int) -> str:
        """A request's own text of *n_tokens* tokens (by the rule)."""
        ...

    def prefix(self, group: str, n_tokens: int) -> str:
        """The shared prefix of *group*, the same text for every request of the group."""
        ...

    def count(self, text: str) -> int:
        """*text*'s length in tokens by the rule."""
        ...


@attrs.frozen
class SyntheticPrompts:
    """Synthetic words (:func:`synthetic_prompt`, :func:`prefix_text`), rule ``words``, seeded
    by the workload's *seed* and the request id (a prefix group's words: by *seed* and the
    group's name).

    ``observe`` passes the workload's seed; a :class:`~simpy_llm.observe.loadgen.LoadGenerator`
    made without a prompt source uses seed 0.

    >>> p = SyntheticPrompts(seed=4)
    >>> p.count(p.text(7, request_id=3)), p.prefix("sys", 4) == prefix_text("sys", 4, seed=4)
    (7, True)
    >>> p.text(7, request_id=3) == SyntheticPrompts(seed=5).text(7, request_id=3)
    False
    """

    seed: int = attrs.field(default=0, kw_only=True)
    """The workload's seed."""
    token_rule: str = attrs.field(default="words", init=False)

    def text(self, n_tokens: int, request_id: int) -> str:
        """:func:`synthetic_prompt` seeded by the workload's seed and the request id (:func:`request_seed`)."""
        return synthetic_prompt(n_tokens, seed=request_seed(self.seed, request_id))

    def prefix(self, group: str, n_tokens: int) -> str:
        """:func:`prefix_text` of *group* in the workload of :attr:`seed`."""
        return prefix_text(group, n_tokens, seed=self.seed)

    def count(self, text: str) -> int:
        """Whitespace-separated words."""
        return len(text.split())


def chars_tokens(text: str) -> int:
    """*text*'s length in tokens by the ``chars/4`` rule: ``ceil(characters / 4)``.

    >>> chars_tokens(""), chars_tokens("abcd"), chars_tokens("abcde")
    (0, 1, 2)
    """
    return -(-len(text) // CHARS_PER_TOKEN)


def fit_text(text: str, n_tokens: int) -> str:
    """*text* cut, or repeated (joined by a space) and cut, to ``4 * n_tokens`` characters
    (at least one token): exactly *n_tokens* by the ``chars/4`` rule. A shorter fit of
    the same text is a prefix of a longer one.

    >>> fit_text("abcdefghij", 2), fit_text("abc", 2), chars_tokens(fit_text("abc", 5))
    ('abcdefgh', 'abc abc ', 5)
    """
    target = max(int(n_tokens), 1) * CHARS_PER_TOKEN
    if len(text) >= target:
        return text[:target]
    unit = text + " "
    return (unit * -(-target // len(unit)))[:target]


def approx_prompt_tokens(source: PromptSource, prompt: str | Sequence[Mapping[str, Any]]) -> int:
    """The length of *prompt* (text, or chat messages: the sum over their contents) by
    *source*'s token rule.

    >>> approx_prompt_tokens(SyntheticPrompts(), [{"role": "system", "content": "a b"}, {"role": "user", "content": "c"}])
    3
    """
    if isinstance(prompt, str):
        return source.count(prompt)
    return sum(source.count(str(m.get("content", ""))) for m in prompt)


class PromptDatasetError(ValueError):
    """A prompt dataset that cannot be used (the message names the file and why)."""


@attrs.frozen(kw_only=True)
class PromptDataset:
    """The prompts of a dataset file, as :func:`load_prompts` read them."""

    path: str
    """The file read."""
    field: str
    """The field the prompts came from (``conversations``: ShareGPT's first human turn;
    ``""`` for a list of strings)."""
    prompts: tuple[str, ...]
    """The non-empty prompts, stripped, in file order."""
    skipped: int
    """Records without a usable prompt (field missing or not text, no human turn, empty)."""


def _first_human_turn(turns: Any) -> str | None:
    if not isinstance(turns, list):
        return None
    for turn in turns:
        if not isinstance(turn, Mapping):
            continue
        who = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        if isinstance(who, str) and who.lower() in _HUMAN and isinstance(text, str):
            return text
    return None


def _records(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptDatasetError(f"{path}: cannot read the prompt dataset: {exc}") from None
    if not text.strip():
        raise PromptDatasetError(f"{path}: the prompt dataset is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    else:
        if isinstance(data, list):
            return data
        if isinstance(data, Mapping):
            return [data]
        raise PromptDatasetError(f"{path}: expected a JSON list of records or one JSON record per line, got {type(data).__name__}")
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise PromptDatasetError(f"{path}: line {number}: not valid JSON ({exc.msg}), nor is the whole file") from None
    return out


def load_prompts(path: Path | str, field: str | None = None) -> PromptDataset:
    """The prompts of the dataset at *path* (JSON or JSONL), from *field*.

    Records are JSON objects (a JSON list of them, or one per line) or strings. With
    ``field=None`` the field is the first of :data:`AUTO_FIELDS` that a record has; a
    field holding a list of turns (ShareGPT's ``conversations``: ``{"from": "human",
    "value": ...}``, or ``{"role": "user", "content": ...}``) gives its first human turn.
    Records without a usable prompt are skipped and counted.

    Raises
    ------
    PromptDatasetError
        The file cannot be read or parsed, names no prompt field, or holds no prompt.

    Examples
    --------
    >>> import json, tempfile
    >>> rows = [{"conversations": [{"from": "gpt", "value": "Hi"}, {"from": "human", "value": " Why? "}]},
    ...         {"conversations": []}]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = Path(d, "sharegpt.json")
    ...     _ = path.write_text(json.dumps(rows))
    ...     ds = load_prompts(path)
    >>> ds.field, ds.prompts, ds.skipped
    ('conversations', ('Why?',), 1)
    """
    path = Path(path)
    records = _records(path)
    if field is None:
        keys = next((r for r in records if isinstance(r, Mapping)), None)
        if keys is None:
            field = ""
        else:
            found = next((f for r in records if isinstance(r, Mapping) for f in AUTO_FIELDS if f in r), None)
            if found is None:
                raise PromptDatasetError(
                    f"{path}: no prompt field: the records have keys {', '.join(map(repr, keys))}, none of "
                    f"{', '.join(AUTO_FIELDS)}; name the field (--prompt-field)"
                )
            field = found
    prompts: list[str] = []
    for record in records:
        if isinstance(record, str):
            value: Any = record
        elif isinstance(record, Mapping) and field:
            value = record.get(field)
            if isinstance(value, list):
                value = _first_human_turn(value)
        else:
            value = None
        if isinstance(value, str) and value.strip():
            prompts.append(value.strip())
    if not prompts:
        what = f"field {field!r}" if field else "strings"
        raise PromptDatasetError(f"{path}: no prompt found ({len(records)} records, none with a non-empty {what})")
    return PromptDataset(path=str(path), field=field, prompts=tuple(prompts), skipped=len(records) - len(prompts))


class DatasetPrompts:
    """Prompts from a dataset, fitted to each request's length by the ``chars/4`` rule.

    A request of *n* tokens gets the prompt (its own text, after any shared prefix)
    whose ``chars/4`` length is closest to *n*, chosen at random among equally close
    ones with a generator seeded by *seed* and the request id, then :func:`fit_text`
    to *n*. A prefix group's text is chosen the same way (seeded by the group's name)
    the first time the group is asked for, then fitted to every length asked, so the
    group's requests share it.

    Parameters
    ----------
    prompts
        A :class:`PromptDataset` or the prompt texts.
    seed
        The workload's seed.

    Examples
    --------
    >>> p = DatasetPrompts(["a short one", "a somewhat longer prompt, forty-four chars."], seed=1)
    >>> p.text(3, request_id=0), p.count(p.text(20, request_id=0))
    ('a short one ', 20)
    """

    token_rule = "chars/4"

    def __init__(self, prompts: PromptDataset | Sequence[str], seed: int | None = None) -> None:
        texts = prompts.prompts if isinstance(prompts, PromptDataset) else tuple(prompts)
        if not texts:
            raise PromptDatasetError("no prompts")
        order = sorted(range(len(texts)), key=lambda i: chars_tokens(texts[i]))
        self.texts: tuple[str, ...] = tuple(texts[i] for i in order)
        """The prompts, shortest first."""
        self.lengths: list[int] = [chars_tokens(t) for t in self.texts]
        self.seed = seed
        self._prefixes: dict[str, str] = {}

    def _rng(self, key: str) -> random.Random:
        # A str seed is hashed with SHA-512: the same draw in every process.
        return random.Random(f"{self.seed}/{key}")

    def closest(self, n_tokens: int, rng: random.Random) -> str:
        """A prompt whose length is closest to *n_tokens*, drawn with *rng* among the equally close."""
        lengths = self.lengths
        i = bisect.bisect_left(lengths, n_tokens)
        above = lengths[i] - n_tokens if i < len(lengths) else math.inf
        below = n_tokens - lengths[i - 1] if i > 0 else math.inf
        best = min(above, below)
        lo = bisect.bisect_left(lengths, n_tokens - best) if below == best else i
        hi = bisect.bisect_right(lengths, n_tokens + best) if above == best else i
        return self.texts[lo + rng.randrange(hi - lo)]

    def text(self, n_tokens: int, request_id: int) -> str:
        """The closest prompt to *n_tokens*, fitted to it (see the class docstring)."""
        n = max(int(n_tokens), 1)
        return fit_text(self.closest(n, self._rng(f"request/{request_id}")), n)

    def prefix(self, group: str, n_tokens: int) -> str:
        """*group*'s text (chosen on first use), fitted to *n_tokens*."""
        n = max(int(n_tokens), 1)
        base = self._prefixes.get(group)
        if base is None:
            base = self._prefixes[group] = self.closest(n, self._rng(f"prefix/{group}"))
        return fit_text(base, n)

    def count(self, text: str) -> int:
        """``ceil(characters / 4)``."""
        return chars_tokens(text)
