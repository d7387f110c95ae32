"""The emulated server (``simpy-llm serve``) the benchmark tests send to, and a tokenizer file.

The server runs as its own process on 127.0.0.1 (stopped by its PID) with the emulation
scenario of the observer's tests, made faster (3 ms steps) so that a benchmark of a few runs
takes a second or two. It has no ``/tokenize``: benchmarks against it count words, as it does.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.observe.emulate.conftest import SLOW
from tests.observe.serve_process import ServeProcess, serve_process

WORDS = (
    "the server queues each request until a batch slot is free then it prefills the prompt and decodes "
    "one token per step for every sequence in the batch while new requests wait their turn"
).split()
"""The text the tests' tokenizer is trained on: its pieces are parts of these words, so most other
words take several tokens."""


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``simpy-llm serve`` on a free port of 127.0.0.1 for the module's tests."""
    tmp = tmp_path_factory.mktemp("bench-server")
    data = copy.deepcopy(SLOW)
    data["serving"]["latency_model"]["params"].update(beta0_us=3000.0, alpha0_us=1000.0)
    data["serving"]["engine"]["kv_num_blocks"] = 512
    scenario = tmp / "fast.yaml"
    scenario.write_text(yaml.safe_dump(data))
    with serve_process(scenario, tmp) as server:
        yield server


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small BPE ``tokenizers`` file (80 pieces: the letters and merges of :data:`WORDS`) trained
    here (nothing is downloaded)."""
    tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers package (the bench extra): pip install -e '.[bench]'")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]"], initial_alphabet=list("abcdefghijklmnopqrstuvwxyz"))
    tok.train_from_iterator([" ".join(WORDS)], trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tok.save(str(path))
    return path
