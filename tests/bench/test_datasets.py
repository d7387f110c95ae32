"""A benchmark's datasets: vLLM's ShareGPT sampling, random and synthetic lengths, prompt files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simpy_llm.observe.bench.datasets import (
    BenchRequest,
    conversation_pairs,
    dataset_requests,
    fitted_words,
    sample_sharegpt,
    sharegpt_records,
)
from simpy_llm.observe.bench.tokens import FileTokenizer, WordCounter
from simpy_llm.observe.prompts import PromptDatasetError

SAMPLE = Path(__file__).parents[1] / "data" / "bench" / "sharegpt_sample.json"


def words(n: int) -> str:
    return " ".join(["word"] * n)


def test_sharegpt_filters_are_vllms() -> None:
    """A pair is dropped when its prompt has fewer than 4 tokens or more than 1024, its reply
    fewer than 4, or both together more than 2048; the others are kept."""
    pairs = [
        (words(3), words(10)),  # prompt too short
        (words(4), words(3)),  # reply too short
        (words(1025), words(10)),  # prompt too long
        (words(1024), words(1025)),  # together too long
        (words(4), words(4)),  # kept: the shortest allowed
        (words(1024), words(1024)),  # kept: exactly 2048
    ]
    kept = sample_sharegpt(pairs, 10, WordCounter(), seed=0)
    assert sorted((r.input_len, r.output_len) for r in kept) == [(4, 4), (1024, 1024)]


def test_sharegpt_output_len_replaces_the_reply_and_its_filter() -> None:
    """With a fixed output length (vLLM's --sharegpt-output-len) a short reply no longer drops its pair."""
    kept = sample_sharegpt([(words(5), words(1))], 10, WordCounter(), seed=0, output_len=7)
    assert kept == [BenchRequest(words(5), 5, 7)]


def test_sharegpt_sampling_is_seeded_and_stops_at_num() -> None:
    """The same seed takes the same pairs in the same order; *num* bounds how many."""
    pairs = [(f"{words(5)} {i}", words(5)) for i in range(50)]
    first = sample_sharegpt(pairs, 10, WordCounter(), seed=3)
    assert len(first) == 10 and first == sample_sharegpt(pairs, 10, WordCounter(), seed=3)
    assert first != sample_sharegpt(pairs, 10, WordCounter(), seed=4)


def test_the_sample_file_keeps_first_human_turns_with_their_replies() -> None:
    """Each record gives its first human turn and the turn after it; a record without a reply
    after a human turn gives nothing, and the length filters drop the rest of the sample's traps."""
    pairs = conversation_pairs(sharegpt_records(SAMPLE))
    assert len(pairs) == 11  # 12 records, one never answered
    assert ("Then explain what time to first token measures.",
            "It measures the wait from sending a request until its first output token arrives.") in pairs
    kept = dataset_requests(str(SAMPLE), 100, WordCounter(), seed=0)
    # Dropped: "Hi" (prompt of 1 word), "FCFS." (reply of 1 word), the 1040-word prompt.
    assert len(kept) == 8
    assert all(4 <= r.input_len <= 1024 and r.output_len >= 4 for r in kept)


def test_sharegpt_by_name_is_refused_saying_to_give_the_file() -> None:
    """No package ships ShareGPT V3 whole, so ``--dataset sharegpt`` asks for the file instead."""
    with pytest.raises(PromptDatasetError, match=r"ShareGPT_V3_unfiltered_cleaned_split\.json .* --dataset FILE"):
        dataset_requests("sharegpt", 5, WordCounter())


def test_random_lengths_are_drawn_in_the_range_and_seeded() -> None:
    """``random`` draws lengths uniformly in [len * (1 - r), len * (1 + r)], the same for the same
    seed, and each prompt counts its drawn length."""
    reqs = dataset_requests("random", 200, WordCounter(), seed=1, input_len=100, output_len=10, range_ratio=0.5)
    assert {r.input_len for r in reqs} <= set(range(50, 151)) and {r.output_len for r in reqs} <= set(range(5, 16))
    assert len({r.input_len for r in reqs}) > 20
    assert all(len(r.prompt.split()) == r.input_len for r in reqs)
    assert reqs == dataset_requests("random", 200, WordCounter(), seed=1, input_len=100, output_len=10, range_ratio=0.5)


def test_synthetic_prompts_count_exactly_by_a_tokenizer_file(tokenizer_file: Path) -> None:
    """With a tokenizer whose tokens are not words, a synthetic prompt still counts exactly the
    asked tokens by that tokenizer (and not by words)."""
    counter = FileTokenizer(tokenizer_file)
    reqs = dataset_requests("synthetic", 5, counter, input_len=37, output_len=3)
    assert [counter.count(r.prompt) for r in reqs] == [37] * 5
    assert all(len(r.prompt.split()) < 37 for r in reqs)


def test_fitted_words_hit_every_length_of_a_subword_tokenizer(tokenizer_file: Path) -> None:
    """:func:`fitted_words` finds text of each length 1..120 for a tokenizer splitting words into pieces."""
    counter = FileTokenizer(tokenizer_file)
    assert all(counter.count(fitted_words(n, counter, f"seed/{n}")) == n for n in range(1, 121))


def test_a_prompt_file_without_replies_needs_an_output_length(tmp_path: Path) -> None:
    """A JSONL prompt file is sent as it is with ``--output-len`` tokens each, and refused without it."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"question number {i} about servers"}) for i in range(3)) + "\n")
    with pytest.raises(ValueError, match="needs --output-len"):
        dataset_requests(str(path), 3, WordCounter())
    reqs = dataset_requests(str(path), 10, WordCounter(), output_len=6)
    assert sorted(r.prompt for r in reqs) == [f"question number {i} about servers" for i in range(3)]
    assert {(r.input_len, r.output_len) for r in reqs} == {(5, 6)}


@pytest.mark.parametrize(
    ("dataset", "kwargs", "message"),
    [
        ("random", {"input_len": 10}, "needs --input-len and --output-len"),
        ("synthetic", {"input_len": 10, "output_len": 2, "range_ratio": 0.2}, "is for --dataset random"),
        ("random", {"input_len": 10, "output_len": 2, "range_ratio": 1.0}, r"must be in \[0, 1\)"),
        (str(SAMPLE), {"input_len": 10}, "--input-len is for --dataset random or synthetic"),
        (str(SAMPLE), {"prompt_field": "text"}, "is ShareGPT JSON, whose prompts are the first human turns"),
    ],
)
def test_lengths_that_do_not_fit_the_dataset_are_refused(dataset: str, kwargs: dict[str, Any], message: str) -> None:
    """Each length option is refused where it would not be used, naming the option."""
    with pytest.raises(ValueError, match=message):
        dataset_requests(dataset, 3, WordCounter(), **kwargs)
