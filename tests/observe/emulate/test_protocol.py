"""Request checking and token counting of the emulated server (no server needed)."""

from __future__ import annotations

import pytest

from simpy_llm.observe.emulate.protocol import RequestError, output_text, parse_request


def _chat(content: object, **kw: object) -> dict:
    return {"messages": [{"role": "user", "content": content}], **kw}


def test_prompt_tokens_are_words() -> None:
    """A prompt has as many tokens as whitespace-separated words, whatever the spacing."""
    assert parse_request({"prompt": " alpha  beta\tgamma\n delta "}, "completions").prompt_tokens == 4


def test_token_id_prompts_count_ids() -> None:
    """Completion prompts given as token ids (or one list of them) count the ids."""
    assert parse_request({"prompt": [5, 6, 7, 8, 9]}, "completions").prompt_tokens == 5
    assert parse_request({"prompt": [[5, 6]]}, "completions").prompt_tokens == 2


def test_empty_prompts_count_one_token() -> None:
    """An empty prompt or chat counts as 1 token (a real tokenizer's start token), so the engine can run it."""
    assert parse_request({"prompt": ""}, "completions").prompt_tokens == 1
    assert parse_request(_chat(""), "chat").prompt_tokens == 1


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    """Chat requests take max_completion_tokens over the deprecated max_tokens."""
    assert parse_request(_chat("hi", max_tokens=9, max_completion_tokens=2), "chat").max_tokens == 2
    assert parse_request(_chat("hi", max_tokens=9), "chat").max_tokens == 9
    assert parse_request(_chat("hi"), "chat").max_tokens is None


def test_non_text_parts_are_refused() -> None:
    """Image (or any non-text) content parts get a clear 400: only text is counted."""
    part = {"type": "image_url", "image_url": {"url": "data:..."}}
    with pytest.raises(RequestError, match="text part") as info:
        parse_request(_chat([part]), "chat")
    assert info.value.status == 400 and info.value.param == "messages[0].content"


def test_unknown_fields_are_ignored() -> None:
    """Sampling and vendor fields the emulator does not model are accepted and ignored."""
    p = parse_request(_chat("a b", temperature=0.2, ignore_eos=True, seed=3, top_k=5, stream=None), "chat")
    assert (p.prompt_tokens, p.stream, p.include_usage) == (2, False, False)


def test_output_text_is_one_word_per_token() -> None:
    """The output of n tokens is n words, however it is cut into chunks."""
    assert len(output_text(0, 300).split()) == 300
    assert "".join(output_text(i, i + 1) for i in range(50)) == output_text(0, 50)
