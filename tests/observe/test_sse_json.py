"""Stream chunks are read as json.loads reads them, also where the fast parser refuses the text."""

from __future__ import annotations

import json
import math

import pytest

from simpy_llm.observe.sse import SSEEvent, SSEParser, interpret


@pytest.mark.parametrize(
    "data",
    [
        '{"choices": [{"delta": {"content": "\\ud800x"}}]}',  # a lone surrogate
        '{"choices": [{"delta": {"content": "n"}}], "usage": {"score": NaN}}',
    ],
)
def test_chunks_the_fast_parser_refuses_read_as_json_reads_them(data: str) -> None:
    """A chunk orjson refuses (a lone surrogate, NaN) is read by json:
    the content and usage are json.loads's."""
    obj = json.loads(data)
    chunk = interpret(SSEEvent(data))
    assert chunk.kind == "data"
    assert chunk.content == obj["choices"][0]["delta"]["content"]
    if "usage" in obj:
        assert chunk.usage is not None and chunk.usage.keys() == obj["usage"].keys()
        value = next(iter(chunk.usage.values()))
        assert value == next(iter(obj["usage"].values())) or math.isnan(value)


def test_invalid_json_names_json_s_error() -> None:
    """Invalid JSON is an "invalid" chunk whose message is json's own error."""
    data = '{"choices": [1,]}'
    with pytest.raises(json.JSONDecodeError) as exc:
        json.loads(data)
    assert interpret(SSEEvent(data)).error == f"invalid JSON in stream event: {exc.value} (data {data!r})"


def test_a_crlf_split_between_two_feeds_ends_one_line() -> None:
    """A \\r at the end of one feed and \\n at the start of the next end one line, not two."""
    p = SSEParser()
    assert p.feed(b'data: {"a": 1}\r') == []
    assert p.feed(b"\n\r") == []
    assert p.feed(b"\ndata: [DONE]\r\n\r\n") == [SSEEvent('{"a": 1}'), SSEEvent("[DONE]")]


def test_an_integer_beyond_64_bits_is_a_float_and_no_token_count() -> None:
    """An integer beyond 64 bits in a chunk is read as a float (where json reads an int), so a
    record does not take such a usage value as a token count."""
    from simpy_llm.observe.client import ObservedRequest, _fill_usage

    chunk = interpret(SSEEvent('{"choices": [], "usage": {"prompt_tokens": 100000000000000000000000, "completion_tokens": 2}}'))
    assert chunk.usage is not None and isinstance(chunk.usage["prompt_tokens"], float)
    rec = ObservedRequest()
    _fill_usage(rec, chunk.usage)
    assert (rec.prompt_tokens_source, rec.completion_tokens, rec.completion_tokens_source) == ("none", 2, "usage")
