"""The scenario config tree: frozen attrs classes, one default per setting.

A scenario YAML file maps onto :class:`Scenario`::

    seed: 42
    workload:        # WorkloadConfig
      aggregate_rate: 10.0
      num_requests: 2000
      clients: [...]  # ClientConfig
    serving:         # ServingConfig
      replicas: 1
      router: {kind: round_robin}
      engine: {...}  # EngineConfig
      latency_model: {kind: blis_linear, params: {model: llama-3.1-8b-instruct, gpu: H100, tp: 2}}
    slo:             # per-class targets used for goodput
      interactive: {ttft_s: 0.5, tpot_s: 0.05}
    simulation:      # SimulationConfig
      mode: event_per_change

Units are in the names (``_s`` seconds, ``_tokens`` tokens). Distributions
and arrival processes are the registered classes themselves
(:mod:`simpy_llm.workload.distributions`, :mod:`simpy_llm.workload.arrivals`);
routers and latency models are :class:`PolicySpec` entries resolved against
their registries when the simulation is built.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NewType

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.paths import resolve_path
from simpy_llm.config.planner import PlannerConfig, check_planner
from simpy_llm.config.predictor import OutputPredictor
from simpy_llm.config.speculation import SpeculationConfig
from simpy_llm.config.validators import (
    MAX_KV_BLOCK_SIZE,
    MAX_KV_BLOCKS,
    MAX_PRIORITY,
    MAX_RATE,
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_SCALE,
    MAX_SEED,
    MAX_TIME_S,
    MAX_TOKENS,
    MIN_PERIOD_S,
    MIN_RATE,
    MIN_SCALE,
    all_of,
    at_least,
    at_most,
    each_item,
    greater_than,
    in_range,
    interval_within,
    non_empty,
    one_of,
    optional,
    unless,
)

__all__ = [
    "ENGINE_PRESETS",
    "ActiveWindow",
    "AdmissionSpec",
    "AgenticConfig",
    "ArrivalField",
    "BatchServerConfig",
    "BatchServiceSpec",
    "BinSelectorSpec",
    "BinsConfig",
    "ClientConfig",
    "ClusterConfig",
    "DisaggregationConfig",
    "DynamicBatchingConfig",
    "EngineConfig",
    "KvBlocks",
    "KvTransferConfig",
    "LatencySpec",
    "LengthField",
    "LifecycleConfig",
    "LinkFaults",
    "LlamaCppPreset",
    "LoopConfig",
    "MemoryLimitConfig",
    "MultiTurnConfig",
    "MultimodalConfig",
    "NetworkConfig",
    "OutageWindow",
    "PolicySpec",
    "PriorityField",
    "ReasoningConfig",
    "ReplicaGroupConfig",
    "RouterSpec",
    "SLOTarget",
    "Scenario",
    "SchedulerSpec",
    "ServeGenConfig",
    "ServingConfig",
    "SimulationConfig",
    "SlotCacheConfig",
    "StepConfig",
    "TimeWindow",
    "ToolConfig",
    "TraceSource",
    "WorkloadConfig",
]


from simpy_llm.config.common import (
    AdmissionSpec,
    ArrivalField,
    BatchServiceSpec,
    BinSelectorSpec,
    KvBlocks,
    LatencySpec,
    LengthField,
    LinkFaults,
    NetworkConfig,
    OutageWindow,
    PolicySpec,
    PriorityField,
    Probability,
    RouterSpec,
    SchedulerSpec,
    TimeWindow,
)


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


@attrs.frozen(kw_only=True)
class SlotCacheConfig:
    """llama.cpp's prompt cache as its server keeps it: one context per slot, saved to and
    restored from host memory whole (``docs/model.md``, "The prompt cache, slot by slot").

    Set as ``EngineConfig.slot_cache`` (the ``llamacpp`` preset does, with ``cache_model:
    slots``); then a request's cached prefix comes from the slot it is given, not from a
    cache of blocks shared by every request.

    Examples
    --------
    >>> c = SlotCacheConfig()
    >>> c.prompt_similarity, c.host_cache_tokens, c.cache_idle_slots, c.checkpoints, c.max_checkpoints
    (0.1, 262144, True, True, 32)
    """

    prompt_similarity: float = attrs.field(default=0.1, validator=in_range(0.0, 1.0))
    """A prompt goes to the idle slot whose context it shares the largest fraction of itself
    with, if that fraction exceeds this (llama.cpp's ``--slot-prompt-similarity``); otherwise,
    or with 0, to the least recently used idle slot."""
    host_cache_tokens: int = attrs.field(default=262_144, validator=all_of(at_least(0), at_most(MAX_KV_BLOCKS)))
    """Tokens of slot contexts the host-memory cache keeps (llama.cpp's ``--cache-ram``, in MiB
    there: divide by the model's KV bytes per token); the oldest saved context goes first.
    0: no host cache (a slot's context is lost when another conversation takes the slot)."""
    cache_idle_slots: bool = True
    """Save every idle slot's context to the host cache whenever a request starts (llama.cpp's
    ``--cache-idle-slots``, its default; needs ``host_cache_tokens`` > 0)."""
    checkpoints: bool = True
    """The model's context can be restored only at checkpoints (sliding-window attention,
    recurrent or hybrid models): taken where a prompt's computation starts and where its
    ``prefill_breaks`` stop it. False: any common prefix with the slot's context is reused."""
    max_checkpoints: int = attrs.field(default=32, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Checkpoints a slot keeps; the oldest is dropped for a new one (llama.cpp's ``--ctx-checkpoints``)."""

    def __attrs_post_init__(self) -> None:
        if self.cache_idle_slots and self.host_cache_tokens == 0:
            raise FieldValueError("cache_idle_slots", "needs host_cache_tokens > 0 (idle slots are saved to the host cache)")


@attrs.frozen(kw_only=True)
class EngineConfig:
    """A replica's continuous-batching engine (``docs/model.md``, "A replica, precisely")."""

    max_num_seqs: int = attrs.field(default=256, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Most requests in the running batch."""
    max_num_batched_tokens: int = attrs.field(default=8192, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Token budget of one step (prefill chunk tokens + one per decoding request)."""
    chunked_prefill: bool = True
    """Split prompts across steps to fit the token budget. Without it a prompt
    is prefilled whole in one step and must fit the budget alone."""
    kv_block_size: int = attrs.field(default=16, validator=all_of(at_least(1), at_most(MAX_KV_BLOCK_SIZE)))
    """Tokens per KV-cache block."""
    kv_num_blocks: KvBlocks = attrs.field(default=8192, validator=unless("auto", at_most(MAX_KV_BLOCKS)))
    """KV-cache blocks on the replica, or ``auto``: what the GPU memory left after the
    weights and an activation headroom holds (needs a latency model that names its
    model, GPU and TP degree; see ``docs/latency.md``)."""
    gpu_memory_utilization: float | None = attrs.field(default=None, validator=optional(in_range(0.01, 1.0)))
    """With ``kv_num_blocks: auto``: the share of GPU memory the engine may use (vLLM's
    ``--gpu-memory-utilization``; default 0.9). Rejected with a fixed block count."""
    max_model_len: int | None = attrs.field(default=None, validator=optional(all_of(at_least(2), at_most(MAX_TOKENS))))
    """Longest prompt + output a request may have; longer ones are dropped on arrival.
    Default: what the KV cache can hold."""
    prefix_caching: bool = True
    """Automatic prefix caching (on by default, as in vLLM's V1 engine): full blocks are
    cached by content and reused by later requests with the same prefix."""
    scheduler: SchedulerSpec = attrs.field(factory=lambda: PolicySpec(kind="fcfs"))
    """Scheduler policy: ``fcfs``, ``priority``, ``sjf``, ``edf`` or a registered one."""
    preemption_mode: str = attrs.field(default="recompute", validator=one_of(("recompute", "swap")))
    """What happens to a preempted request's KV: dropped and recomputed, or swapped to CPU memory."""
    swap_space_blocks: int = attrs.field(default=0, validator=all_of(at_least(0), at_most(MAX_KV_BLOCKS)))
    """CPU swap space in KV blocks (``swap`` only; must be > 0 then)."""
    swap_kv_bytes_per_token: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(2.0**40))))
    """Bytes of KV per token copied when swapping (``swap`` only; default: from the latency
    model's hardware)."""
    swap_bandwidth_gb_per_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(1e-6), at_most(1e6))))
    """GPU <-> CPU copy bandwidth, GB/s (``swap`` only; default: the GPU's PCIe bandwidth)."""
    ubatch_tokens: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_TOKENS))))
    """Compute a step as forward passes of at most this many tokens (llama.cpp's
    ``n_ubatch``): decode tokens first, then the prefill chunks in order, cut every
    ``ubatch_tokens``; the step takes the sum of the passes' times, so each pass pays
    the latency model's fixed cost. Default: one pass per step (vLLM)."""
    prefill_breaks: tuple[int, ...] = attrs.field(default=(), validator=each_item(all_of(at_least(1), at_most(MAX_TOKENS))))
    """Prompt positions, counted back from the end of the prompt, that a prefill chunk
    never crosses: with ``(516, 4)`` the last 4 prompt tokens are computed in a step of
    their own, and so are the 512 before them (llama.cpp does this for models whose
    context it checkpoints, e.g. with sliding-window attention, so the first token comes
    one step after the bulk of the prompt). Needs ``chunked_prefill``. Default: none."""
    reusable_prompt_tail: int | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(MAX_TOKENS))))
    """With prefix caching: a finished request leaves findable in the cache only its first
    ``prompt_tokens - reusable_prompt_tail`` tokens (or its shared prefix, if longer), not
    its output. llama.cpp restores a checkpointed model's context only from a checkpoint,
    the last one 4 tokens before the end of the prompt; measured on its server, a later
    prompt starting with the same text finds 5 tokens fewer than the earlier prompt. Default
    (None): the whole content, prompt and output, stays findable (vLLM)."""
    slot_cache: SlotCacheConfig | None = None
    """llama.cpp's prompt cache, slot by slot (:class:`SlotCacheConfig`): each of the
    ``max_num_seqs`` slots keeps the context of the last request it ran, and a request finds
    cached only what the slot it is given (or a context restored from host memory) shares
    with its prompt. Needs ``prefix_caching``, a ``max_model_len`` and KV blocks for every
    slot's whole context (nothing is preempted). Default (None): the block cache above."""

    def __attrs_post_init__(self) -> None:
        if self.prefill_breaks and not self.chunked_prefill:
            raise FieldValueError("prefill_breaks", "needs chunked_prefill: true (a prompt is then computed in pieces)")
        if self.slot_cache is not None:
            self._check_slot_cache()
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise FieldValueError(
                "max_num_batched_tokens",
                f"must be >= max_num_seqs ({self.max_num_seqs}) so every running request "
                f"can decode each step; got {self.max_num_batched_tokens}",
            )
        if self.kv_num_blocks == "auto":
            pass
        elif self.kv_num_blocks * self.kv_block_size < self.max_num_batched_tokens:
            raise FieldValueError(
                "kv_num_blocks",
                f"the KV cache ({self.kv_num_blocks} blocks x {self.kv_block_size} tokens) must hold "
                f"at least max_num_batched_tokens ({self.max_num_batched_tokens}) tokens",
            )
        if self.gpu_memory_utilization is not None and self.kv_num_blocks != "auto":
            raise FieldValueError("gpu_memory_utilization", "is used only with kv_num_blocks: auto")
        if self.preemption_mode == "swap":
            if self.swap_space_blocks == 0:
                raise FieldValueError("swap_space_blocks", "must be > 0 with preemption_mode: swap")
        else:
            for name in ("swap_space_blocks", "swap_kv_bytes_per_token", "swap_bandwidth_gb_per_s"):
                if getattr(self, name):
                    raise FieldValueError(name, "is used only with preemption_mode: swap")

    def _check_slot_cache(self) -> None:
        """A slot cache needs slots that never run out of KV: a model length, and blocks for
        every slot's whole context (so nothing is preempted, as on llama.cpp's server)."""
        if not self.prefix_caching:
            raise FieldValueError("slot_cache", "needs prefix_caching: true (it is the prompt cache)")
        if self.reusable_prompt_tail is not None:
            raise FieldValueError(
                "reusable_prompt_tail",
                "applies to the block cache; with slot_cache the slots' checkpoints decide what is reusable",
            )
        if self.max_model_len is None:
            raise FieldValueError("slot_cache", "needs max_model_len: each slot's context")
        if self.preemption_mode != "recompute":
            raise FieldValueError("preemption_mode", "a slot cache never preempts: each slot owns its context")
        if self.kv_num_blocks == "auto":
            raise FieldValueError(
                "kv_num_blocks",
                "must be a number with slot_cache: every slot's whole context (max_num_seqs x max_model_len tokens)",
            )
        else:
            need = self.max_num_seqs * -(-self.max_model_len // self.kv_block_size)
            if self.kv_num_blocks < need:
                raise FieldValueError(
                    "kv_num_blocks",
                    f"with slot_cache must hold every slot's whole context: max_num_seqs ({self.max_num_seqs}) x "
                    f"max_model_len ({self.max_model_len}) tokens = {need} blocks of {self.kv_block_size}; got {self.kv_num_blocks}",
                )


@attrs.frozen(kw_only=True)
class LlamaCppPreset:
    """llama.cpp's HTTP server (``llama-server``) as engine settings: ``engine: {preset:
    llamacpp, ...}``. The keys are the server's own options; :meth:`engine` maps them onto
    the continuous-batching engine (``docs/model.md``, "The llama.cpp server"):

    * ``n_parallel`` slots are the running batch (``max_num_seqs``); further requests wait
      in arrival order (``fcfs``), as llama.cpp defers tasks while no slot is idle;
    * each slot owns ``ctx_per_slot`` tokens of context (``max_model_len``): a request whose
      prompt plus output does not fit is refused, and a slot never runs out of KV, so
      nothing is ever preempted;
    * a step takes every decoding slot's token first, then prompt tokens up to ``n_batch``
      (``max_num_batched_tokens``; longer prompts continue in the next steps), computed in
      forward passes of ``n_ubatch`` tokens (``ubatch_tokens``); llama.cpp clamps both to the
      context (``n_batch <= n_ctx``, ``n_ubatch <= n_batch``) and so does this mapping;
    * ``cache_prompt`` is the prompt cache (``prefix_caching``). With ``cache_model: slots``
      (the default) it is modelled as the server keeps it (``slot_cache``, docs/model.md, "The
      prompt cache, slot by slot"): each slot keeps its last context; a prompt goes to the
      idle slot it shares the largest part of itself with (``slot_prompt_similarity``), else
      to the least recently used one; a slot's context is saved to a host-memory cache of
      ``cache_ram_tokens`` tokens (llama.cpp's ``--cache-ram``, in MiB there: divide by the
      model's KV bytes per token) when another conversation takes the slot, and whenever a
      request starts while it is idle (``cache_idle_slots``), and restored from there for a
      later prompt that continues it (at the latency model's ``cache_restore_us``). With
      ``cache_model: radix`` it is the earlier, simpler model: one radix prefix cache over
      one-token blocks shared by the slots and ``cache_ram_tokens`` of host memory, in which
      every prompt finds its longest cached prefix, at no cost;
    * with ``prompt_checkpoints`` the last ``4`` prompt tokens, and the ``n_ubatch`` before
      them, are computed in steps of their own (``prefill_breaks``), and the model's context
      can be restored only at a checkpoint: those two places and where a prompt's computation
      started (at most ``ctx_checkpoints`` per slot; ``radix``: a finished request's cache is
      reusable only up to its prompt less 5 tokens, ``reusable_prompt_tail``).

    The ``slots`` model's own keys (``slot_prompt_similarity``, ``cache_idle_slots``,
    ``ctx_checkpoints``) default to the server's defaults and are refused where they would
    change nothing (``cache_model: radix``, ``cache_prompt: false``, or for
    ``ctx_checkpoints`` without ``prompt_checkpoints``).

    Examples
    --------
    >>> e = LlamaCppPreset(n_parallel=4, ctx_per_slot=2048).engine()
    >>> e.max_num_seqs, e.max_model_len, e.max_num_batched_tokens, e.ubatch_tokens, e.kv_block_size
    (4, 2048, 2048, 512, 1)
    >>> e.kv_num_blocks, e.prefill_breaks, e.slot_cache.host_cache_tokens
    (8192, (516, 4), 262144)
    >>> r = LlamaCppPreset(n_parallel=4, ctx_per_slot=2048, cache_model="radix").engine()
    >>> r.slot_cache is None, r.kv_num_blocks == 4 * 2048 + LlamaCppPreset().cache_ram_tokens, r.reusable_prompt_tail
    (True, True, 5)
    >>> LlamaCppPreset(n_parallel=1, ctx_per_slot=1024, cache_prompt=False).engine().max_num_batched_tokens
    1024
    """

    n_parallel: int = attrs.field(default=4, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Slots (``--parallel``): requests decoded together."""
    ctx_per_slot: int = attrs.field(default=4096, validator=all_of(at_least(2), at_most(MAX_TOKENS)))
    """Context tokens of one slot (``--ctx-size`` divided by the slots): the longest prompt
    plus output a request may have."""
    n_batch: int = attrs.field(default=2048, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Logical batch (``--batch-size``): tokens one step may compute."""
    n_ubatch: int = attrs.field(default=512, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Physical batch (``--ubatch-size``): tokens of one forward pass."""
    cache_prompt: bool = True
    """Reuse cached prompt prefixes (the server's ``cache_prompt`` default)."""
    cache_ram_tokens: int = attrs.field(default=262_144, validator=all_of(at_least(0), at_most(MAX_KV_BLOCKS)))
    """Tokens the host-memory prompt cache keeps beyond the slots' own context (0: the
    slots only). The default is about what llama.cpp's default 8 GiB holds for a small
    model (Gemma 3 270M: 18 KiB of KV per token)."""

    prompt_checkpoints: bool = True
    """The model's context is checkpointed near the end of each prompt (llama.cpp does so
    for sliding-window attention, e.g. Gemma 3, and for recurrent and hybrid models): the
    prompt stops ``4 + n_ubatch`` and ``4`` tokens before its end, each time finishing the
    step, so the first token comes a step after the bulk of the prompt
    (``prefill_breaks``). False for models without it (most plain transformers)."""
    cache_model: str = attrs.field(default="slots", validator=one_of(("slots", "radix")))
    """How the prompt cache is modelled: ``slots``, the server's own rules (measured, see
    docs/model.md), or ``radix``, the earlier approximation kept for comparison."""
    slot_prompt_similarity: float | None = attrs.field(default=None, validator=optional(in_range(0.0, 1.0)))
    """``--slot-prompt-similarity`` (``slots`` only; default the server's 0.1): a prompt
    goes to an idle slot sharing more than this fraction of it, else to the least recently
    used idle slot (0: always the least recently used)."""
    cache_idle_slots: bool | None = None
    """``--cache-idle-slots`` (``slots`` only; default the server's true): every idle slot's
    context is saved to host memory whenever a request starts (needs ``cache_ram_tokens`` > 0)."""
    ctx_checkpoints: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_TOKENS))))
    """``--ctx-checkpoints`` (``slots`` with ``prompt_checkpoints`` only; default the
    server's 32): checkpoints a slot keeps, the oldest dropped first."""

    def __attrs_post_init__(self) -> None:
        if self.n_parallel > self.n_batch:
            raise FieldValueError("n_batch", f"must be >= n_parallel ({self.n_parallel}) so every slot can decode each step; got {self.n_batch}")
        slots = self.cache_prompt and self.cache_model == "slots"
        why = "cache_prompt is false" if not self.cache_prompt else "cache_model is radix"
        for key in ("slot_prompt_similarity", "cache_idle_slots", "ctx_checkpoints"):
            if getattr(self, key) is not None and not slots:
                raise FieldValueError(key, f"applies to the slots cache model only; here {why}")
        if self.ctx_checkpoints is not None and not self.prompt_checkpoints:
            raise FieldValueError("ctx_checkpoints", "applies to a checkpointed model only; here prompt_checkpoints is false")
        if self.cache_idle_slots and self.cache_ram_tokens == 0:
            raise FieldValueError("cache_idle_slots", "needs cache_ram_tokens > 0 (idle slots are saved to host memory)")

    def engine(self) -> EngineConfig:
        """The :class:`EngineConfig` these settings amount to."""
        n_ctx = self.n_parallel * self.ctx_per_slot
        n_batch = min(self.n_batch, n_ctx)
        breaks = tuple(min(n_batch, offset) for offset in (4 + min(self.n_ubatch, n_batch), 4)) if self.prompt_checkpoints else ()
        slots = self.cache_prompt and self.cache_model == "slots"
        slot_cache = None
        if slots:
            defaults = SlotCacheConfig()
            similarity = defaults.prompt_similarity if self.slot_prompt_similarity is None else self.slot_prompt_similarity
            idle = self.cache_ram_tokens > 0 if self.cache_idle_slots is None else self.cache_idle_slots
            slot_cache = SlotCacheConfig(
                prompt_similarity=similarity,
                host_cache_tokens=self.cache_ram_tokens,
                cache_idle_slots=idle,
                checkpoints=self.prompt_checkpoints,
                max_checkpoints=defaults.max_checkpoints if self.ctx_checkpoints is None else self.ctx_checkpoints,
            )
        radix = self.cache_prompt and not slots
        return EngineConfig(
            prefill_breaks=tuple(sorted(set(breaks), reverse=True)),
            reusable_prompt_tail=REUSABLE_PROMPT_TAIL if self.prompt_checkpoints and radix else None,
            max_num_seqs=self.n_parallel,
            max_num_batched_tokens=n_batch,
            ubatch_tokens=min(self.n_ubatch, n_batch),
            chunked_prefill=True,
            kv_block_size=1,
            kv_num_blocks=n_ctx + (self.cache_ram_tokens if radix else 0),
            max_model_len=self.ctx_per_slot,
            prefix_caching=self.cache_prompt,
            slot_cache=slot_cache,
        )


REUSABLE_PROMPT_TAIL = 5
"""Tokens at the end of a prompt that llama.cpp's server cannot reuse from a checkpointed
model's cache (its last checkpoint is 4 tokens before the end, and one more is recomputed;
measured: an identical or extended prompt finds ``prompt_tokens - 5`` cached)."""

ENGINE_PRESETS: dict[str, type] = {"vllm": EngineConfig, "llamacpp": LlamaCppPreset}
"""``engine: {preset: NAME, ...}``: the class that reads the other keys. ``vllm`` is
:class:`EngineConfig` itself (also what an engine without ``preset`` is)."""


MAX_BINS = 1024
"""Most bins a batch server may have."""


def _increasing(inst: Any, attribute: attrs.Attribute, value: tuple[float, ...] | None) -> None:
    if value is not None and any(b <= a for a, b in itertools.pairwise(value)):
        raise FieldValueError(attribute.name, f"must be strictly increasing; got {list(value)}")


@attrs.frozen(kw_only=True)
class BinsConfig:
    """The multi-bin layer of a batch server: k bins by predicted request size (seed 001 §1.3, §7).

    A request's *size* is what its service time grows with: its sampled service time
    (service ``sampled``) or its prompt plus output tokens (the token-based service
    models). The bins split the predicted size at ``count - 1`` boundaries: given
    explicitly, or the empirical ``i/count`` quantiles of the first
    ``warmup_requests`` predicted sizes (equal-mass bins), computed when the last of
    them arrives; until then the server batches from one queue (bin 0), and the requests
    still waiting then are re-binned in their order.
    """

    count: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_BINS)))
    """Number of bins k (1: a single FIFO queue)."""
    boundaries: tuple[float, ...] | None = attrs.field(default=None, validator=optional(_increasing))
    """The ``count - 1`` inner boundaries, strictly increasing (bin i holds sizes in
    ``[boundaries[i-1], boundaries[i])``); None: equal-mass from a warm-up sample."""
    warmup_requests: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """Predicted sizes sampled for equal-mass boundaries (only without ``boundaries``;
    default 1000 with more than one bin, none with one). Given with one bin it changes
    nothing (one bin needs no boundaries); it is accepted so that sweeps over ``count``
    can keep it."""
    predictor: OutputPredictor = attrs.field(factory=lambda: OutputPredictor(kind="oracle"))
    """How well the server knows a request's size: ``{kind: oracle}`` or ``{kind: noisy,
    sigma, seed}`` (the true size times a mean-preserving log-normal error)."""

    def __attrs_post_init__(self) -> None:
        if self.boundaries is not None:
            if len(self.boundaries) != self.count - 1:
                raise FieldValueError("boundaries", f"needs count - 1 = {self.count - 1} inner boundaries; got {len(self.boundaries)}")
            if self.warmup_requests is not None:
                raise FieldValueError("warmup_requests", "applies only without explicit boundaries")
        elif self.warmup_requests is not None and self.warmup_requests < self.count:
            raise FieldValueError("warmup_requests", f"must be at least count ({self.count}) to give {self.count} quantiles")

    @property
    def warmup_size(self) -> int:
        """Requests sampled before the boundaries are set (0 with explicit boundaries or one bin)."""
        if self.boundaries is not None:
            return 0
        if self.warmup_requests is not None:
            return self.warmup_requests
        return 1000 if self.count > 1 else 0


@attrs.frozen(kw_only=True)
class MemoryLimitConfig:
    """The KV memory a batch may use, ``eta`` tokens (seed 001 §2.2): given as
    ``capacity_tokens``, or as ``(gpu_memory_gb - model_memory_gb) / kv_bytes_per_token``."""

    capacity_tokens: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_KV_BLOCKS * 1024))))
    """KV capacity, tokens."""
    gpu_memory_gb: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(1e6))))
    """Device memory M_max, GB (1e9 bytes)."""
    model_memory_gb: float | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(1e6))))
    """Memory the weights and activations take, M_model, GB."""
    kv_bytes_per_token: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(2.0**40))))
    """KV cache bytes per token."""
    safety_fraction: float = attrs.field(default=0.1, validator=in_range(0.0, 0.99))
    """Safety buffer L0 as a share of eta, kept free by the batch-size choice."""
    window_batches: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """``b_mem``'s mean prompt and output lengths are over the requests of the last this
    many finished batches (seed 001 §2.2's "recent batches"); None: over every finished batch."""

    def __attrs_post_init__(self) -> None:
        derived = (self.gpu_memory_gb, self.model_memory_gb, self.kv_bytes_per_token)
        if self.capacity_tokens is not None:
            for name, value in zip(("gpu_memory_gb", "model_memory_gb", "kv_bytes_per_token"), derived, strict=True):
                if value is not None:
                    raise FieldValueError(name, "give capacity_tokens or the three memory figures, not both")
        elif any(v is None for v in derived):
            raise FieldValueError("capacity_tokens", "required (or give gpu_memory_gb, model_memory_gb and kv_bytes_per_token)")
        elif self.eta_tokens < 1:
            raise FieldValueError("model_memory_gb", "leaves no memory for the KV cache (must be below gpu_memory_gb by at least one token's KV)")

    @property
    def eta_tokens(self) -> int:
        """The capacity eta, whole tokens."""
        if self.capacity_tokens is not None:
            return self.capacity_tokens
        return int((self.gpu_memory_gb - self.model_memory_gb) * 1e9 // self.kv_bytes_per_token)


SLA_CONTROLLER_KINDS = ("corrected", "seed")
"""The SLA controllers of dynamic batching (``simpy_llm.policies.batching.SLA_CONTROLLERS``)."""


@attrs.frozen(kw_only=True)
class DynamicBatchingConfig:
    """Dynamic batch sizes ``b_target = min(b_mem, b_SLA)`` (seed 001 §2), formed when the server is free."""

    d_sla_s: float = attrs.field(validator=all_of(greater_than(0), at_most(MAX_TIME_S)))
    """Target batch latency D_SLA, s (a request whose batch takes longer violates the SLA)."""
    eps_d_s: float | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(MAX_TIME_S))))
    """Tolerance, s (default 10% of D_SLA): for ``seed``, the band around D_SLA in which the
    interval is re-centred; for ``corrected``, how much faster the largest size known to
    meet D_SLA must become before larger sizes are tried again."""
    sla_controller: str = attrs.field(default="corrected", validator=one_of(SLA_CONTROLLER_KINDS))
    """``corrected`` (default): finds the largest batch size whose latency meets D_SLA and
    re-opens its interval when the SLA is missed at its lower end; ``seed``: seed 001 §2.3
    step for step, which can lock on a size above the target (``docs/batching.md``)."""
    b_min: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Smallest batch size the controller chooses."""
    b_max: int = attrs.field(default=128, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Largest batch size."""
    max_candidates: int = attrs.field(default=256, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Requests pulled from the selected bin as candidates; a batch is at most this many."""
    ema_alpha: float | None = attrs.field(default=None, validator=optional(in_range(0.001, 1.0)))
    """Weight of the newest batch in the controller's moving averages (default 0.2; not
    with ``window_batches``)."""
    window_batches: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REQUESTS))))
    """The controller's averages are plain means over the last this many batches (per
    batch size for ``corrected``) instead of moving averages (seed 001 §2.2's "recent
    batches"); None: moving averages with ``ema_alpha``."""
    memory: MemoryLimitConfig | None = None
    """KV memory limit (None: none, ``b_mem = b_max``)."""
    bin_selection: BinSelectorSpec = attrs.field(factory=lambda: PolicySpec(kind="round_robin"))
    """Bin to batch from when several hold requests: ``round_robin`` or ``longest_queue``."""

    def __attrs_post_init__(self) -> None:
        if self.b_min > self.b_max:
            raise FieldValueError("b_min", f"must not exceed b_max ({self.b_max}); got {self.b_min}")
        if self.ema_alpha is not None and self.window_batches is not None:
            raise FieldValueError("ema_alpha", "give ema_alpha (moving averages) or window_batches (means of the last batches), not both")

    @property
    def tolerance_s(self) -> float:
        """``eps_d_s``, or its default of 10% of ``d_sla_s``."""
        return self.eps_d_s if self.eps_d_s is not None else 0.1 * self.d_sla_s

    @property
    def alpha(self) -> float:
        """``ema_alpha``, or its default of 0.2."""
        return self.ema_alpha if self.ema_alpha is not None else 0.2


@attrs.frozen(kw_only=True)
class BatchServerConfig:
    """A request-level batch server (``docs/batching.md``): the unit of service is a whole
    batch, which holds the server until its slowest request ends.

    Exactly one of ``batch_size`` (fixed B: a bin that holds B requests forms a batch,
    pushed to a central FIFO batch queue) and ``dynamic`` (a batch formed when the server
    is free, of the size the dynamic batcher sets).
    """

    service: BatchServiceSpec
    """Batch service-time model: ``sampled`` (a per-request service time from a
    distribution; the batch takes the longest), ``linear`` (seed 001 §5.1) or
    ``latency_model`` (the replica's latency model run as a static batch)."""
    bins: BinsConfig = attrs.field(factory=BinsConfig)
    """The multi-bin layer."""
    batch_size: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_TOKENS))))
    """Fixed batch size B."""
    dynamic: DynamicBatchingConfig | None = None
    """Dynamic batching instead of a fixed B."""
    max_wait_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """With a fixed B: when the server is free and no full batch is formed, a bin whose
    oldest request has waited this long gives it a smaller batch of all it holds (None,
    the theory's setting: only full batches)."""
    d_sla_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """With a fixed B: the batch latency D_SLA its batches are judged against, s (the
    summary's ``sla.violation_rate``; it changes nothing that is simulated). None: no
    target, no violation rate. A dynamic batcher's target is ``dynamic.d_sla_s``."""

    def __attrs_post_init__(self) -> None:
        if (self.batch_size is None) == (self.dynamic is None):
            raise FieldValueError("batch_size", "give exactly one of batch_size (a fixed B) and dynamic")
        if self.max_wait_s is not None and self.dynamic is not None:
            raise FieldValueError("max_wait_s", "applies only with a fixed batch_size (dynamic batches form when the server is free)")
        if self.d_sla_s is not None and self.dynamic is not None:
            raise FieldValueError("d_sla_s", "applies only with a fixed batch_size (a dynamic batcher's target is dynamic.d_sla_s)")

    @property
    def sla_target_s(self) -> float | None:
        """The batch latency target its batches are judged against, s: ``dynamic.d_sla_s``
        or, with a fixed B, ``d_sla_s`` (None: none given)."""
        return self.dynamic.d_sla_s if self.dynamic is not None else self.d_sla_s


def _device_path(value: Any) -> Any:
    """A device: a shipped profile id as given, a file path resolved against the scenario's directory."""
    if isinstance(value, str) and (value.endswith((".yaml", ".yml")) or "/" in value):
        return resolve_path(value)
    return value


WEIGHT_SOURCES = ("host_memory", "local_nvme")
"""Where a cold start reads a model's weights from (``ReplicaGroupConfig.weights_from``)."""

LOCAL_NVME_BYTES_PER_S = 7.0e9
"""Sequential read of a local PCIe 4.0 x4 NVMe drive, bytes/s (datacenter drives read 6.8 to
7.4 GB/s: e.g. Samsung PM1743 / 990 PRO datasheets)."""

ROLES = ("both", "prefill", "decode")
"""What a replica group does: prefill and decode, or one of them (disaggregated)."""


@attrs.frozen(kw_only=True)
class ReplicaGroupConfig:
    """Identical replicas sharing engine settings and a latency model (model, GPU, TP)."""

    name: str = attrs.field(validator=non_empty)
    """Group name, unique within the fleet (shown to routers and in records)."""
    count: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_REPLICAS)))
    """Replicas in the group."""
    latency_model: LatencySpec | None = None
    """Step-time model of the group's replicas (required, except for a batch server whose
    service model does not use one)."""
    engine: EngineConfig = attrs.field(factory=EngineConfig)
    """Engine settings of the group's replicas (continuous batching only)."""
    batch_server: BatchServerConfig | None = None
    """Make the group's replicas request-level batch servers instead of continuous-batching
    engines (``docs/batching.md``)."""
    capacity: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(1e12))))
    """Relative service rate routers see (default: decode tokens per second of a full
    batch, ``max_num_seqs / step_time_s(0, max_num_seqs)``; for a batch server the same with
    its batch size or ``b_max``, or 1 when it has no latency model)."""
    role: str = attrs.field(default="both", validator=one_of(ROLES))
    """``both``: the replicas prefill and decode (co-located); ``prefill`` / ``decode``: a pool
    of a disaggregated fleet (needs ``serving.disaggregation``; ``docs/network.md``)."""
    device: str | None = attrs.field(default=None, converter=_device_path)
    """The device profile the replicas run on (a shipped id such as ``h100-sxm``, or a YAML
    file): its energy, price, cold start, thermal throttling and KV memory limit apply
    (``docs/devices.md``). None: none of those is modelled."""
    weights_from: str | None = attrs.field(default=None, validator=optional(one_of(WEIGHT_SOURCES)))
    """Where a cold start loads the model's weights from (seed 003's cold-start locality):
    ``host_memory`` (pinned host memory over the GPU's PCIe link) or ``local_nvme`` (a local
    NVMe drive, 7 GB/s); each GPU loads its share of the weights, ``weight bytes per GPU /
    bandwidth``, after its device's ``cold_start.load_s`` (if any). Needs a latency model
    that names its model, GPU and TP. None: no weight transfer is modelled."""
    warm_retention_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """An idle replica unloads its model after this long, and pays its cold start again at
    its next request (None: a loaded model stays loaded)."""

    def __attrs_post_init__(self) -> None:
        check_replica_kind(self.batch_server, self.engine, self.latency_model)
        if self.device is None and self.warm_retention_s is not None and self.weights_from is None:
            raise FieldValueError("warm_retention_s", "needs a cold start: weights_from, or a device whose profile has a cold_start")



def check_replica_kind(batch_server: BatchServerConfig | None, engine: EngineConfig, latency_model: PolicySpec | None) -> None:
    """A batch server has no engine settings; a continuous-batching engine needs a latency
    model. (Whether a batch server's service model uses one is the loader's check:
    :mod:`simpy_llm.loading.checks`.)

    Raises
    ------
    FieldValueError
        Naming the key given where it does not apply, or missing where it is needed.
    """
    if batch_server is None:
        if latency_model is None:
            raise FieldValueError("latency_model", "required key is missing")
        return
    if engine != EngineConfig():
        raise FieldValueError("engine", "engine settings apply to continuous batching; a batch_server has none (its batching is in batch_server)")


@attrs.frozen(kw_only=True)
class KvTransferConfig(LinkFaults):
    """How a request's KV travels from its prefill replica to its decode replica: over one
    :class:`~simpy_llm.network.link.Link` per (prefill, decode) pair, whose figures are
    these (or the topology's path between the two, when ``topology`` is given)."""

    bandwidth_gbps: float | None = attrs.field(default=100.0, validator=optional(all_of(greater_than(0), at_most(1e6))))
    """Link bandwidth, gigabits per second (None: unlimited); transfers in flight on one
    link share it equally."""
    rtt_ms: float = attrs.field(default=0.01, validator=all_of(at_least(0), at_most(MAX_TIME_S * 1e3)))
    """Round trip between the replicas, milliseconds (a transfer takes half of it)."""
    overhead_us: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(MAX_TIME_S * 1e6)))
    """Fixed cost per transfer before its bytes move (setup, registration), microseconds."""
    bytes_per_token: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(1e9))))
    """KV bytes per token (None: from the prefill pool's model as its latency model names it,
    2 x layers x KV heads x head dim x 2 bytes, split over its TP degree's GPUs and summed)."""


@attrs.frozen(kw_only=True)
class DisaggregationConfig:
    """Prefill and decode on separate replica pools (DistServe, Splitwise; ``docs/network.md``).

    Arrivals are routed among the prefill pool by ``serving.router``; a prefill replica
    computes the prompt and the first token, the request's KV crosses a link to the
    decode replica ``decode_router`` chooses (a session's later rounds keep their first
    decode replica), which produces the rest. Without ``replica_groups``, the fleet's
    ``replicas`` are split: ``prefill_replicas`` prefill, the rest decode, all with the
    same engine and latency model, so removing this block gives the co-located fleet
    of the same size. With ``replica_groups``, each group's ``role`` says its pool.
    """

    prefill_replicas: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REPLICAS))))
    """Replicas of the prefill pool when ``serving.replicas`` is split (without replica_groups)."""
    decode_router: RouterSpec = attrs.field(factory=lambda: PolicySpec(kind="round_robin"))
    """Routing policy choosing a handed-off request's decode replica."""
    kv_transfer: KvTransferConfig = attrs.field(factory=KvTransferConfig)
    """The links KV crosses."""
    topology: dict[str, Any] | None = None
    """A network topology between the replicas (``{type: links | complete | clos, ...}``,
    :meth:`~simpy_llm.network.topology.Topology.from_spec`), whose endpoints are the
    replicas named ``<group>/<k>`` (k from 0 within its group): each link's one-way
    latency and bandwidth are the path's (shortest by latency; its bottleneck), replacing
    ``kv_transfer.rtt_ms`` and ``bandwidth_gbps``."""


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """One cluster of a multi-cluster fleet: its replica groups behind its own router
    (seed 003, "Multi-Cluster Routing")."""

    name: str = attrs.field(validator=non_empty)
    """Cluster name, unique in the fleet (records and the summary use it)."""
    router: RouterSpec = attrs.field(factory=lambda: PolicySpec(kind="round_robin"))
    """Routing policy among the cluster's replicas."""
    replica_groups: tuple[ReplicaGroupConfig, ...] = attrs.field(converter=tuple)
    """The cluster's replicas, as groups (names unique across the whole fleet)."""

    def __attrs_post_init__(self) -> None:
        if not self.replica_groups:
            raise FieldValueError("replica_groups", "a cluster needs at least one replica group")
        for i, group in enumerate(self.replica_groups):
            if group.role != "both":
                raise FieldValueError(f"replica_groups[{i}].role", "clusters hold co-located replicas (role: both)")


@attrs.frozen(kw_only=True)
class ServingConfig:
    """Replicas behind a router: either one group (``replicas``, ``engine``,
    ``latency_model``) or a heterogeneous fleet (``replica_groups``)."""

    latency_model: LatencySpec | None = None
    """Step-time model (``{kind: blis_linear, params: {...}}``); required without
    replica_groups (unless a batch_server's service model needs none)."""
    replicas: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_REPLICAS)))
    """Number of identical replicas (without replica_groups)."""
    router: RouterSpec = attrs.field(factory=lambda: PolicySpec(kind="round_robin"))
    """Routing policy."""
    engine: EngineConfig = attrs.field(factory=EngineConfig)
    """Engine settings shared by all replicas (without replica_groups)."""
    batch_server: BatchServerConfig | None = None
    """Request-level batch servers instead of continuous-batching engines (without
    replica_groups; ``docs/batching.md``)."""
    replica_groups: tuple[ReplicaGroupConfig, ...] = ()
    """A heterogeneous fleet: groups of replicas, each with its own engine and latency model."""
    admission: AdmissionSpec = attrs.field(factory=lambda: PolicySpec(kind="always"))
    """Admission policy at the router (rejections are recorded drops with a reason)."""
    view_refresh_s: float | None = attrs.field(
        default=None, validator=optional(all_of(greater_than(0), in_range(MIN_PERIOD_S, MAX_TIME_S)))
    )
    """Routers and admission see replica state refreshed every this many seconds (the
    router's own counts of outstanding requests stay fresh). Default: always fresh."""
    disaggregation: DisaggregationConfig | None = None
    """Prefill and decode on separate pools (None: every replica does both)."""
    clusters: tuple[ClusterConfig, ...] = ()
    """A multi-cluster fleet: each cluster's groups behind its own router, and
    ``cluster_router`` routing arrivals among the clusters (``docs/network.md``)."""
    cluster_router: RouterSpec | None = None
    """Routing policy among the clusters (with ``clusters``; default round robin), which sees
    each cluster as the sum of its replicas (seed 003, "Multi-Cluster Routing")."""

    def __attrs_post_init__(self) -> None:
        if self.clusters:
            self._check_clusters()
        elif self.cluster_router is not None:
            raise FieldValueError("cluster_router", "routes among clusters: give serving.clusters, or remove it")
        self._check_disaggregation()
        if self.replica_groups:
            if self.latency_model is not None:
                raise FieldValueError("latency_model", "give it per group under replica_groups, not both")
            if self.batch_server is not None:
                raise FieldValueError("batch_server", "give it per group under replica_groups, not both")
            names = [g.name for g in self.replica_groups]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise FieldValueError("replica_groups", f"group names must be unique; repeated: {', '.join(dup)}")
        elif not self.clusters:
            check_replica_kind(self.batch_server, self.engine, self.latency_model)

    def _check_clusters(self) -> None:
        """With clusters, the fleet is theirs: no fleet-level groups, replica settings or router."""
        if self.router != PolicySpec(kind="round_robin"):
            raise FieldValueError("router", "with clusters, cluster_router routes among the clusters and each cluster has its own router")
        for key, given in (
            ("replica_groups", bool(self.replica_groups)), ("latency_model", self.latency_model is not None),
            ("batch_server", self.batch_server is not None), ("replicas", self.replicas != 1),
            ("engine", self.engine != EngineConfig()), ("disaggregation", self.disaggregation is not None),
        ):
            if given:
                raise FieldValueError(key, "with clusters, every replica belongs to a cluster: give it in clusters[].replica_groups"
                                      if key != "disaggregation" else "clusters hold co-located replicas; disaggregation is for a single fleet")
        names = [c.name for c in self.clusters]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise FieldValueError("clusters", f"cluster names must be unique; repeated: {', '.join(dup)}")
        groups = [g.name for c in self.clusters for g in c.replica_groups]
        dup = sorted({n for n in groups if groups.count(n) > 1})
        if dup:
            raise FieldValueError("clusters", f"replica group names must be unique across clusters; repeated: {', '.join(dup)}")

    def replica_names(self) -> list[str]:
        """Each replica's name in fleet order, ``<group>/<k>`` (k from 0 within its group): the
        endpoints a disaggregated fleet's topology connects."""
        return [f"{g.name}/{k}" for g in self.groups() for k in range(g.count)]

    @property
    def entry_router(self) -> PolicySpec:
        """The routing policy arrivals meet: ``cluster_router`` (round robin by default) with
        clusters, else ``router`` (over the prefill pool when disaggregated)."""
        if self.clusters:
            return self.cluster_router or PolicySpec(kind="round_robin")
        return self.router

    def group_paths(self) -> tuple[str, ...]:
        """The key path (inside ``serving``) of each group of :meth:`groups`, ending in a dot:
        ``""`` for the implied group(s), ``replica_groups[i].`` or ``clusters[c].replica_groups[i].``."""
        if self.clusters:
            return tuple(f"clusters[{c}].replica_groups[{i}]." for c, cl in enumerate(self.clusters) for i in range(len(cl.replica_groups)))
        if self.replica_groups:
            return tuple(f"replica_groups[{i}]." for i in range(len(self.replica_groups)))
        return ("",) * len(self.groups())

    def cluster_of(self) -> dict[str, str]:
        """Each replica group's cluster, by group name (empty without clusters)."""
        return {g.name: c.name for c in self.clusters for g in c.replica_groups}

    def _check_disaggregation(self) -> None:
        dis = self.disaggregation
        roles = [g.role for g in self.replica_groups]
        if dis is None:
            for i, role in enumerate(roles):
                if role != "both":
                    raise FieldValueError(f"replica_groups[{i}].role", f"{role!r} needs serving.disaggregation (or role: both)")
            return
        self._check_pools(dis, roles)
        if dis.topology is not None:
            default = KvTransferConfig()
            for key in ("rtt_ms", "bandwidth_gbps"):
                if getattr(dis.kv_transfer, key) != getattr(default, key):
                    raise FieldValueError(
                        f"disaggregation.kv_transfer.{key}",
                        "the topology's paths give each link its latency and bandwidth: set them there",
                    )

    def _check_pools(self, dis: DisaggregationConfig, roles: list[str]) -> None:
        if self.replica_groups:
            if dis.prefill_replicas is not None:
                raise FieldValueError(
                    "disaggregation.prefill_replicas",
                    "splits serving.replicas; with replica_groups give each group a role instead",
                )
            for i, role in enumerate(roles):
                if role == "both":
                    raise FieldValueError(f"replica_groups[{i}].role", "with disaggregation every group is a prefill or a decode pool")
            for needed in ("prefill", "decode"):
                if needed not in roles:
                    raise FieldValueError("replica_groups", f"a disaggregated fleet needs a group with role: {needed}")
            return
        if self.batch_server is not None:
            raise FieldValueError("disaggregation", "a batch_server serves whole requests; disaggregation needs continuous-batching replicas")
        if dis.prefill_replicas is None:
            raise FieldValueError("disaggregation.prefill_replicas", "required without replica_groups (how many of serving.replicas prefill)")
        if dis.prefill_replicas >= self.replicas:
            raise FieldValueError(
                "disaggregation.prefill_replicas",
                f"must leave at least one of serving.replicas ({self.replicas}) to decode; got {dis.prefill_replicas}",
            )

    def groups(self) -> tuple[ReplicaGroupConfig, ...]:
        """The fleet as groups (without replica_groups: a single group named ``default``, or
        the ``prefill`` and ``decode`` pools ``disaggregation.prefill_replicas`` splits it into)."""
        if self.clusters:
            return tuple(g for c in self.clusters for g in c.replica_groups)
        if self.replica_groups:
            return self.replica_groups
        if self.disaggregation is not None:
            p = self.disaggregation.prefill_replicas
            common = {"latency_model": self.latency_model, "engine": self.engine}
            return (
                ReplicaGroupConfig(name="prefill", count=p, role="prefill", **common),
                ReplicaGroupConfig(name="decode", count=self.replicas - p, role="decode", **common),
            )
        return (
            ReplicaGroupConfig(
                name="default", count=self.replicas, latency_model=self.latency_model,
                engine=self.engine, batch_server=self.batch_server,
            ),
        )

    @property
    def num_replicas(self) -> int:
        """Replicas in the whole fleet."""
        return sum(g.count for g in self.groups())


@attrs.frozen(kw_only=True)
class SLOTarget:
    """Latency targets of one SLO class; a request meets its SLO when every given target holds.

    Each request is judged on its own (goodput counts those that meet their class's
    targets); a capacity search's bounds on a statistic over many requests
    (``ttft_p99=0.5``) are :class:`~simpy_llm.explore.capacity.SloCriterion`.
    """

    ttft_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """Time to first token, seconds."""
    tpot_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """Mean time per output token after the first, seconds."""
    e2e_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """End-to-end latency, seconds."""
    tvt_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """Time to verified tokens (speculative decoding): a request's longest round, seconds
    (requests without verify rounds cannot miss it); also the verify pool's EDF deadline."""

    def __attrs_post_init__(self) -> None:
        # A class without a target would count every one of its requests as meeting it.
        if self.ttft_s is None and self.tpot_s is None and self.e2e_s is None and self.tvt_s is None:
            raise FieldValueError("", "give at least one target: ttft_s, tpot_s, e2e_s or tvt_s")


@attrs.frozen(kw_only=True)
class SimulationConfig:
    """How the simulation itself runs."""

    mode: str = attrs.field(default="event_per_change", validator=one_of(("event_per_change", "event_per_step")))
    """``event_per_change``: one SimPy event per batch-composition change (fast);
    ``event_per_step``: one per engine step (the reference; same records)."""
    until_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """Stop the simulation at this time (requests still in flight are reported as such).
    Default: run until every generated request has finished."""
    timeseries_interval_s: float | None = attrs.field(
        default=None, validator=optional(all_of(greater_than(0), in_range(MIN_PERIOD_S, MAX_TIME_S)))
    )
    """Sample each replica's queue length, batch size, KV use and busy state every this
    many simulated seconds (``Results.timeseries()``). Default: no sampling."""


def is_plugin_path(plugin: str) -> bool:
    """Whether a ``plugins`` entry names a Python file (``.py``, or a path with a slash), not a module.

    >>> is_plugin_path("my_policies.py"), is_plugin_path("lib/policies"), is_plugin_path("my_pkg.policies")
    (True, True, False)
    """
    return plugin.endswith(".py") or "/" in plugin or "\\" in plugin


def _plugin_paths(plugins: Any) -> Any:
    """File plugins made absolute against the scenario file's directory; module names as given."""
    if not isinstance(plugins, (list, tuple)):
        return plugins
    return tuple(resolve_path(p) if isinstance(p, str) and is_plugin_path(p) else p for p in plugins)


ProcessKindSpec = NewType("ProcessKindSpec", PolicySpec)
"""A :class:`PolicySpec` naming a process function (:data:`simpy_llm.processes.process_kinds`)."""


@attrs.frozen(kw_only=True)
class ProcessSpec:
    """A user process placed at a seam (``docs/processes.md``): ``between`` a Wire's producers
    and its consumer, or ``instead_of`` a component.

    >>> ProcessSpec(between="arrivals", process=PolicySpec(kind="rate_limit", params={"rate_per_s": 2.0})).seam
    'arrivals'
    """

    process: ProcessKindSpec
    """The registered process function and its parameters (``{kind: ..., params: {...}}``)."""
    between: str | None = None
    """The seam (a Wire) to stand on: ``arrivals``, ``replica:0``..."""
    instead_of: str | None = None
    """The component to stand in for: ``router`` or ``replica:<index>``."""

    def __attrs_post_init__(self) -> None:
        if (self.between is None) == (self.instead_of is None):
            raise FieldValueError("between", "give exactly one of between (a seam) and instead_of (a component)")

    @property
    def seam(self) -> str:
        """Where the process goes."""
        return self.between if self.between is not None else self.instead_of  # type: ignore[return-value]


_rebuild: Callable[[Scenario, dict[str, Any]], Scenario] | None = None
"""How :meth:`Scenario.replace` validates the changed scenario: the loader's, which sits above
this module (it knows the registries) and sets it with :func:`rebuild_with` when imported."""


def rebuild_with(rebuild: Callable[[Scenario, dict[str, Any]], Scenario]) -> Callable[[Scenario, dict[str, Any]], Scenario]:
    """Use *rebuild* for :meth:`Scenario.replace` (the loader calls this once)."""
    global _rebuild
    _rebuild = rebuild
    return rebuild


@attrs.frozen(kw_only=True)
class Scenario:
    """A whole scenario: workload, serving system, SLOs and run settings.

    Examples
    --------
    >>> from simpy_llm import load_scenario
    >>> s = load_scenario("scenarios/quickstart.yaml")
    >>> s
    <Scenario name='quickstart' clients=2 replicas=1 router=round_robin scheduler=fcfs>
    >>> s.replace(**{"serving.replicas": 4, "serving.router.kind": "least_loaded"})
    <Scenario name='quickstart' clients=2 replicas=4 router=least_loaded scheduler=fcfs>
    """

    workload: WorkloadConfig
    serving: ServingConfig
    seed: int = attrs.field(default=0, validator=all_of(at_least(0), at_most(MAX_SEED)))
    """Root seed of every random stream."""
    name: str = ""
    """Free-form label."""
    slo: dict[str, SLOTarget] = attrs.field(factory=dict)
    """SLO targets per class name. When given, every ``slo_class`` of a client or of
    ``servegen_data`` must be one of its keys (and a replayed trace's classes are checked
    when its file is read; see ``docs/scenarios.md``, "SLO classes")."""
    simulation: SimulationConfig = attrs.field(factory=SimulationConfig)
    speculation: SpeculationConfig | None = None
    """Speculative decoding: draft devices run the requests, the fleet verifies
    (:mod:`simpy_llm.config.speculation`, ``docs/speculative.md``). None: plain decoding."""
    planner: PlannerConfig | None = None
    """A periodic planner that resizes the fleet's active pools and batch limits by what-if
    simulations (:mod:`simpy_llm.config.planner`, ``docs/planner.md``). None: the
    configuration stays as given."""
    processes: tuple[ProcessSpec, ...] = ()
    """User processes placed at seams, in the order items pass them (``docs/processes.md``);
    their functions are registered in :data:`simpy_llm.processes.process_kinds`."""
    plugins: tuple[str, ...] = attrs.field(default=(), converter=_plugin_paths)
    """Modules (``my_package.policies``) or Python files (``my_policies.py``, relative to
    the scenario file) imported before the rest of the scenario is read, so that the
    policies they register can be named in it."""
    _loaded_from: str | None = attrs.field(default=None, init=False, eq=False, repr=False)
    """The file the scenario was loaded from (relative paths of :meth:`replace` resolve
    against its directory); None when built from data."""

    def __attrs_post_init__(self) -> None:
        if self.slo:
            self._check_slo_classes()
        if self.speculation is not None:
            self._check_speculation()
        if self.planner is not None:
            check_planner(self)

    def _check_slo_classes(self) -> None:
        """With an ``slo`` section, every SLO class the scenario names is one of its keys: a
        request of a class without targets would count as meeting them. (A replayed trace's
        classes are in its file: they are checked when the file is read.)"""
        wl = self.workload
        named = [(f"workload.clients[{i}].slo_class", c.slo_class) for i, c in enumerate(wl.clients)]
        if wl.servegen_data is not None:
            named.append(("workload.servegen_data.slo_class", wl.servegen_data.slo_class))
        for path, name in named:
            if name not in self.slo:
                raise FieldValueError(path, f"unknown SLO class {name!r}; the slo section defines: {', '.join(sorted(self.slo))}")

    def _check_speculation(self) -> None:
        """What speculative decoding cannot run with, and the draft groups' clients."""
        serving, wl = self.serving, self.workload
        if self.simulation.mode != "event_per_change":
            raise FieldValueError(
                "simulation.mode", "applies to continuous-batching replicas; verify servers take one event per pass in any mode"
            )
        if serving.disaggregation is not None:
            raise FieldValueError("speculation", "runs on a co-located fleet; remove serving.disaggregation")
        for path, group in zip(serving.group_paths(), serving.groups(), strict=True):
            if group.batch_server is not None:
                raise FieldValueError(f"serving.{path}batch_server", "speculative decoding's targets are verify servers, not batch servers")
            if group.warm_retention_s is not None:
                raise FieldValueError(f"serving.{path}warm_retention_s", "verify servers do not unload their model")
            engine = group.engine
            unread = (
                ("scheduler", engine.scheduler.kind != "fcfs", "their order is speculation.verify.order"),
                ("preemption_mode", engine.preemption_mode != "recompute", "they admit by KV reservation and never preempt"),
                ("swap_space_blocks", engine.swap_space_blocks > 0, "they never preempt"),
                ("ubatch_tokens", engine.ubatch_tokens is not None, "their passes are timed whole"),
                ("prefill_breaks", bool(engine.prefill_breaks), "their passes are timed whole"),
                ("reusable_prompt_tail", engine.reusable_prompt_tail is not None, "they have no prefix cache"),
                ("slot_cache", engine.slot_cache is not None, "they have no prefix cache"),
            )
            for key, set_, why in unread:
                if set_:
                    raise FieldValueError(f"serving.{path}engine.{key}", f"does not apply to speculative decoding's verify servers: {why}")
        known = {c.id for c in wl.clients}
        for i, c in enumerate(wl.clients):
            if c.network is not None:
                raise FieldValueError(
                    f"workload.clients[{i}].network",
                    "with speculation the draft groups' networks carry the requests; give the network to the draft group",
                )
        claimed: dict[str, str] = {}
        for g, group in enumerate(self.speculation.drafts):
            for cid in group.clients:
                if known and cid not in known:
                    raise FieldValueError(f"speculation.drafts[{g}].clients", f"no workload client {cid!r}; clients: {', '.join(sorted(known))}")
                if cid in claimed:
                    raise FieldValueError(f"speculation.drafts[{g}].clients", f"client {cid!r} is already run by draft group {claimed[cid]!r}")
                claimed[cid] = group.name
        if len([g for g in self.speculation.drafts if not g.clients]) > 1:
            raise FieldValueError("speculation.drafts", "at most one draft group may leave clients empty (it takes every other client)")

    @property
    def loaded_from(self) -> str | None:
        """The file the scenario was loaded from (absolute), or None when it was built from data."""
        return self._loaded_from

    def replace(self, **changes: Any) -> Scenario:
        """A new scenario with *changes* applied, validated as a loaded one is.

        Keys are dotted paths as for ``--set`` (``"workload.num_requests"``; list items
        by index, ``"workload.clients.0.rate_fraction"``), plain names for top-level
        keys (``seed=7``); values are taken as given, not parsed. Relative paths
        resolve against the directory of the file the scenario was loaded from.

        Raises
        ------
        ScenarioError
            If the changed scenario is not valid.
        """
        if _rebuild is None:
            raise RuntimeError("Scenario.replace needs the loader: import simpy_llm (or simpy_llm.loading) first")
        return _rebuild(self, changes)

    def __repr__(self) -> str:
        wl, serving = self.workload, self.serving
        parts = [f"name={self.name!r}"]
        if wl.clients:
            parts.append(f"clients={len(wl.clients)}")
        if wl.servegen_data is not None:
            parts.append(f"servegen={wl.servegen_data.path.rstrip('/').rsplit('/', 1)[-1]!r}")
        if wl.traces:
            parts.append(f"traces={len(wl.traces)}")
        parts.append(f"replicas={serving.num_replicas}")
        if serving.replica_groups:
            parts.append(f"groups={len(serving.replica_groups)}")
        parts.append(f"router={serving.entry_router.kind}")
        schedulers = dict.fromkeys(g.engine.scheduler.kind for g in serving.groups())
        parts.append(f"scheduler={'/'.join(schedulers)}")
        return f"<Scenario {' '.join(parts)}>"
