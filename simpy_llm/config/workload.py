"""The workload section of a scenario: clients, their arrivals and lengths, sessions,
multimodal and reasoning shares, agentic workflows, ServeGen data and replayed traces.

Part of the config tree (:mod:`simpy_llm.config.schema` gathers it); values and shapes only.
"""

from __future__ import annotations

from typing import Any

import attrs

from simpy_llm.config.common import (
    ArrivalField,
    LengthField,
    NetworkConfig,
    PriorityField,
    Probability,
    TimeWindow,
)
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.paths import resolve_path
from simpy_llm.config.validators import (
    MAX_PRIORITY,
    MAX_RATE,
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_SCALE,
    MAX_SEED,
    MAX_TIME_S,
    MAX_TOKENS,
    MIN_RATE,
    MIN_SCALE,
    all_of,
    at_least,
    at_most,
    greater_than,
    in_range,
    interval_within,
    non_empty,
    one_of,
    optional,
)

__all__ = [
    "MAX_FAN_OUT",
    "MAX_ITERATIONS",
    "ActiveWindow",
    "AgenticConfig",
    "ClientConfig",
    "LifecycleConfig",
    "LoopConfig",
    "MultiTurnConfig",
    "MultimodalConfig",
    "ReasoningConfig",
    "ServeGenConfig",
    "StepConfig",
    "ToolConfig",
    "TraceSource",
    "WorkloadConfig",
]


@attrs.frozen(kw_only=True)
class ActiveWindow(TimeWindow):
    """A period in which a client sends requests."""


@attrs.frozen(kw_only=True)
class LifecycleConfig:
    """When a client is active (ServeGen's client churn). Outside the windows it sends
    nothing; its arrival process runs on active time only, so a bursty process stays
    bursty inside each window."""

    windows: tuple[ActiveWindow, ...] = attrs.field(validator=non_empty)
    """Active windows, in increasing, non-overlapping order."""

    def __attrs_post_init__(self) -> None:
        for a, b in zip(self.windows, self.windows[1:], strict=False):
            if b.start_s < a.end_s:
                raise FieldValueError("windows", "windows must be in increasing order and must not overlap")


@attrs.frozen(kw_only=True)
class MultimodalConfig:
    """Per-request modality mix. The prompt is text tokens plus, per modality,
    count x tokens-per-item (each item drawn separately)."""

    text_distribution: LengthField
    """Text tokens per request."""
    image_distribution: LengthField | None = None
    """Tokens per image."""
    image_count_distribution: LengthField | None = None
    """Images per request (rounded, may be 0)."""
    audio_distribution: LengthField | None = None
    """Tokens per audio segment."""
    audio_count_distribution: LengthField | None = None
    """Audio segments per request."""
    video_distribution: LengthField | None = None
    """Tokens per video segment."""
    video_count_distribution: LengthField | None = None
    """Video segments per request."""

    def __attrs_post_init__(self) -> None:
        for kind in ("image", "audio", "video"):
            per_item = getattr(self, f"{kind}_distribution")
            count = getattr(self, f"{kind}_count_distribution")
            if (per_item is None) != (count is None):
                raise FieldValueError(f"{kind}_count_distribution", f"give both {kind}_distribution and {kind}_count_distribution, or neither")


@attrs.frozen(kw_only=True)
class ReasoningConfig:
    """Reasoning-model outputs: a share of each output is reasoning tokens."""

    reason_ratio_distribution: LengthField
    """reason tokens / output tokens, a value in [0, 1] (bimodal in ServeGen's data)."""


@attrs.frozen(kw_only=True)
class MultiTurnConfig:
    """Closed-loop sessions: each round is sent after the previous one completes plus a think time."""

    max_rounds: int = attrs.field(validator=all_of(at_least(1), at_most(MAX_REQUESTS)))
    """Rounds per session, at most (the first included)."""
    think_time: LengthField
    """Seconds between a round's completion and the next round's arrival."""
    context_growth: str = attrs.field(default="accumulate", validator=one_of(("accumulate", "fixed")))
    """``accumulate``: a round's prompt is every earlier prompt and output plus its own new
    prompt; ``fixed``: each round draws its own prompt."""
    rounds_distribution: LengthField | None = None
    """Rounds per session (clamped to max_rounds); default: always max_rounds."""


MAX_FAN_OUT = 1024
"""Most parallel instances of one workflow step."""
MAX_ITERATIONS = 100_000
"""Most iterations of a workflow loop."""


@attrs.frozen(kw_only=True)
class ToolConfig:
    """A tool an agentic workflow calls (``docs/agentic.md``)."""

    latency_s: LengthField
    """Time a call takes, s (a draw below 0 counts as 0)."""
    output_tokens: LengthField
    """Tokens the call returns (they join the context of later ``accumulate`` steps)."""
    capacity: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REPLICAS * 1024))))
    """Calls served at once; more wait in a FIFO queue (None: unlimited, a pure delay)."""


@attrs.frozen(kw_only=True)
class StepConfig:
    """One step of an agentic workflow: an LLM call or a tool call."""

    id: str = attrs.field(validator=non_empty)
    """Step name, unique within the workflow."""
    type: str = attrs.field(validator=one_of(("llm_call", "tool_call")))
    """``llm_call`` (a request to the serving system) or ``tool_call`` (a call of a tool)."""
    depends_on: tuple[str, ...] = ()
    """Steps that must all complete first (none: the root)."""
    fan_out: int | None = attrs.field(default=None, validator=optional(all_of(at_least(2), at_most(MAX_FAN_OUT))))
    """Parallel instances of the step (at least 2; default one); its children wait for all."""
    tool: str | None = None
    """The tool a ``tool_call`` calls (a key of ``tools``)."""
    context_growth: str = attrs.field(default="fixed", validator=one_of(("fixed", "accumulate")))
    """``accumulate``: the step's prompt also holds everything the session's earlier loop
    iterations sent and received (prompts, outputs and tool outputs); only for loop steps."""
    input_distribution: LengthField | None = None
    """Prompt length of an ``llm_call``, tokens (the new content, without accumulated context)."""
    output_distribution: LengthField | None = None
    """Output length of an ``llm_call``, tokens."""


@attrs.frozen(kw_only=True)
class LoopConfig:
    """Steps of a workflow that repeat: an iteration starts when the previous one's steps
    have all completed; the steps after the loop run once it exits."""

    over: tuple[str, ...] = attrs.field(validator=non_empty)
    """The loop's steps (a connected part of the workflow)."""
    max_iterations: int = attrs.field(validator=all_of(at_least(1), at_most(MAX_ITERATIONS)))
    """Most iterations."""
    iterations_distribution: LengthField | None = None
    """Iterations per session, drawn when it starts and clamped to [1, max_iterations]
    (default: always max_iterations)."""
    continue_probability: float = attrs.field(default=1.0, validator=in_range(0.0, 1.0))
    """After each iteration, the probability that another one follows (while below the
    session's iteration count): 1 runs every iteration."""
    think_time_s: LengthField | None = None
    """Delay between an iteration's end and the next one's start, s (default: none)."""


@attrs.frozen(kw_only=True)
class AgenticConfig:
    """A client's sessions are runs of a workflow: a DAG of LLM and tool calls with
    fan-out, fan-in and a loop (seed 004; ``docs/agentic.md``). The nine validation
    rules are checked here, each naming its key."""

    workflow: str = attrs.field(validator=non_empty)
    """Workflow name (for per-workflow metrics)."""
    steps: tuple[StepConfig, ...] = attrs.field(validator=non_empty)
    """The steps."""
    tools: dict[str, ToolConfig] = attrs.field(factory=dict)
    """Tools by name."""
    loop: LoopConfig | None = None
    """The loop, if any."""

    @property
    def root(self) -> StepConfig:
        """The step without ``depends_on`` (the session's first request)."""
        return next(s for s in self.steps if not s.depends_on)


def _priority_value(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """An integer priority in range, or a length distribution (drawn per request)."""
    if isinstance(value, (int, float)):  # bool included: in_range rejects it
        in_range(-MAX_PRIORITY, MAX_PRIORITY)(inst, attr, value)
    elif not (callable(getattr(value, "sample", None)) and hasattr(value, "mean")):
        raise FieldValueError(attr.name, f"must be an integer or a length distribution, got {value!r}")


@attrs.frozen(kw_only=True)
class ClientConfig:
    """One client (ServeGen's unit of workload decomposition)."""

    id: str = attrs.field(validator=non_empty)
    """Client name, unique within the workload."""
    rate_fraction: float = attrs.field(default=1.0, validator=at_least(0))
    """Relative share of the aggregate rate (fractions are normalised to sum to 1); the
    default 1 gives a single client the whole rate and clients that all leave it out
    equal shares."""
    arrival: ArrivalField
    """Arrival process (``{process: poisson}``, ``{process: gamma, cv: 2.0}``, or gaps from a
    length distribution: ``{process: distribution, gaps: {type: uniform, params: {...}}}``)."""
    input_distribution: LengthField | None = None
    """Prompt length distribution, tokens (``{type: ..., params: {...}}``); with
    ``multimodal`` it is ignored in favour of the modality mix. Required, except for an
    ``agentic`` client (whose steps have their own)."""
    output_distribution: LengthField | None = None
    """Output length distribution, tokens (required, except for an ``agentic`` client)."""
    tenant_id: str = ""
    """Tenant the client belongs to (defaults to the client id)."""
    slo_class: str = "default"
    """SLO class used for goodput: a key of ``Scenario.slo`` when the scenario has one."""
    priority: PriorityField = attrs.field(default=0, validator=_priority_value)
    """User priority carried on each request (higher is more important): an integer in
    [-MAX_PRIORITY, MAX_PRIORITY], or a length distribution (``{type: empirical, params:
    {pmf: {0: 0.7, 1: 0.2, 2: 0.1}}}``) drawn per request from the client's
    ``workload/<id>/priority`` stream, each draw rounded half to even and clamped to
    [-MAX_PRIORITY, MAX_PRIORITY] (so 0 and negative priorities come out where the
    distribution draws them). A session's follow-up rounds keep its first round's priority."""
    prefix_group: str = ""
    """Clients with the same group share a prompt prefix (empty: no sharing)."""
    prefix_length: int = attrs.field(default=0, validator=all_of(at_least(0), at_most(MAX_TOKENS)))
    """Tokens of the shared prefix, counted inside the prompt."""
    streaming: Probability = attrs.field(default=1.0, validator=in_range(0.0, 1.0))
    """Probability a request streams (``true``/``false`` in YAML mean 1/0)."""
    network: NetworkConfig | None = None
    """The client's network path (None: the client sits next to the server)."""
    lifecycle: LifecycleConfig | None = None
    """Active windows (default: always active)."""
    multimodal: MultimodalConfig | None = None
    """Modality mix of the prompt."""
    reasoning: ReasoningConfig | None = None
    """Reasoning share of the output."""
    multi_turn: MultiTurnConfig | None = None
    """Each arrival starts a closed-loop session of several rounds."""
    conversational_probability: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    """After a completed request, the probability that the user sends a follow-up
    (repeatedly, so follow-ups form a geometric chain)."""
    follow_up_think_time: LengthField | None = None
    """Seconds between a completion and its follow-up (needed when
    conversational_probability > 0)."""
    agentic: AgenticConfig | None = None
    """Each arrival starts a session that runs this workflow of LLM and tool calls."""

    def __attrs_post_init__(self) -> None:
        if self.conversational_probability > 0 and self.follow_up_think_time is None:
            raise FieldValueError("follow_up_think_time", "required when conversational_probability > 0")
        if self.agentic is None:
            for name in ("input_distribution", "output_distribution"):
                if getattr(self, name) is None:
                    raise FieldValueError(name, "required key is missing")
            return
        # Rule 9 (and the same for the other session kinds and the client's own lengths).
        for name, given in (
            ("reasoning", self.reasoning is not None),
            ("multimodal", self.multimodal is not None),
            ("multi_turn", self.multi_turn is not None),
            ("conversational_probability", self.conversational_probability > 0),
            ("input_distribution", self.input_distribution is not None),
            ("output_distribution", self.output_distribution is not None),
        ):
            if given:
                raise FieldValueError(name, "not allowed with agentic (an agentic client's requests are its workflow's steps)")

    @property
    def opens_sessions(self) -> bool:
        """Whether each arrival opens a session (multi-turn, conversational or agentic)."""
        return self.multi_turn is not None or self.conversational_probability > 0 or self.agentic is not None


@attrs.frozen(kw_only=True)
class ServeGenConfig:
    """Clients loaded from a ServeGen data directory (one client per chunk)."""

    path: str = attrs.field(converter=resolve_path, validator=non_empty)
    """Directory with ``chunk-<id>-trace.csv`` and ``chunk-<id>-dataset.json`` files
    (relative paths are relative to the scenario file)."""
    span_s: tuple[float, float] | None = attrs.field(default=None, validator=optional(interval_within(0, MAX_TIME_S)))
    """Use only the windows in [start, end) seconds of the data (default: all)."""
    rate_scale: float = attrs.field(default=1.0, validator=all_of(greater_than(0), in_range(MIN_SCALE, MAX_SCALE)))
    """Multiply every client's rate."""
    max_clients: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """Keep only the clients with the most requests."""
    slo_class: str = "default"
    """SLO class of the loaded clients: a key of ``Scenario.slo`` when the scenario has one."""


@attrs.frozen(kw_only=True)
class TraceSource:
    """Requests replayed open-loop from a recorded trace."""

    path: str = attrs.field(converter=resolve_path, validator=non_empty)
    """Trace file (relative paths are relative to the scenario file)."""
    format: str = attrs.field(
        default="trace_v2", validator=one_of(("trace_v2", "azure", "mooncake", "burstgpt", "csv"))
    )
    """File layout."""
    columns: dict[str, str] = attrs.field(factory=dict)
    """For ``csv``: trace field -> column name (``arrival_time_s``, ``input_tokens``, ...)."""
    time_scale: float = attrs.field(default=1.0, validator=all_of(greater_than(0), in_range(MIN_SCALE, MAX_SCALE)))
    """Stretch the gaps between arrivals by this factor."""
    rate_scale: float = attrs.field(default=1.0, validator=all_of(greater_than(0), in_range(MIN_SCALE, MAX_SCALE)))
    """Speed arrivals up by this factor (gaps divided by it)."""
    client_id: str = ""
    """Client id for rows without one (default: the file's stem)."""
    slo_class: str = "default"
    """SLO class for rows without one. A file with no class of its own (``azure``,
    ``mooncake``, ``burstgpt``, a file without an ``slo_class`` column) gives every row this
    class, which must then be a key of ``Scenario.slo`` when the scenario has one (checked
    with the file's header)."""
    max_requests: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """Replay only the first requests."""
    arrival_column: str = attrs.field(default="arrival_time_us", validator=one_of(("arrival_time_us", "send_time_us")))
    """For ``trace_v2``: the column whose times are the arrivals; ``send_time_us`` replays an
    observed trace as the server saw it (rows never sent are left out)."""
    server_block: str = attrs.field(default="check", validator=one_of(("check", "ignore")))
    """For ``trace_v2`` with a header ``server`` block (the observed server's settings):
    ``check`` rejects the run when its engine-relevant keys (``max_num_seqs``,
    ``block_size``, ``max_model_len``, ``max_num_batched_tokens``,
    ``enable_prefix_caching``; for a ``type: llamacpp`` block ``n_parallel``,
    ``n_batch``, ``ctx_per_slot``, ``cache_prompt``) differ from the scenario's engine;
    ``ignore`` replays the trace on the scenario's engine as it is."""

    def __attrs_post_init__(self) -> None:
        # Settings that only one format reads: given with another one, they would be ignored.
        if self.columns and self.format != "csv":
            raise FieldValueError("columns", f"only used with format csv, not {self.format}")
        if self.arrival_column != "arrival_time_us" and self.format != "trace_v2":
            raise FieldValueError("arrival_column", f"only a trace_v2 has send times, not {self.format}")
        if self.server_block != "check" and self.format != "trace_v2":
            raise FieldValueError("server_block", f"only a trace_v2 header has a server block, not {self.format}")


@attrs.frozen(kw_only=True)
class WorkloadConfig:
    """The workload: synthetic clients splitting an aggregate rate, ServeGen clients,
    and/or replayed traces.

    Give exactly one of ``num_requests`` (generate that many, then stop) or
    ``horizon_s`` (generate arrivals until that time); a workload made only of
    traces may give neither (the traces' own length).

    A workload is a scenario's ``workload`` section, or a file of its own, a *bare
    workload spec* whose top level holds these keys
    (:func:`~simpy_llm.config.load_workload`; ``simpy-llm workload`` and ``simpy-llm
    observe`` take one as it is). A scenario references such a file with ``workload:
    {file: PATH}``; keys given beside ``file`` replace the file's top-level keys.
    """

    clients: tuple[ClientConfig, ...] = ()
    """Synthetic clients."""
    aggregate_rate: float | None = attrs.field(
        default=None, validator=optional(all_of(greater_than(0), in_range(MIN_RATE, MAX_RATE)))
    )
    """Total request rate over the synthetic and ServeGen clients, requests/s (default
    with ServeGen data: the data's own mean rate)."""
    num_requests: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """Total number of requests to generate (first rounds of sessions; follow-ups come on top)."""
    horizon_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """Stop generating arrivals at this simulated time, seconds."""
    version: str = attrs.field(default="1", validator=one_of(("1",)))
    """Spec format version."""
    category: str = attrs.field(default="language", validator=one_of(("language", "multimodal", "reasoning", "agentic")))
    """Workload category (descriptive; clients carry their own multimodal/reasoning settings)."""
    seed: int | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(MAX_SEED))))
    """Seed of the workload streams (default: the scenario's seed; 0 for a bare workload spec)."""
    servegen_data: ServeGenConfig | None = None
    """Clients loaded from ServeGen data."""
    traces: tuple[TraceSource, ...] = ()
    """Traces replayed open-loop."""
    max_concurrency: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """At most this many of the workload's requests in flight at once (sent and neither
    answered nor dropped): a request due while that many are in flight waits at the client, in
    the order they fell due, and is sent when one ends (a benchmark client's closed loop:
    ``vllm bench --max-concurrency``, guidellm's concurrent runs). None: no limit, an open loop."""

    def __attrs_post_init__(self) -> None:
        synthetic = bool(self.clients) or self.servegen_data is not None
        if not synthetic and not self.traces:
            raise FieldValueError("clients", "give clients, servegen_data or traces")
        if synthetic and self.num_requests is None and self.horizon_s is None:
            raise FieldValueError("num_requests", "give exactly one of num_requests or horizon_s (neither is set)")
        if self.num_requests is not None and self.horizon_s is not None:
            raise FieldValueError(
                "num_requests",
                f"give exactly one of num_requests or horizon_s; both are set ({self.num_requests} requests, "
                f"{self.horizon_s} s), and setting one does not clear the other: clear the one you do not "
                f"want with null, --set workload.num_requests=null or --set workload.horizon_s=null",
            )
        if self.clients:
            if self.aggregate_rate is None:
                raise FieldValueError("aggregate_rate", "required with clients")
            total = sum(c.rate_fraction for c in self.clients)
            if total <= 0:
                raise FieldValueError("clients", "at least one client needs rate_fraction > 0")
            for i, c in enumerate(self.clients):
                rate = self.aggregate_rate * c.rate_fraction / total  # as the simulation splits it
                if c.rate_fraction > 0 and not rate >= MIN_RATE:
                    raise FieldValueError(
                        f"clients[{i}].rate_fraction",
                        f"gives client {c.id!r} {rate:.3g} requests/s (aggregate_rate x rate_fraction / "
                        f"sum of rate_fraction); must be >= {MIN_RATE} (or rate_fraction 0)",
                    )
        ids = [c.id for c in self.clients]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise FieldValueError("clients", f"client ids must be unique; repeated: {', '.join(sorted(dup))}")
