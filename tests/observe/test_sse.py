"""The incremental SSE parser and the OpenAI chunk interpreter."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from simpy_llm.observe.sse import SSEEvent, SSEParser, interpret, parse_events


def _feed_split(body: bytes, cuts: list[int]) -> tuple[list[SSEEvent], SSEParser]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    last = 0
    for cut in [*sorted(set(cuts)), len(body)]:
        events += parser.feed(body[last:cut])
        last = cut
    return events, parser


_text = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
_event = st.tuples(st.lists(_text, min_size=1, max_size=3), st.sampled_from(["", "message", "error"]))
_eol = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def _streams(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent]]:
    """A valid stream (random line ends, comments, multi-line data, non-ASCII) and its events."""
    parts: list[str] = []
    expected: list[SSEEvent] = []
    eol = draw(_eol)  # one line end per stream: "\r" then "\n" would be one "\r\n" line end
    for lines, etype in draw(st.lists(_event, max_size=6)):
        if draw(st.booleans()):
            parts.append(": ping" + eol)
            parts.append(eol)  # a blank line after a comment dispatches nothing
        if etype:
            parts.append(f"event: {etype}" + eol)
        for line in lines:
            space = " " if line.startswith(" ") else draw(st.sampled_from(["", " "]))  # one space is dropped
            parts.append(f"data:{space}{line}" + eol)
        parts.append(eol)
        expected.append(SSEEvent("\n".join(lines), etype))
    parts.append("data: [DONE]\n\n")
    expected.append(SSEEvent("[DONE]"))
    return "".join(parts).encode(), expected


@given(_streams(), st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_random_chunking_gives_the_same_events(stream: tuple[bytes, list[SSEEvent]], cuts: list[int]) -> None:
    """Splitting a valid stream at random byte positions (inside lines, between CR and LF,
    inside UTF-8 characters) yields exactly the events of the whole stream, which are the
    ones written; nothing is left over."""
    body, expected = stream
    cuts = [c % (len(body) + 1) for c in cuts]
    whole = parse_events(body)
    split, parser = _feed_split(body, cuts)
    assert whole == expected
    assert split == expected
    assert parser.close() is False


@given(_streams())
def test_byte_at_a_time(stream: tuple[bytes, list[SSEEvent]]) -> None:
    """Feeding one byte at a time gives the same events as the whole stream."""
    body, expected = stream
    events, _ = _feed_split(body, list(range(len(body))))
    assert events == expected


def test_comments_bom_fields_and_incomplete_tail() -> None:
    """A leading BOM is ignored, comments are counted and never dispatched, an event without
    data is not dispatched, ``id``/``retry`` are kept, and an unterminated final event is
    reported by close() instead of being dispatched."""
    p = SSEParser()
    events = p.feed("\ufeffdata: a\r\nid: 7\r\nretry: 100\r\n\r\n:ping\n\nevent: x\n\ndata: tail".encode())
    assert events == [SSEEvent("a", "", "7", 100)]
    assert p.comments == 1
    assert p.close() is True


def test_large_event_in_small_chunks() -> None:
    """A 6 MB data line (a response to a long prompt) fed in 64 KiB chunks parses into one event
    (the scan resumes where it stopped, so this stays linear)."""
    content = "x" * (6 * 2**20)
    body = _stream_bytes([{"choices": [{"delta": {"content": content}}]}])
    p = SSEParser()
    events: list[SSEEvent] = []
    for i in range(0, len(body), 65536):
        events += p.feed(body[i : i + 65536])
    assert len(events) == 2
    assert interpret(events[0]).content == content
    assert interpret(events[1]).kind == "done"


def _stream_bytes(objs: list[dict]) -> bytes:
    return b"".join(f"data: {json.dumps(o)}\n\n".encode() for o in objs) + b"data: [DONE]\n\n"


def test_interpret_openai_chunks() -> None:
    """interpret() reads chat deltas, completions text, reasoning_content, the usage-only final
    chunk (choices: []), finish_reason, error objects, invalid JSON and [DONE]."""
    role = interpret(SSEEvent('{"choices": [{"delta": {"role": "assistant"}}]}'))
    assert role.kind == "data" and not role.has_content
    chat = interpret(SSEEvent('{"choices": [{"delta": {"content": "Hi"}, "finish_reason": "length"}]}'))
    assert chat.content == "Hi" and chat.has_content and chat.finish_reason == "length"
    comp = interpret(SSEEvent('{"choices": [{"text": " there"}]}'))
    assert comp.content == " there"
    think = interpret(SSEEvent('{"choices": [{"delta": {"reasoning_content": "hmm", "content": null}}]}'))
    assert think.reasoning == "hmm" and think.content == "" and think.has_content
    usage = interpret(SSEEvent('{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'))
    assert usage.usage == {"prompt_tokens": 3, "completion_tokens": 2} and not usage.has_content
    err = interpret(SSEEvent('{"error": {"message": "boom"}}'))
    assert err.kind == "error" and err.error == "boom"
    assert interpret(SSEEvent('{"choices": [{"delta": {"content": ')).kind == "invalid"
    assert interpret(SSEEvent("[1, 2]")).kind == "invalid"
    assert interpret(SSEEvent("[DONE]")).kind == "done"
