"""The one exception a bad scenario raises, and the warning for a part of a scenario left out of the run."""

from __future__ import annotations

__all__ = ["WORKLOAD_SPEC", "FieldValueError", "ProblemList", "ScenarioError", "ScenarioWarning"]

WORKLOAD_SPEC = "workload spec"
"""What a :class:`ScenarioError` about a bare workload spec says the file holds."""


class ScenarioError(ValueError):
    """A scenario that cannot be loaded: names the file, the key path and what is allowed.

    Attributes
    ----------
    source
        The file (or ``"<dict>"``) the scenario came from.
    problems
        ``(key_path, message)`` pairs, one per problem found, e.g.
        ``("workload.clients[1].arrival.cv", "must be > 0, got -1.0")``.
    what
        What the file holds, for the message (``"scenario"``; ``"workload spec"`` for a
        bare workload spec, whose key paths are relative to the workload).
    """

    def __init__(self, source: str, problems: list[tuple[str, str]], what: str = "scenario") -> None:
        self.source = source
        self.problems = problems
        self.what = what
        lines = [f"{source}: {len(problems)} problem(s) in {what}"]
        lines += [f"  {path or '<top level>'}: {msg}" for path, msg in problems]
        super().__init__("\n".join(lines))

    @property
    def paths(self) -> list[str]:
        """The key paths of all problems, in the order found."""
        return [p for p, _ in self.problems]

    def __reduce__(self) -> tuple[type[ScenarioError], tuple[str, list[tuple[str, str]], str]]:
        # Rebuilt from its fields, not its message: an error raised in a worker process (a
        # sweep's, a capacity study's) reaches the caller as the same ScenarioError.
        return type(self), (self.source, self.problems, self.what)


class FieldValueError(ValueError):
    """Raised by config validators: a field's value is outside what is allowed.

    The loader turns it into a :class:`ScenarioError` entry whose key path ends
    in *field*.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class ScenarioWarning(UserWarning):
    """A scenario that runs, but not entirely as written: part of it has no effect.

    Issued with :func:`warnings.warn` when the simulation is built (loading and
    validating a file stay quiet), e.g. for a client with ``rate_fraction: 0``, which
    sends no requests. The message names the client and its key path.
    """


class ProblemList:
    """Problems found in one file, collected to be reported together: the first *limit*
    listed, the rest counted.

    Examples
    --------
    >>> found = ProblemList("LUT", limit=1)
    >>> found.add("row 2: dtype", "must be fp16, bf16 or fp8"); found.add("row 3: phase", "unknown")
    >>> found.raise_if_any("t.csv")
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: t.csv: 2 problem(s) in LUT
      row 2: dtype: must be fp16, bf16 or fp8
      <top level>: ... and 1 more problem(s) not listed
    """

    def __init__(self, what: str, limit: int = 25) -> None:
        self.what = what
        self.limit = limit
        self.items: list[tuple[str, str]] = []
        self.dropped = 0

    def __len__(self) -> int:
        """Problems found so far, listed or not."""
        return len(self.items) + self.dropped

    def add(self, path: str, message: str) -> None:
        """Record the problem *message* at key path *path*."""
        if len(self.items) < self.limit:
            self.items.append((path, message))
        else:
            self.dropped += 1

    def raise_if_any(self, source: str) -> None:
        """Raise the :class:`ScenarioError` of *source* if anything was found."""
        if self.items:
            items = list(self.items)
            if self.dropped:
                items.append(("", f"... and {self.dropped} more problem(s) not listed"))
            raise ScenarioError(source, items, self.what)
