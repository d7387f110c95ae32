"""Answers read into records: what both of the client's transports fill an
:class:`~simpy_llm.observe.client.ObservedRequest` with, so that the same bytes make the same
record whichever transport read them (:class:`StreamReader` for streams, :func:`json_answer` for
whole answers, :func:`http_error_message` for HTTP errors).

"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from simpy_llm.observe.sse import SSEParser, chunk_fields

if TYPE_CHECKING:
    from simpy_llm.observe.client import ObservedRequest

__all__ = ["StreamReader", "http_error_message", "json_answer", "short_message"]

_MAX_ERROR_CHARS = 300


def _fill_usage(rec: ObservedRequest, usage: dict[str, Any]) -> None:
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(p, int):
        rec.prompt_tokens, rec.prompt_tokens_source = p, "usage"
    if isinstance(c, int):
        rec.completion_tokens, rec.completion_tokens_source = c, "usage"
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        rec.cached_tokens = details["cached_tokens"]


def short_message(text: str) -> str:
    """*text* on one line, cut to at most 300 characters (an error message of a record).

    >>> short_message("a\\n  b")
    'a b'
    """
    text = " ".join(text.split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def http_error_message(status: int, reason: str | None, body: bytes) -> str:
    """The error message of an HTTP *status* answer with *body* (its JSON ``error.message`` when it has one).

    >>> http_error_message(429, "Too Many Requests", b'{"error": {"message": "rate limited"}}')
    'HTTP 429 Too Many Requests: rate limited'
    """
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        text = err.get("message", json.dumps(err)) if isinstance(err, dict) else str(err)
    except (json.JSONDecodeError, ValueError):
        pass
    return short_message(f"HTTP {status} {reason or ''}: {text}".replace(" :", ":"))


class StreamReader:
    """The reading of one streamed answer into its record: :meth:`feed` the body's bytes as they
    arrive (split anywhere), each read with its receive time, then :meth:`keep_text` and
    :meth:`end`. Both transports read streams with it (:class:`OpenAIClient`, *transport*), so
    the same bytes make the same record whichever read them.

    Examples
    --------
    >>> from simpy_llm.observe.client import ObservedRequest
    >>> rec = ObservedRequest()
    >>> reader = StreamReader(rec)
    >>> reader.feed(b'data: {"choices": [{"delta": {"content": "Hi"}}]}\\n\\nda', 0.5)
    False
    >>> reader.feed(b'ta: [DONE]\\n\\n', 0.75)
    True
    >>> reader.keep_text(); reader.end(0.75)
    >>> rec.status, rec.chunk_times_s, rec.output_chars
    ('ok', [0.5], 2)
    """

    __slots__ = ("done", "parser", "problem", "rec", "text")

    def __init__(self, rec: ObservedRequest) -> None:
        self.rec = rec
        self.parser = SSEParser()
        # Content kept for closed-loop sessions is joined once: appending to a str is quadratic.
        self.text: list[str] | None = [] if rec.output_text is not None else None
        self.done = False
        """``data: [DONE]`` was read (what follows it is not read)."""
        self.problem = ""

    def feed(self, data: bytes, t: float) -> bool:
        """Read *data*, received at *t* (seconds since the run start); True once ``[DONE]`` was read."""
        rec = self.rec
        if rec.first_byte_s is None:
            rec.first_byte_s = t
        # Each event as plain fields (chunk_fields, the fields of interpret's StreamChunk): no
        # object per event.
        for fields in self.parser.feed_fields(data):
            kind, content, reasoning, usage, error, finish = chunk_fields(fields[0], fields[1])
            if kind == "done":
                self.done = True
                return True
            rec.chunk_times_s.append(t)
            rec.last_chunk_s = t
            if rec.first_chunk_s is None:
                rec.first_chunk_s = t
            if kind != "data":
                self.problem = self.problem or (error or kind)
                continue
            if content or reasoning:  # StreamChunk.has_content
                rec.content_times_s.append(t)
                if rec.first_content_s is None:
                    rec.first_content_s = t
                rec.output_chars += len(content)
                if self.text is not None:
                    self.text.append(content)
                rec.reasoning_chars += len(reasoning)
            if usage:
                _fill_usage(rec, usage)
            rec.finish_reason = finish or rec.finish_reason
        return False

    def keep_text(self) -> None:
        """Put the content read so far in the record's ``output_text`` (when it keeps text)."""
        if self.text is not None:
            self.rec.output_text = "".join(self.text)

    def end(self, t: float) -> None:
        """The stream ended at *t* (``[DONE]`` or the end of the body): the record's end and status."""
        rec = self.rec
        rec.done_s = t
        if self.problem:
            rec.status, rec.error_message = "error", short_message(self.problem)
        elif not self.done:
            left = self.parser.close()
            rec.status = "error"
            rec.error_message = "stream ended without data: [DONE]" + (" (incomplete event left)" if left else "")
        else:
            rec.status = "ok"


def json_answer(rec: ObservedRequest, raw: bytes, t: float) -> None:
    """Fill *rec* from a whole non-streamed answer *raw* read at *t*: one chunk, its content and usage.

    >>> from simpy_llm.observe.client import ObservedRequest
    >>> rec = ObservedRequest(endpoint="completions")
    >>> json_answer(rec, b'{"choices": [{"text": "abc"}], "usage": {"completion_tokens": 1}}', 2.0)
    >>> rec.status, rec.output_chars, rec.completion_tokens, rec.done_s
    ('ok', 3, 1, 2.0)
    """
    rec.done_s = t
    rec.first_byte_s = t if raw else None
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, ValueError) as exc:
        rec.status, rec.error_message = "error", short_message(f"invalid JSON response: {exc}")
        return
    if not isinstance(obj, dict) or obj.get("error") is not None:
        err = obj.get("error") if isinstance(obj, dict) else obj
        rec.status, rec.error_message = "error", short_message(f"server error: {err}")
        return
    rec.first_chunk_s = rec.last_chunk_s = t
    rec.chunk_times_s = [t]
    text, reasoning = [], []
    for choice in obj.get("choices") or []:
        msg = choice.get("message") if isinstance(choice, dict) else None
        src = msg if isinstance(msg, dict) else (choice if isinstance(choice, dict) else {})
        c = src.get("content") if isinstance(msg, dict) else src.get("text")
        text.append(c if isinstance(c, str) else "")
        r = src.get("reasoning_content")
        reasoning.append(r if isinstance(r, str) else "")
        rec.finish_reason = rec.finish_reason or src.get("finish_reason") or choice.get("finish_reason")
    rec.output_chars, rec.reasoning_chars = sum(map(len, text)), sum(map(len, reasoning))
    if rec.output_text is not None:
        rec.output_text = "".join(text)
    if rec.output_chars or rec.reasoning_chars:
        rec.first_content_s = t
        rec.content_times_s = [t]
    if isinstance(obj.get("usage"), dict):
        _fill_usage(rec, obj["usage"])
    rec.status = "ok"
