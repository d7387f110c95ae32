"""The ``speculation`` section of a scenario: distributed, fused and hybrid speculative decoding.

With a ``speculation`` section the scenario's replicas become **verify servers**
(targets) and its requests are run by **draft devices** (``docs/speculative.md``)::

    speculation:
      mode: distributed            # distributed | fused | hybrid
      k_max: 6
      gamma_policy: {kind: static, params: {gamma: 4}}
      drafts:
        - name: phones
          count: 40
          device: phone-snapdragon-8-gen-3
          clients: [mobile]        # the workload clients whose requests these devices run
          network: {rtt_ms: 40, bandwidth_mbps: 10}
          drafters:
            - {name: tiny, acceptance: illustrative-mobile, draft_token_ms: 25}
      verify: {order: edf, max_microbatch: 8}
      fused: {draft_token_ms: 1.5, acceptance: illustrative-mobile}

Every key changes what is simulated; see each field.
"""

from __future__ import annotations

from typing import Any, NewType

import attrs

from simpy_llm.config.common import LatencySpec, LengthField, NetworkConfig, PolicySpec
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.paths import resolve_path
from simpy_llm.config.validators import (
    MAX_DRAFT_DEVICES,
    MAX_TIME_S,
    all_of,
    at_least,
    at_most,
    greater_than,
    in_range,
    non_empty,
    one_of,
    optional,
)

__all__ = [
    "MAX_DRAFT_BATCH",
    "SPECULATION_MODES",
    "DraftGroupConfig",
    "DrafterConfig",
    "DrafterPolicySpec",
    "FusedConfig",
    "GammaSpec",
    "LoadControlConfig",
    "ModeSelectorSpec",
    "SpeculationConfig",
    "TreeConfig",
    "VerifyConfig",
]

SPECULATION_MODES = ("distributed", "fused", "hybrid")
"""``speculation.mode`` values."""
VERIFY_ORDERS = ("fcfs", "edf", "least_slack")
"""``speculation.verify.order`` values."""
PARTIAL_MODES = ("all", "sampled", "first_token")
"""``speculation.verify.partial`` values."""
MAX_TREE_WIDTH = 64
"""Largest ``speculation.drafts[].drafters[].tree.width``: candidate branches kept per depth."""
MAX_DRAFT_BATCH = 100_000
"""Largest ``speculation.drafts[].max_batch``: requests one draft device runs and drafts for at once."""

GammaSpec = NewType("GammaSpec", object)
"""A :class:`~simpy_llm.config.schema.PolicySpec` naming a γ policy (:mod:`simpy_llm.policies.gamma`)."""
ModeSelectorSpec = NewType("ModeSelectorSpec", object)
"""A :class:`~simpy_llm.config.schema.PolicySpec` naming a mode selector (:mod:`simpy_llm.policies.mode`)."""
DrafterPolicySpec = NewType("DrafterPolicySpec", object)
"""A :class:`~simpy_llm.config.schema.PolicySpec` naming a drafter selection policy
(:mod:`simpy_llm.policies.drafter_selection`)."""


def _curve_name(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """A curve is named (that the name or file gives a curve is the loader's check)."""
    if not isinstance(value, str) or not value:
        raise FieldValueError(attr.name, f"must be an acceptance curve name, YAML file or .joblib regressor bundle, got {value!r}")


def _curve_path(value: Any) -> Any:
    """An acceptance curve: a shipped name as given, a file path (YAML curve or ``.joblib``
    regressor bundle) resolved against the scenario."""
    if isinstance(value, str) and (value.endswith((".yaml", ".yml", ".joblib")) or "/" in value):
        return resolve_path(value)
    return value


def _curves_by_target(value: Any) -> Any:
    """Each target's curve resolved as :func:`_curve_path` resolves one."""
    return {k: _curve_path(v) for k, v in value.items()} if isinstance(value, dict) else value


def _target_curves(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """A mapping of target names to curves (that each name is a target is the loader's check)."""
    if not isinstance(value, dict):
        raise FieldValueError(attr.name, f"must map target names to acceptance curves, got {value!r}")
    for name, curve in value.items():
        if not isinstance(name, str) or not name:
            raise FieldValueError(attr.name, f"target names must be non-empty text, got {name!r}")
        if not isinstance(curve, str) or not curve:
            raise FieldValueError(f"{attr.name}.{name}", f"must be an acceptance curve name, YAML file or .joblib regressor bundle, got {curve!r}")


def _target_rtts(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """A mapping of target names to round trips, ms."""
    if not isinstance(value, dict):
        raise FieldValueError(attr.name, f"must map target names to round trips in ms, got {value!r}")
    for name, ms in value.items():
        if not isinstance(name, str) or not name:
            raise FieldValueError(attr.name, f"target names must be non-empty text, got {name!r}")
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms <= MAX_TIME_S * 1e3:
            raise FieldValueError(f"{attr.name}.{name}", f"must be a round trip in ms, 0..{MAX_TIME_S * 1e3:g}, got {ms!r}")


def _target_names(_inst: Any, attr: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    """Target names are non-empty text, each given once."""
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name:
            raise FieldValueError(f"{attr.name}[{i}]", f"must be a target name (replica group, cluster or replica), got {name!r}")
    if len(set(value)) != len(value):
        raise FieldValueError(attr.name, f"each target at most once, got {list(value)}")


@attrs.frozen(kw_only=True)
class LoadControlConfig:
    """EAGLE load control (seed 003 §6.1): a tree drafter shrinks its tree while the target
    it drafts for has many tokens waiting to be verified (``docs/speculative.md``, "Tree
    drafting (EAGLE) and load control").

    With ``L`` the tokens queued for verification at the target as a round's shape is
    chosen and ``s = (L - tokens_low) / (tokens_high - tokens_low)`` clamped to [0, 1], the
    round's depth is ``depth x (1 - s (1 - min_depth_scale))`` and its width
    ``width - s (width - min_beam_width)``, each rounded half up (depth at least 1): the
    full tree at or below ``tokens_low``, the smallest at or above ``tokens_high``.
    """

    tokens_low: int = attrs.field(validator=all_of(at_least(0), at_most(10**12)))
    """Queued verify tokens at or below which the full tree is drafted."""
    tokens_high: int = attrs.field(validator=all_of(at_least(1), at_most(10**12)))
    """Queued verify tokens at or above which the smallest tree is drafted (above ``tokens_low``)."""
    min_depth_scale: float = attrs.field(default=0.5, validator=all_of(greater_than(0), at_most(1)))
    """Share of the tree's depth kept at or above ``tokens_high``, (0, 1]."""
    min_beam_width: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_TREE_WIDTH)))
    """Width kept at or above ``tokens_high``, 1..``width``."""

    def __attrs_post_init__(self) -> None:
        if self.tokens_high <= self.tokens_low:
            raise FieldValueError("tokens_high", f"must be above tokens_low ({self.tokens_low}), got {self.tokens_high}")


@attrs.frozen(kw_only=True)
class TreeConfig:
    """EAGLE-style tree drafting: each round drafts a tree of ``depth`` levels keeping
    ``width`` candidate branches per level (a beam), verified in one pass over all its
    ``depth x width`` nodes (``docs/speculative.md``, "Tree drafting (EAGLE) and load control").
    """

    depth: int = attrs.field(validator=all_of(at_least(1), at_most(64)))
    """Levels of the tree, at most ``speculation.k_max`` (a round drafts ``min(γ, depth)``)."""
    width: int = attrs.field(validator=all_of(at_least(1), at_most(MAX_TREE_WIDTH)))
    """Candidate branches kept at each level."""
    prune_score_threshold: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    """Branches whose cumulative score (the product of the curve's ``p_j`` along the path)
    falls below this are dropped: the round stops at the last level whose score is at
    least this (always at least one level). 0: no pruning."""
    load_control: LoadControlConfig | None = None
    """Shrink the tree with the target's verify backlog (:class:`LoadControlConfig`). None: never."""

    def __attrs_post_init__(self) -> None:
        control = self.load_control
        if control is not None and control.min_beam_width > self.width:
            raise FieldValueError(
                "load_control.min_beam_width", f"must be at most the tree's width ({self.width}), got {control.min_beam_width}",
            )


@attrs.frozen(kw_only=True)
class DrafterConfig:
    """One draft model a draft device can run (seed 003 §4 ``drafter_models``).

    Its speed is ``draft_token_ms`` per drafted token, or, with ``weights_gb``, the
    memory-bound decode time ``weights_gb / memory_bandwidth_gb_per_s`` of its group's
    device (every draft token reads all weights once), or, with ``latency_model``, a decode
    step of that model (exactly one of the three). A draft step that drafts a token for
    each of ``n`` requests at once (the group's ``max_batch``) takes the model's decode step
    of ``n`` tokens, or the same time as one token without a model.
    """

    name: str = attrs.field(validator=non_empty)
    """Drafter name (records, drafter switches)."""
    acceptance: str = attrs.field(converter=_curve_path, validator=_curve_name)
    """Acceptance curve of this drafter against the target: a shipped name
    (``profiles/acceptance``), a YAML file (:mod:`simpy_llm.speculative.acceptance`) or a
    ``.joblib`` regressor bundle (:mod:`simpy_llm.speculative.regressor`)."""
    draft_token_ms: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S * 1e3))))
    """Time to draft one token, ms."""
    weights_gb: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(1e4))))
    """Bytes of the draft model's weights, GB (with the group's device: memory-bound speed)."""
    latency_model: LatencySpec | None = None
    """The draft model's latency model on the group's device (``{kind, params}``, as a replica
    group's): a draft step for ``n`` requests takes its decode step of ``n`` tokens,
    ``step_time_s(0, n)``, without attention terms (its expectation, for a model that draws)."""
    tree: TreeConfig | None = None
    """Draft a tree instead of a chain (:class:`TreeConfig`). None: a chain of γ tokens."""
    acceptance_by_target: dict[str, str] = attrs.field(factory=dict, converter=_curves_by_target, validator=_target_curves)
    """This drafter's curve against particular targets, by target name (a replica group, a
    cluster or a replica ``<group>/<k>``; the most specific name of a replica wins), in place
    of ``acceptance`` there. Empty: ``acceptance`` against every target."""

    def __attrs_post_init__(self) -> None:
        if self.tree is not None and self.acceptance_by_target:
            raise FieldValueError("acceptance_by_target", "a tree drafter reads one curve: per-target curves with a tree are not modelled")
        if self.latency_model is not None:
            if self.draft_token_ms is not None or self.weights_gb is not None:
                raise FieldValueError("latency_model", "give it instead of draft_token_ms and weights_gb, not with them")
            return
        if (self.draft_token_ms is None) == (self.weights_gb is None):
            raise FieldValueError("draft_token_ms", "give exactly one of draft_token_ms and weights_gb")


def _device(value: Any) -> Any:
    if isinstance(value, str) and (value.endswith((".yaml", ".yml")) or "/" in value):
        return resolve_path(value)
    return value


@attrs.frozen(kw_only=True)
class DraftGroupConfig:
    """Identical draft devices (a cohort: phones, laptops, edge GPUs).

    Each device runs one conversation at a time (up to ``max_batch`` with draft-side
    batching), closed loop: a request bound to it starts at ``max(its arrival, the
    device's previous request's end + think time)`` (seed 003 "Per-Draft Closed-Loop Think
    Time"). Requests bind by client: each request
    of a client in ``clients`` goes to one of the group's devices, round robin in
    arrival order, and every later request of the same session to the same device
    (seed 003 "Canonical Trace Mapping").
    """

    name: str = attrs.field(validator=non_empty)
    """Group name (records, fairness classes)."""
    count: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_DRAFT_DEVICES)))
    """Devices in the group (at most ``MAX_DRAFT_DEVICES`` over all groups)."""
    drafters: tuple[DrafterConfig, ...] = attrs.field(converter=tuple)
    """Draft models, smallest first; a request starts on the first (the portfolio's escalation
    moves it to the next)."""
    device: str | None = attrs.field(default=None, converter=_device)
    """The devices' profile (``profiles/devices``): energy, thermal throttling, availability
    windows, and the bandwidth ``weights_gb`` needs. None: none of those is modelled."""
    clients: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """Workload client ids whose requests this group runs (empty: every client no other
    group names)."""
    network: NetworkConfig | None = None
    """The devices' path to the targets: a client ``network`` block (``rtt_ms``,
    ``bandwidth_mbps``, ``bytes_per_token``, faults). Prompts and bundles go up, verdicts
    and answers come down, each device with its own link each way. None: no network."""
    think_time: LengthField | None = None
    """Seconds a device waits after a request ends before starting its next (a length
    distribution, ``{type: ..., params: ...}``). None: no wait."""
    escalate_below: float | None = attrs.field(default=None, validator=optional(in_range(0.0, 1.0)))
    """Mid-decode escalation (seed 003 §6.1): when a request's smoothed acceptance rate falls
    below this after a round, its next round uses the next drafter. None: never."""
    max_batch: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_DRAFT_BATCH)))
    """Draft-side batching (seed 003 §6.1): the most requests a device runs at once, each
    closed loop, and so the most it drafts for in one draft step (one token each). 1: one
    request at a time, each round drafted alone."""
    max_wait_ms: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(MAX_TIME_S * 1e3)))
    """How long a batch opened on an idle device waits for more rounds to join before its
    first step, ms (it starts earlier once it holds ``max_batch``). Only with ``max_batch > 1``."""
    chain: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """Chained speculation (seed 003 Appendix A.3): ``[tiny, mid]``, the group's two drafters.
    Each round the tiny one drafts γ tokens, the mid one verifies them (the tiny drafter's
    ``acceptance`` is its curve against the mid one) and drafts the rest up to γ, and the
    target verifies them with the mid drafter's curve. Empty: no chain."""
    drafter_policy: DrafterPolicySpec | None = None
    """Drafter selection (seed 003 §5.5): ``{kind, params}`` naming a registered policy
    (``fixed``, ``acceptance_portfolio``, ``bandit``), asked for the drafter when a request
    starts and after each of its distributed rounds. None: the first drafter, escalating
    with ``escalate_below`` when that is given."""
    targets: tuple[str, ...] = attrs.field(default=(), converter=tuple, validator=_target_names)
    """The targets this group's requests may be verified on: replica group, cluster or replica
    (``<group>/<k>``) names; the routers choose among those only. Empty: any target."""
    rtt_ms_by_target: dict[str, float] = attrs.field(factory=dict, validator=_target_rtts)
    """Round trip to particular targets, ms, by target name (the most specific name of a replica
    wins), in place of ``network.rtt_ms``: bundles and verdicts to and from such a target take
    links of their own with this round trip and the network's other figures. Needs ``network``.
    Empty: ``network.rtt_ms`` to every target."""

    def __attrs_post_init__(self) -> None:
        if not self.drafters:
            raise FieldValueError("drafters", "give at least one drafter")
        names = [d.name for d in self.drafters]
        if len(set(names)) != len(names):
            raise FieldValueError("drafters", f"drafter names must be unique, got {names}")
        if self.escalate_below is not None and len(self.drafters) < 2:
            raise FieldValueError("escalate_below", "needs at least two drafters to escalate to")
        if self.drafter_policy is not None:
            if len(self.drafters) < 2:
                raise FieldValueError("drafter_policy", "needs at least two drafters to choose among")
            if self.escalate_below is not None:
                raise FieldValueError("drafter_policy", "give it or escalate_below, not both (escalate_below is its own rule)")
        if self.device is None and any(d.weights_gb is not None for d in self.drafters):
            raise FieldValueError("device", "required: a drafter gives weights_gb, whose speed needs the device's memory bandwidth")
        if self.rtt_ms_by_target and self.network is None:
            raise FieldValueError("rtt_ms_by_target", "needs network (the other figures of the links to those targets)")
        if self.max_wait_ms and self.max_batch == 1:
            raise FieldValueError("max_wait_ms", "applies only with max_batch > 1 (a device drafting alone never waits)")
        if self.chain:
            self._check_chain(names)
        for i, d in enumerate(self.drafters):
            if d.tree is not None and self.max_batch > 1:
                raise FieldValueError(f"drafters[{i}].tree", "tree drafting needs max_batch 1 (trees in shared draft steps are not modelled)")

    def _check_chain(self, names: list[str]) -> None:
        """A chain names the group's two drafters, tiny first, and runs alone on the device."""
        chain = list(self.chain)
        if len(chain) != 2 or len(set(chain)) != 2:
            raise FieldValueError("chain", f"give two different drafter names, the tiny drafter then the mid one, got {chain}")
        if sorted(chain) != sorted(names):
            raise FieldValueError(
                "chain", f"must name exactly the group's drafters {names} (a drafter outside the chain would never run), got {chain}",
            )
        if self.escalate_below is not None:
            raise FieldValueError("escalate_below", "does not apply to a chained group (every round uses both drafters)")
        if self.drafter_policy is not None:
            raise FieldValueError("drafter_policy", "does not apply to a chained group (every round uses both drafters)")
        if self.max_batch > 1:
            raise FieldValueError("chain", "chained drafting needs max_batch 1 (chains in shared draft steps are not modelled)")
        for i, d in enumerate(self.drafters):
            if d.tree is not None:
                raise FieldValueError(f"drafters[{i}].tree", "a chained group's drafters draft chains, not trees")
            if d.acceptance_by_target:
                raise FieldValueError(f"drafters[{i}].acceptance_by_target", "a chain reads one curve per level: per-target curves are not modelled")


@attrs.frozen(kw_only=True)
class FusedConfig:
    """The target's own draft model, for fused rounds (seed 003 §7 "Fused SD")."""

    draft_token_ms: float = attrs.field(validator=all_of(at_least(0), at_most(MAX_TIME_S * 1e3)))
    """Time of one draft step on the target, ms (one step drafts a token for every
    request of the microbatch)."""
    acceptance: str = attrs.field(converter=_curve_path, validator=_curve_name)
    """Acceptance curve of the target's draft model."""


@attrs.frozen(kw_only=True)
class VerifyConfig:
    """How a target batches verification (seed 003 §6.2)."""

    order: str = attrs.field(default="edf", validator=one_of(VERIFY_ORDERS))
    """Which waiting jobs go first: ``fcfs`` (arrival), ``edf`` (earliest deadline: the
    round's start plus its SLO class's ``tvt_s``, or ``tpot_s x (γ + 1)``, or none) or
    ``least_slack`` (deadline minus the job's own verify time)."""
    max_microbatch: int = attrs.field(default=8, validator=all_of(at_least(1), at_most(100_000)))
    """Most jobs (sequences) one verify pass takes."""
    context_bucket_tokens: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(10**9))))
    """Selective batching: a pass takes only jobs whose context falls in the first job's
    bucket of this many tokens (a job past its deadline joins any pass). None: any."""
    cohort: str | None = attrs.field(default=None, validator=optional(one_of(("prefix",))))
    """Prefix cohorting: ``prefix`` makes a pass take only jobs of the first job's prefix group
    (with ``context_bucket_tokens``, of its bucket too; a job past its deadline joins any pass),
    and a pass whose requests all share a prefix reads that prefix's KV once (cascade attention).
    None: any job joins."""
    partial: str = attrs.field(default="all", validator=one_of(PARTIAL_MODES))
    """Which drafted positions the target verifies: ``all``; ``first_token`` (the first
    only); ``sampled`` (the first, and each later one with probability ``sample_rate``).
    The verify pass costs the verified positions only; a rejection at an unverified
    position is caught later and costs ``rollback_penalty_ms`` of target time."""
    sample_rate: float = attrs.field(default=1.0, validator=in_range(0.0, 1.0))
    """Probability that a later position is verified under ``partial: sampled``."""
    rollback_penalty_ms: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(MAX_TIME_S * 1e3)))
    """Target time to roll back one mis-speculation found late, ms."""
    max_kv_utilization: float = attrs.field(default=1.0, validator=all_of(greater_than(0), at_most(1)))
    """KV admission: a new request is admitted only while the target's KV in use, plus its
    prompt and output, stays within this share of its capacity."""
    kv_spill: str = attrs.field(default="queue", validator=one_of(("queue", "fused")))
    """A request the KV guard refuses: ``queue`` (waits for KV), or ``fused`` (waits too, and
    then runs fused, keeping its bundles off the network; needs ``speculation.fused``)."""
    prefix_caching: bool = False
    """Prefix caching and KV reuse (seed 003 §3.2, §6.2): the target's KV is the engine's
    paged prefix cache (``engine.kv_block_size`` tokens a block); a prefill computes only
    the prompt tokens not found cached (a shared system prompt, an earlier round's context),
    and a request's blocks stay cached, evictable, after it leaves. False: each request
    reserves its tokens whole and every prompt is computed in full."""
    preemption_slack_ms: float | None = attrs.field(
        default=None, validator=optional(in_range(-MAX_TIME_S * 1e3, MAX_TIME_S * 1e3)),
    )
    """Preemption inside a verify pass (seed 003 §6.2): a verify or fused job that arrives
    with slack (its deadline, minus now, minus its own verify time) below this many ms cuts
    the round pass in progress, unless a job of that pass is itself that close to its
    deadline; the cut pass's work is lost and it runs again, whole, right after the at-risk
    job's own pass. None: a pass is never cut."""

    def __attrs_post_init__(self) -> None:
        if self.sample_rate != 1.0 and self.partial != "sampled":
            raise FieldValueError("sample_rate", "applies only with partial: sampled")
        if self.rollback_penalty_ms and self.partial == "all":
            raise FieldValueError("rollback_penalty_ms", "applies only with partial verification (sampled or first_token)")


@attrs.frozen(kw_only=True)
class SpeculationConfig:
    """Speculative decoding over the scenario's fleet (module docstring)."""

    mode: str = attrs.field(default="distributed", validator=one_of(SPECULATION_MODES))
    """``distributed``, ``fused``, or ``hybrid`` (the mode selector chooses per request)."""
    drafts: tuple[DraftGroupConfig, ...] = attrs.field(converter=tuple)
    """The draft device groups."""
    k_min: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(64)))
    """Smallest γ, tokens."""
    k_max: int = attrs.field(default=6, validator=all_of(at_least(1), at_most(64)))
    """Largest γ, tokens (every acceptance curve used must cover it)."""
    gamma_policy: GammaSpec = attrs.field(default=None)
    """The γ policy (default ``{kind: static, params: {gamma: 4}}``); one instance per request."""
    mode_selector: ModeSelectorSpec | None = None
    """The mode selector of ``mode: hybrid`` (required then, refused otherwise)."""
    temperature: float | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(100))))
    """Sampling temperature the acceptance curves are read at (None: curves with one temperature)."""
    acceptance_sampling: str = attrs.field(default="bernoulli", validator=one_of(("bernoulli", "expected")))
    """``bernoulli``: each round's accepted prefix is drawn; ``expected``: each round yields
    the expected tokens, fractions carried to the next round (no randomness)."""
    bundle_header_bytes: float = attrs.field(default=64.0, validator=all_of(at_least(0), at_most(1e9)))
    """Bytes of a bundle or verdict besides its tokens (ids, positions, framing)."""
    fused: FusedConfig | None = None
    """The target's draft model (required by ``fused``, ``hybrid`` and ``kv_spill: fused``)."""
    verify: VerifyConfig = attrs.field(factory=VerifyConfig)
    """The targets' verify scheduling."""

    def __attrs_post_init__(self) -> None:
        if self.gamma_policy is None:
            object.__setattr__(self, "gamma_policy", PolicySpec(kind="static", params={"gamma": 4}))
        if self.k_max < self.k_min:
            raise FieldValueError("k_max", f"must be >= k_min ({self.k_min}), got {self.k_max}")
        if not self.drafts:
            raise FieldValueError("drafts", "give at least one draft group")
        names = [g.name for g in self.drafts]
        if len(set(names)) != len(names):
            raise FieldValueError("drafts", f"draft group names must be unique, got {names}")
        devices = sum(g.count for g in self.drafts)
        if devices > MAX_DRAFT_DEVICES:
            raise FieldValueError(
                "drafts",
                f"{devices} draft devices over all groups; at most {MAX_DRAFT_DEVICES} (each is a process with its own links)",
            )
        if (self.mode == "hybrid") != (self.mode_selector is not None):
            raise FieldValueError("mode_selector", "required with mode: hybrid" if self.mode == "hybrid" else "applies only with mode: hybrid")
        needs_fused = self.mode != "distributed" or self.verify.kv_spill == "fused"
        if needs_fused and self.fused is None:
            raise FieldValueError(
                "fused",
                f"required with mode: {self.mode}" if self.mode != "distributed" else "required with verify.kv_spill: fused",
            )
        if self.fused is not None and not needs_fused:
            raise FieldValueError("fused", "applies only with mode fused or hybrid, or verify.kv_spill: fused")
        for g, group in enumerate(self.drafts):
            for i, d in enumerate(group.drafters):
                if d.tree is None:
                    continue
                if d.tree.depth > self.k_max:
                    raise FieldValueError(f"drafts[{g}].drafters[{i}].tree.depth", f"must be at most k_max ({self.k_max}), got {d.tree.depth}")
                if self.verify.partial != "all":
                    raise FieldValueError(
                        "verify.partial", f"must be all with tree drafting (drafts[{g}].drafters[{i}].tree): a tree is verified whole",
                    )
