"""The OpenAI-compatible request and response shapes of the emulated server (pure functions).

Requests are checked and reduced to a :class:`ParsedRequest`; bad ones raise
:class:`RequestError`, which the server turns into an OpenAI-style error body.
Token counts come without a tokenizer (see :func:`count_tokens`): a prompt
has as many tokens as it has whitespace-separated words, and every output
token is one word, so a reply pasted into a later prompt counts the same.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

__all__ = [
    "ENDPOINTS",
    "ParsedRequest",
    "RequestError",
    "chunk_bytes",
    "completion_body",
    "count_tokens",
    "error_body",
    "output_text",
    "parse_request",
    "stream_chunk",
    "usage",
    "usage_chunk",
]

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
"""Endpoint name -> path."""

OUTPUT_WORDS = (
    "the of and to in is was for on are with as at be by this have from or one had not but what all were "
    "when we there can an your which their said if do will each about how up out them then she many some so"
).split()
"""The words output tokens are made of (token *i* is ``OUTPUT_WORDS[i % len]``): one token each."""


class RequestError(Exception):
    """A request the server refuses; becomes an OpenAI-style error body.

    Parameters
    ----------
    message
        What is wrong, for the client.
    param
        The offending body field (``None``: the body as a whole).
    code
        Machine-readable code (``None`` for plain validation errors).
    status
        HTTP status.
    """

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return error_body(self.message, param=self.param, code=self.code)


def error_body(
    message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """An OpenAI-style error body.

    >>> error_body("max_tokens must be at least 1, got 0", param="max_tokens")["error"]["type"]
    'invalid_request_error'
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@attrs.frozen(kw_only=True)
class ParsedRequest:
    """What the emulated server needs from a completion request."""

    endpoint: str
    """``"chat"`` or ``"completions"``."""
    prompt_tokens: int
    """Prompt length, tokens (at least 1)."""
    max_tokens: int | None
    """Requested output length, tokens (``None``: not given)."""
    stream: bool
    """Stream the answer as server-sent events."""
    include_usage: bool
    """Streams end with a usage chunk (``stream_options.include_usage``)."""
    model: str | None = None
    """Requested model (``None``: not given)."""
    user: str = ""
    """The ``user`` field (empty: not given)."""


def count_tokens(text: str) -> int:
    """Tokens of *text* for the emulated server: its whitespace-separated words.

    >>> count_tokens("the cat  sat\\non the mat"), count_tokens("   ")
    (6, 0)
    """
    return len(text.split())


def _check_type(body: dict[str, Any], name: str, kinds: tuple[type, ...], what: str, where: str = "") -> Any:
    value = body.get(name)
    # JSON true/false are bools, which Python also counts as ints: never accept them as numbers.
    if value is not None and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
        param = where + name
        raise RequestError(f"{param} must be {what}, got {json.dumps(value)[:80]}", param=param)
    return value


def _message_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty array of messages", param="messages")
    total = 0
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(f"{where} must be an object with role and content", param=where)
        if not isinstance(msg.get("role"), str):
            raise RequestError(f"{where}.role must be a string", param=f"{where}.role")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            total += count_tokens(content or "")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(
                        f"{where}.content[{j}] must be a text part ({{\"type\": \"text\", \"text\": ...}}); "
                        "the emulated server counts text only",
                        param=f"{where}.content",
                    )
                total += count_tokens(part["text"])
        else:
            raise RequestError(f"{where}.content must be a string or an array of text parts", param=f"{where}.content")
    return total


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)  # token ids: the count is exact
    if isinstance(prompt, list) and len(prompt) == 1:
        return _prompt_tokens(prompt[0])
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError("batched prompts (several prompts in one request) are not supported", param="prompt")
    raise RequestError("prompt must be a string, an array of token ids, or an array of one of these", param="prompt")


def parse_request(body: Any, endpoint: str) -> ParsedRequest:
    """Check a ``/v1/chat/completions`` (*endpoint* ``"chat"``) or ``/v1/completions``
    (``"completions"``) body and count its prompt.

    Chat prompts count the words of every message's text (no per-message template
    tokens); completion prompts count words, or token ids when given as ids. An empty
    prompt counts as 1 token (the start token a real tokenizer adds). Chat requests
    take ``max_completion_tokens`` over ``max_tokens``. Fields the emulator does not
    model (``temperature``, ``ignore_eos``, ...) are ignored.

    Raises
    ------
    RequestError
        On a missing or ill-typed field, ``max_tokens`` below 1, or ``n`` other than 1.

    Examples
    --------
    >>> p = parse_request({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5,
    ...                    "stream": True, "stream_options": {"include_usage": True}}, "chat")
    >>> p.prompt_tokens, p.max_tokens, p.stream, p.include_usage
    (2, 5, True, True)
    >>> parse_request({"prompt": [1, 2, 3]}, "completions").prompt_tokens
    3
    >>> parse_request({"prompt": "hi", "max_tokens": 0}, "completions")
    Traceback (most recent call last):
    ...
    simpy_llm.observe.emulate.protocol.RequestError: max_tokens must be at least 1, got 0
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if endpoint == "chat":
        if "messages" not in body:
            raise RequestError("messages is required", param="messages")
        prompt = _message_tokens(body["messages"])
    else:
        if "prompt" not in body:
            raise RequestError("prompt is required", param="prompt")
        prompt = _prompt_tokens(body["prompt"])
    max_tokens = _check_type(body, "max_tokens", (int,), "an integer")
    if endpoint == "chat":
        mct = _check_type(body, "max_completion_tokens", (int,), "an integer")
        if mct is not None:
            max_tokens, name = mct, "max_completion_tokens"
        else:
            name = "max_tokens"
    else:
        name = "max_tokens"
    if max_tokens is not None and max_tokens < 1:
        raise RequestError(f"{name} must be at least 1, got {max_tokens}", param=name)
    stream = _check_type(body, "stream", (bool,), "a boolean") or False
    options = _check_type(body, "stream_options", (dict,), "an object") or {}
    include_usage = _check_type(options, "include_usage", (bool,), "a boolean", "stream_options.") or False
    n = _check_type(body, "n", (int,), "an integer")
    if n is not None and n != 1:
        raise RequestError(f"n must be 1 (the emulated server returns one choice), got {n}", param="n")
    model = _check_type(body, "model", (str,), "a string")
    user = _check_type(body, "user", (str,), "a string") or ""
    return ParsedRequest(
        endpoint=endpoint,
        prompt_tokens=max(prompt, 1),
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        model=model,
        user=user,
    )


def output_text(start: int, stop: int) -> str:
    """The text of output tokens ``start .. stop-1`` (0-based): one word per token,
    each after the first preceded by a space.

    >>> output_text(0, 3) + output_text(3, 4)
    'the of and to'
    """
    words = OUTPUT_WORDS
    return "".join(("" if i == 0 else " ") + words[i % len(words)] for i in range(start, stop))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object.

    >>> usage(3, 4)
    {'prompt_tokens': 3, 'completion_tokens': 4, 'total_tokens': 7}
    """
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def stream_chunk(
    endpoint: str,
    response_id: str,
    created: int,
    model: str,
    text: str | None,
    *,
    finish_reason: str | None = None,
    role: bool = False,
) -> dict[str, Any]:
    """One streamed chunk with *text* (chat: a ``delta``; completions: ``text``);
    ``role=True`` makes the chat stream's opening ``{"role": "assistant"}`` delta.

    >>> stream_chunk("chat", "chatcmpl-1", 0, "m", " of")["choices"][0]["delta"]
    {'content': ' of'}
    """
    if endpoint == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return {"id": response_id, "object": kind, "created": created, "model": model, "choices": [choice]}


def usage_chunk(endpoint: str, response_id: str, created: int, model: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The last chunk of a stream with ``include_usage``: no choices, the usage."""
    kind = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    return {
        "id": response_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk_bytes(obj: dict[str, Any] | str) -> bytes:
    """One SSE event: ``data: <json>`` and a blank line (a string is sent as is, e.g. ``[DONE]``).

    >>> chunk_bytes("[DONE]")
    b'data: [DONE]\\n\\n'
    """
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def completion_body(
    endpoint: str, response_id: str, created: int, model: str, prompt_tokens: int, completion_tokens: int, finish_reason: str
) -> dict[str, Any]:
    """The whole (non-streamed) response.

    >>> b = completion_body("completions", "cmpl-0", 0, "m", 3, 2, "length")
    >>> b["choices"][0]["text"], b["usage"]["total_tokens"]
    ('the of', 5)
    """
    text = output_text(0, completion_tokens)
    if endpoint == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return {
        "id": response_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }
