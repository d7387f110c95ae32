"""A prompt source that fails for one request: it makes a worker process fail mid-run (a module
of its own so that a worker started with ``spawn`` can import it)."""

from __future__ import annotations

import attrs

from simpy_llm.observe.prompts import SyntheticPrompts


@attrs.frozen
class FailingPrompts(SyntheticPrompts):
    """:class:`SyntheticPrompts` that raises :class:`RuntimeError` when asked for request *fail_id*'s text."""

    fail_id: int = attrs.field(default=-1, kw_only=True)

    def text(self, n_tokens: int, request_id: int) -> str:
        """The synthetic text, except for request *fail_id*: :class:`RuntimeError`."""
        if request_id == self.fail_id:
            raise RuntimeError(f"no prompt for request {request_id}")
        return super().text(n_tokens, request_id)
