"""Scheduler policies: the order in which a replica serves its requests.

A scheduler policy implements ``key(request, now_s)``: a sort key (a number
or a tuple of numbers; smaller goes first) that the replica computes each
time a request enters its waiting queue (on arrival, and again after each
preemption). The replica appends its own first-entry counter, so equal keys
are served first come, first served. One key decides all three scheduling
choices (``docs/model.md``, "Ordering"):

* **admission order**: waiting requests are admitted smallest key first
  (head of line: admission stops at the first that does not fit);
* **prefill chunk allocation**: the step's token budget is handed to running
  prefills in key order;
* **preemption victims**: when KV blocks run out, the running request with
  the largest key is preempted first.

The contract that keeps the replica's one-event-per-change fast path exact:
``key`` reads only the request and ``now_s`` (never the replica, the clock
later on, or other requests), and it is computed once per entry, so the
order of the running batch cannot change between batch-composition changes.
A policy that wants keys to change while requests wait (aging, least slack
recomputed as time passes) does not fit this contract.

Examples
--------
A custom policy is a class with a ``key`` method, registered by name:

>>> import attrs
>>> from simpy_llm.policies.scheduling import scheduler_policies
>>> @scheduler_policies.register("longest_prompt_first")
... @attrs.define
... class LongestPromptFirst:
...     def key(self, request, now_s):
...         return -request.prompt_tokens
>>> from simpy_llm.entities import Request
>>> LongestPromptFirst().key(Request(id=0, client_id="c", prompt_tokens=900, output_tokens=1, arrival_s=0.0), 0.0)
-900
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import at_least, one_of, optional
from simpy_llm.policies.predictors import OutputPredictor
from simpy_llm.registry import Registry

if TYPE_CHECKING:
    from simpy_llm.entities import Request

__all__ = [
    "EarliestDeadlineFirst",
    "FirstComeFirstServed",
    "PriorityScheduling",
    "SchedulerPolicy",
    "ShortestJobFirst",
    "scheduler_policies",
]


class SchedulerPolicy(Protocol):
    """Orders a replica's requests (see the module docstring for the contract)."""

    def key(self, request: Request, now_s: float) -> Any:
        """Sort key of *request* entering the waiting queue at *now_s*; smaller goes first."""
        ...


scheduler_policies: Registry[type] = Registry("scheduler policy")


@scheduler_policies.register("fcfs")
@attrs.define
class FirstComeFirstServed:
    """vLLM's default: admission in arrival order, the most recently admitted request
    preempted first (every key is equal; the replica's entry counter decides).

    >>> FirstComeFirstServed().key(None, 3.0)
    0
    """

    def key(self, request: Request, now_s: float) -> int:
        return 0


@scheduler_policies.register("priority")
@attrs.define
class PriorityScheduling:
    """Higher ``request.priority`` first, ties first come first served; the lowest
    priority (latest among equals) is preempted first. vLLM's ``--scheduling-policy
    priority`` (whose priority numbers run the other way: there lower is more urgent).

    >>> from simpy_llm.entities import Request
    >>> PriorityScheduling().key(Request(id=0, client_id="c", prompt_tokens=1, output_tokens=1, arrival_s=0.0, priority=5), 0.0)
    -5
    """

    def key(self, request: Request, now_s: float) -> int:
        return -request.priority


@scheduler_policies.register("sjf")
@attrs.define
class ShortestJobFirst:
    """Shortest job first, by what its next prefill must compute or by its predicted output.

    ``by: prompt`` (default): the tokens the request's next prefill covers,
    ``prompt_tokens + generated_tokens`` (before any prefix-cache hit, which the
    scheduler does not know until admission). ``by: output``: the output tokens still
    to generate according to ``predictor`` (an
    :class:`~simpy_llm.policies.predictors.OutputPredictor`; its ``oracle`` kind reads
    the true ``output_tokens``, which a real server cannot know). Long jobs can starve
    under sustained load: there is no aging.

    >>> from simpy_llm.entities import Request
    >>> r = Request(id=0, client_id="c", prompt_tokens=300, output_tokens=40, arrival_s=0.0)
    >>> ShortestJobFirst().key(r, 0.0), ShortestJobFirst(by="output").key(r, 0.0)
    (300, 40.0)
    """

    by: str = attrs.field(default="prompt", validator=one_of(("prompt", "output")))
    """``prompt``: tokens of the next prefill; ``output``: predicted output tokens left."""
    predictor: OutputPredictor = attrs.field(factory=lambda: OutputPredictor(kind="oracle"))
    """Output-length predictor used with ``by: output`` (default: the oracle)."""

    def __attrs_post_init__(self) -> None:
        if self.by == "prompt" and self.predictor != OutputPredictor(kind="oracle"):
            raise FieldValueError("predictor", "is used only with by: output")

    def key(self, request: Request, now_s: float) -> float:
        if self.by == "prompt":
            return request.prompt_tokens + request.generated_tokens
        return max(self.predictor.predict(request) - request.generated_tokens, 0.0)


@scheduler_policies.register("edf")
@attrs.define
class EarliestDeadlineFirst:
    """Earliest deadline first, deadline = arrival + the SLO class's TTFT target.

    With ``slack_s_per_token > 0`` it is least-slack first: the key is the deadline
    minus an estimate of the request's prefill time (``slack_s_per_token`` times the
    tokens of its next prefill), so a long prompt with the same deadline goes earlier.
    Classes without a TTFT target get ``default_ttft_s`` (none: after every request
    that has a deadline, first come first served among themselves). The SLO targets
    are the scenario's ``slo`` table, injected by the simulation.

    >>> from simpy_llm.entities import Request
    >>> edf = EarliestDeadlineFirst(slo={"chat": 0.5})
    >>> edf.key(Request(id=0, client_id="c", prompt_tokens=10, output_tokens=1, arrival_s=2.0, slo_class="chat"), 2.0)
    2.5
    >>> edf.key(Request(id=1, client_id="c", prompt_tokens=10, output_tokens=1, arrival_s=1.0), 1.0)
    inf
    """

    default_ttft_s: float | None = attrs.field(default=None, validator=optional(at_least(0)))
    """TTFT target of classes without one (seconds); none: no deadline."""
    slack_s_per_token: float = attrs.field(default=0.0, validator=at_least(0))
    """Estimated prefill seconds per token for least-slack ordering (0: plain EDF)."""
    slo: dict[str, float] = attrs.field(factory=dict)
    """TTFT target per SLO class, seconds (set by the simulation from the scenario's ``slo``)."""

    def key(self, request: Request, now_s: float) -> float:
        target = self.slo.get(request.slo_class, self.default_ttft_s)
        if target is None:
            return math.inf
        deadline = request.arrival_s + target
        if self.slack_s_per_token:
            deadline -= self.slack_s_per_token * (request.prompt_tokens + request.generated_tokens)
        return deadline
