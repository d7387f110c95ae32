"""Token counting before a benchmark sends: a tokenizer file, the server's /tokenize, or words (warned)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from simpy_llm.observe.bench.tokens import FileTokenizer, ServerTokenizer, TokenCountWarning, WordCounter, token_counter
from tests.observe.fake_server import FakeServer, serve_instance
from tests.observe.fake_thread import in_thread


class TokenizingServer(FakeServer):
    """The fake server with llama.cpp's ``POST /tokenize``: one token per character pair."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tokenized: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/tokenize", self.tokenize)
        return app

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.tokenized.append(body)
        text = body["content"]
        return web.json_response({"tokens": list(range(-(-len(text) // 2)))})


@asynccontextmanager
async def tokenizing() -> AsyncIterator[TokenizingServer]:
    async with serve_instance(TokenizingServer()) as server:
        yield server


def test_a_tokenizer_file_counts_as_the_tokenizer_encodes(tokenizer_file: Path) -> None:
    """``FileTokenizer`` counts the ids the file's tokenizer gives, without special tokens, and is named by its file."""
    import tokenizers

    counter = token_counter("http://127.0.0.1:9", tokenizer_file)
    text = "the server decodes children animals"
    assert counter.count(text) == len(tokenizers.Tokenizer.from_file(str(tokenizer_file)).encode(text, add_special_tokens=False).ids)
    assert counter.count(text) > len(text.split())
    assert counter.name == f"tokenizer:{tokenizer_file}"


def test_a_file_that_is_no_tokenizer_is_refused(tmp_path: Path) -> None:
    """A file ``tokenizers`` cannot read is refused, naming the option and the file."""
    pytest.importorskip("tokenizers", reason="needs the tokenizers package (the bench extra): pip install -e '.[bench]'")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=f"--tokenizer {bad}: not a tokenizers file"):
        FileTokenizer(bad)


def test_the_servers_tokenize_endpoint_is_used_when_it_answers() -> None:
    """With no tokenizer file, a server answering ``/tokenize`` counts, asked without special tokens."""
    with in_thread(tokenizing) as server:
        counter = token_counter(server.url)
        assert isinstance(counter, ServerTokenizer) and counter.name == "server_tokenize"
        assert counter.count("abcde") == 3
    assert server.tokenized[-1] == {"content": "abcde", "prompt": "abcde", "add_special": False, "add_special_tokens": False}


def test_words_are_the_last_fallback_and_warned_about() -> None:
    """A server without ``/tokenize`` and no tokenizer file: one token per word, with a warning."""
    with in_thread(lambda: serve_instance(FakeServer())) as server, pytest.warns(TokenCountWarning, match="counting one token per word"):
        counter = token_counter(server.url)
    assert isinstance(counter, WordCounter)
