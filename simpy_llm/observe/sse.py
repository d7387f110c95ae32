"""Incremental Server-Sent Events parsing for OpenAI-style streams (pure; no I/O).

:class:`SSEParser` takes the body of a ``text/event-stream`` response in byte
chunks of any size, split anywhere (inside a line, between ``\\r`` and ``\\n``,
inside a multi-byte character), and returns the complete events. It follows
the WHATWG event-stream rules: lines end with ``\\r\\n``, ``\\n`` or ``\\r``; a
blank line ends an event; lines starting with ``:`` are comments (pings);
several ``data:`` lines join with ``\\n``; one space after the colon is
dropped; a leading byte-order mark is ignored; an event without ``data`` is not
dispatched. Scanning resumes where the previous chunk stopped, so a very long
line (a response echoing a long prompt) costs linear time.

:func:`interpret` reads one event as an OpenAI chunk: ``[DONE]``, an ``error``
object, invalid JSON, or a data chunk with its content (``delta.content`` for
chat, ``text`` for completions), ``reasoning_content`` and ``usage`` (the
usage-only final chunk has ``choices: []``).

>>> p = SSEParser()
>>> p.feed(b'data: {"choices": [{"delta": {"content": "Hi"}}]}\\r')
[]
>>> [interpret(e).content for e in p.feed(b'\\n\\r\\n: ping\\n\\ndata: [DONE]\\n\\n')]
['Hi', '']
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import orjson

__all__ = ["SSEEvent", "SSEParser", "StreamChunk", "chunk_fields", "interpret", "parse_events"]

_BOM = "\ufeff"
_LINE_END = re.compile("\r\n|\r|\n")


@attrs.frozen
class SSEEvent:
    """One dispatched event: its ``data`` (lines joined with ``\\n``), ``event`` type and ``id``."""

    data: str
    event: str = ""
    id: str | None = None
    retry: int | None = None


class SSEParser:
    """Incremental event-stream parser: :meth:`feed` bytes, get complete :class:`SSEEvent` s.

    ``comments`` counts comment lines seen (``: ping`` keep-alives). After the
    body ends, :meth:`close` tells whether an unterminated event was left
    (per the spec it is discarded, never dispatched).
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan = 0  # bytes of _buf already searched for a line end
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._first_line = True
        self.comments = 0
        self.bytes_fed = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse *chunk* and return the events it completes (possibly none)."""
        return [SSEEvent(*fields) for fields in self.feed_fields(chunk)]

    def feed_fields(self, chunk: bytes) -> list[tuple[str, str, str | None, int | None]]:
        """:meth:`feed`, each event as the tuple of its fields ``(data, event, id, retry)``
        rather than an :class:`SSEEvent` (a stream reader's form: no object per event).

        >>> SSEParser().feed_fields(b"event: x\\ndata: a\\n\\n")
        [('a', 'x', None, None)]
        """
        self.bytes_fed += len(chunk)
        buf = self._buf
        buf += chunk
        n = len(buf)
        # A \r as the very last byte may be the first half of \r\n: wait for the next byte.
        stop = n - 1 if n and buf[-1] == 0x0D else n
        # Everything up to the last line end is whole lines; the scan starts where the last
        # one stopped, so a very long line fed in small chunks costs linear time.
        cut = max(buf.rfind(b"\n", self._scan, stop), buf.rfind(b"\r", self._scan, stop))
        if cut < 0:
            self._scan = stop
            return []
        # Decoded in one piece: a UTF-8 sequence never holds a \r or \n byte, so this splits
        # exactly where line-by-line decoding would.
        text = bytes(buf[: cut + 1]).decode("utf-8", "replace")
        del buf[: cut + 1]
        self._scan = 0
        lines = text.split("\n") if "\r" not in text else _LINE_END.split(text)
        lines.pop()  # the empty text after the last line end
        events: list[tuple[str, str, str | None, int | None]] = []
        line_ = self._line
        for line in lines:
            if line.startswith("data:") and not self._first_line:  # the usual lines, in short
                self._data.append(line[6:] if line.startswith(" ", 5) else line[5:])
            elif not line and self._data and not self._first_line:  # the blank line ending an event
                events.append(("\n".join(self._data), self._event, self._id, self._retry))
                self._data = []
                self._event = ""
            else:
                line_(line, events)
        return events

    def close(self) -> bool:
        """End of body: True if an incomplete event (unterminated line or undispatched data) was left."""
        left = bool(self._buf) or bool(self._data)
        self._buf.clear()
        self._scan = 0
        self._data = []
        return left

    def _line(self, line: str, events: list[tuple[str, str, str | None, int | None]]) -> None:
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            if self._data:
                events.append(("\n".join(self._data), self._event, self._id, self._retry))
            self._data = []
            self._event = ""
            return
        if line[0] == ":":
            self.comments += 1
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry":
            if value.isdigit():
                self._retry = int(value)


def parse_events(body: bytes) -> list[SSEEvent]:
    """Every complete event of a whole stream body.

    >>> [e.data for e in parse_events(b"data: a\\ndata: b\\n\\nevent: x\\n\\ndata: c")]
    ['a\\nb']
    """
    p = SSEParser()
    return p.feed(body)


@attrs.frozen
class StreamChunk:
    """One event read as an OpenAI streaming chunk.

    ``kind`` is ``"done"`` (``data: [DONE]``), ``"error"`` (an ``error`` object,
    ``error`` holds its message), ``"invalid"`` (not a JSON object; ``error``
    says why) or ``"data"``. ``content`` is the text (chat ``delta.content`` or
    completions ``text``, all choices joined), ``reasoning`` the
    ``reasoning_content`` (or ``reasoning``), ``usage`` the ``usage`` object
    when the chunk has one, ``finish_reason`` the first non-null one.
    """

    kind: str
    content: str = ""
    reasoning: str = ""
    usage: dict[str, Any] | None = None
    error: str | None = None
    finish_reason: str | None = None

    @property
    def has_content(self) -> bool:
        """True when the chunk carries generated text (content or reasoning): a token chunk."""
        return bool(self.content or self.reasoning)


def _error_message(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message") or err.get("msg") or json.dumps(err)[:500]
        code = err.get("code") or err.get("type")
        return f"{msg} ({code})" if code else str(msg)
    return str(err)[:500]


def _loads(data: str) -> Any:
    """``json.loads(data)``, in a third of the time: orjson parses what it can, giving json's
    objects but for integers beyond 64 bits (floats; json: int, so such a count is not taken as
    a token count); what it refuses (NaN, lone surrogates, deep nesting, invalid JSON) goes to
    json, which gives its own answer or error."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def interpret(event: SSEEvent) -> StreamChunk:
    """*event* as a :class:`StreamChunk` (see there).

    >>> interpret(SSEEvent('{"choices": [], "usage": {"completion_tokens": 3}}')).usage
    {'completion_tokens': 3}
    >>> interpret(SSEEvent('{"error": {"message": "overloaded", "code": 503}}')).error
    'overloaded (503)'
    >>> interpret(SSEEvent('{"choices": [')).kind
    'invalid'
    """
    return StreamChunk(*chunk_fields(event.data, event.event))


def chunk_fields(data: str, event: str = "") -> tuple[str, str, str, dict[str, Any] | None, str | None, str | None]:
    """The fields of :func:`interpret`'s :class:`StreamChunk` of an event with *data* and type
    *event*, as a tuple ``(kind, content, reasoning, usage, error, finish_reason)`` (a stream
    reader's form: no object per event).

    >>> chunk_fields('{"choices": [{"delta": {"content": "Hi"}, "finish_reason": "stop"}]}')
    ('data', 'Hi', '', None, None, 'stop')
    >>> chunk_fields("[DONE]")
    ('done', '', '', None, None, None)
    """
    if data == "[DONE]" or ("[DONE]" in data and data.strip() == "[DONE]"):  # no stripped copy of every chunk
        return ("done", "", "", None, None, None)
    try:
        obj = _loads(data)
    except (json.JSONDecodeError, RecursionError) as exc:
        return ("invalid", "", "", None, f"invalid JSON in stream event: {exc} (data {data[:80]!r})", None)
    if not isinstance(obj, dict):
        return ("invalid", "", "", None, f"stream event is not a JSON object: {data[:80]!r}", None)
    if event == "error" or obj.get("error") is not None:
        return ("error", "", "", None, _error_message(obj.get("error", obj)), None)
    content = reasoning = ""  # joined over the choices (usually one: no list to join)
    finish = None
    choices = obj.get("choices") or []
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        src = delta if isinstance(delta, dict) else choice
        text = src.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str):
            content += text
        r = src.get("reasoning_content") or src.get("reasoning")
        if isinstance(r, str):
            reasoning += r
        if finish is None and choice.get("finish_reason"):
            finish = str(choice["finish_reason"])
    usage = obj.get("usage")
    return ("data", content, reasoning, usage if isinstance(usage, dict) else None, None, finish)
