"""Counting tokens before a benchmark sends anything: the server's tokenizer, a tokenizer file, or words.

A benchmark needs token counts before it sends: to keep or drop a ShareGPT conversation
(vLLM's length filters) and to make a synthetic prompt of exactly the asked length.
:func:`token_counter` picks, in this order:

1. ``tokenizer:<file>``: a Hugging Face ``tokenizers`` file given by the user (``--tokenizer``;
   the ``bench`` extra installs ``tokenizers``);
2. ``server_tokenize``: the server's own ``POST /tokenize`` (llama.cpp, vLLM and SGLang have it);
3. ``words``: one token per whitespace-separated word, with a :class:`TokenCountWarning`, when
   neither is at hand (the emulated server counts words itself, so there it is exact).

The server's ``usage`` is what the metrics count once a request is answered
(:mod:`simpy_llm.observe.bench.metrics`); it comes too late to choose prompts.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any, Protocol

__all__ = ["FileTokenizer", "ServerTokenizer", "TokenCountWarning", "TokenCounter", "WordCounter", "token_counter"]


class TokenCountWarning(UserWarning):
    """Tokens are counted as words: the server has no ``/tokenize`` and no tokenizer file was given."""


class TokenCounter(Protocol):
    """Counts a text's tokens; :attr:`name` is what the trace header's ``token_counting`` says."""

    @property
    def name(self) -> str:
        """``server_tokenize``, ``tokenizer:<file>`` or ``words``."""
        ...

    def count(self, text: str) -> int:
        """The tokens of *text*, without the special tokens a prompt starts with."""
        ...


class WordCounter:
    """One token per whitespace-separated word.

    >>> WordCounter().count("one two  three"), WordCounter().name
    (3, 'words')
    """

    name = "words"

    def count(self, text: str) -> int:
        """Whitespace-separated words."""
        return len(text.split())


class FileTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer read from *path* (a ``tokenizer.json``).

    Raises
    ------
    ValueError
        The file cannot be read as a tokenizer, or ``tokenizers`` is not installed (the
        message names the ``bench`` extra).
    """

    def __init__(self, path: Path | str) -> None:
        try:
            from tokenizers import Tokenizer  # optional: the bench extra
        except ImportError:
            raise ValueError("--tokenizer needs the tokenizers package: pip install 'simpy-llm[bench]'") from None
        self.path = str(path)
        try:
            self._tokenizer = Tokenizer.from_file(self.path)
        except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception type for any bad file
            raise ValueError(f"--tokenizer {self.path}: not a tokenizers file: {exc}") from None

    @property
    def name(self) -> str:
        """``tokenizer:<file>``."""
        return f"tokenizer:{self.path}"

    def count(self, text: str) -> int:
        """The tokens of *text* (special tokens not added)."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


class ServerTokenizer:
    """The server's ``POST /tokenize`` at *url* (the base URL, without ``/v1``).

    The body names the text both ways (``content``: llama.cpp's; ``prompt``: vLLM's and
    SGLang's) and asks for no special tokens; the answer's ``count`` is used when given,
    else the length of its ``tokens``. Counts are remembered per text.
    """

    name = "server_tokenize"

    def __init__(self, url: str, *, model: str | None = None, timeout_s: float = 30.0, api_key: str | None = None) -> None:
        self.url = url.rstrip("/") + "/tokenize"
        self.model = model
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._cache: dict[str, int] = {}

    def _post(self, text: str) -> Any:
        body: dict[str, Any] = {"content": text, "prompt": text, "add_special": False, "add_special_tokens": False}
        if self.model is not None:
            body["model"] = self.model
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=self.headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read())

    def available(self) -> bool:
        """Whether the server answers ``/tokenize`` with a token list."""
        try:
            answer = self._post("hello world")
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return isinstance(answer, dict) and (isinstance(answer.get("tokens"), list) or isinstance(answer.get("count"), int))

    def count(self, text: str) -> int:
        """The server's count of *text*."""
        n = self._cache.get(text)
        if n is None:
            answer = self._post(text)
            n = answer["count"] if isinstance(answer.get("count"), int) else len(answer["tokens"])
            self._cache[text] = n
        return n


def token_counter(url: str, tokenizer: Path | str | None = None, *, model: str | None = None, api_key: str | None = None) -> TokenCounter:
    """The counter a benchmark of the server at *url* uses (see the module docstring).

    Warns :class:`TokenCountWarning` when it falls back to words.

    Raises
    ------
    ValueError
        *tokenizer* is given and cannot be used.
    """
    if tokenizer is not None:
        return FileTokenizer(tokenizer)
    server = ServerTokenizer(url, model=model, api_key=api_key)
    if server.available():
        return server
    warnings.warn(
        f"{url} has no /tokenize and no --tokenizer was given: counting one token per word "
        "(token_counting: words in the trace header)",
        TokenCountWarning,
        stacklevel=2,
    )
    return WordCounter()
