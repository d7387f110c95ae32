"""Draft devices: the phones, laptops and edge GPUs that run speculative decoding's drafts.

A :class:`DraftFleet` sits between the workload and the router. Each request a
client sends is **bound** to a draft device of the group naming its client (seed
003 "Canonical Trace Mapping"): the same device as its session's earlier requests,
else the group's next device, round robin in arrival order. So one canonical trace
runs unchanged on any roster of devices.

Each :class:`DraftDevice` is a SimPy process running its requests one at a time,
closed loop (seed 003 "Per-Draft Closed-Loop Think Time"): a request starts at
``max(its arrival, the previous one's end + think time)``, delayed further while the
device is out of service (its profile's availability windows). It sends the prompt
up its link; the router picks the target, whose prefill computes the first token.
Then, in ``distributed`` mode, rounds: the target asks the request's γ policy for the
next round's γ as it sends each verdict (the γ controller sits at the target, seed 003
§6.4.1, and its answer travels with the verdict); the verdict reaching the device
(:meth:`DraftDevice.on_verdict`, in the delivery's instant) starts the drafting of γ
tokens (``γ x draft_token_s``, slower once thermally throttled, after any
out-of-service window), and the bundle goes up when drafted (``Link.put_at``: one
scheduled event per bundle); the process itself waits for the request's end. In
``fused`` mode the device just waits for the answer.

With draft-side batching (the group's ``max_batch`` above 1, seed 003 §6.1) a device is a
:class:`BatchingDraftDevice`: it runs up to ``max_batch`` requests at once, each closed
loop, and its rounds share draft steps (:class:`~simpy_llm.speculative.draft_batching.DraftSteps`),
each taking the drafter's step time at its batch size (:meth:`Drafter.step_s`); a round's
bundle goes up at the end of its last step (``docs/speculative.md``, "Draft-side batching").

Per-request bookkeeping lives in a :class:`SpecState` on ``request.spec``; it turns
a round's accepted prefix into tokens, records the round, and escalates to a larger
drafter when the smoothed acceptance falls below the group's ``escalate_below``, or asks
the group's drafter policy (:mod:`simpy_llm.policies.drafter_selection`) for the drafter
when the request starts and after each distributed round.

A group may be bound to targets (``targets``, ``rtt_ms_by_target``, drafters'
``acceptance_by_target``): the routers then ask their policy through
:class:`~simpy_llm.policies.routing.AllowedTargets` (:meth:`DraftFleet.bind_routing`), and a
request routed to a target with its own settings takes that target's drafters and
:class:`DraftPath` (:meth:`DraftFleet.routed`).
"""

from __future__ import annotations

import copy
import functools
import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from simpy_llm.config.structure import build_policy
from simpy_llm.kernel import timer_at
from simpy_llm.network.link import Link
from simpy_llm.policies.gamma import StaticGamma
from simpy_llm.policies.routing import AllowedTargets
from simpy_llm.serving.latency import latency_models
from simpy_llm.speculative.chain import ChainDrafting
from simpy_llm.speculative.draft_batching import DraftSteps
from simpy_llm.speculative.draft_paths import DraftPath, no_verdict_ahead
from simpy_llm.speculative.drafter import Drafter
from simpy_llm.speculative.spec_state import ACCEPTANCE_EWMA, SpecState
from simpy_llm.speculative.tree import RoundPlanner, TreeDrafting
from simpy_llm.wire import Wire

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    import numpy as np
    import simpy
    from simpy.events import Event

    from simpy_llm.config.common import PolicySpec
    from simpy_llm.config.speculation import DraftGroupConfig, SpeculationConfig
    from simpy_llm.entities import Request
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.network.link import Message
    from simpy_llm.policies.gamma import GammaPolicy
    from simpy_llm.policies.routing import RoutingPolicy
    from simpy_llm.speculative.decode_pool import VerifyServers
    from simpy_llm.speculative.targets import FleetTargets

__all__ = ["ACCEPTANCE_EWMA", "BatchingDraftDevice", "DraftDevice", "DraftFleet", "DraftPath", "Drafter", "SpecState"]

class DraftDevice:
    """One draft device: a SimPy process running its bound requests closed loop, one at a
    time, each round drafted alone (a group with ``max_batch`` above 1 has
    :class:`BatchingDraftDevice` devices).

    Parameters
    ----------
    fleet
        The fleet it belongs to (its links, targets, policies).
    group
        Its group's config.
    index
        Its number within the group.
    drafters
        Its draft models, smallest first.
    """

    def __init__(self, fleet: DraftFleet, group: DraftGroupConfig, index: int, drafters: list[Drafter]) -> None:
        env = fleet.env
        self.env = env
        self.fleet = fleet
        self.group = group.name
        self.index = index
        self.drafters = drafters
        self.chain: ChainDrafting | None = fleet.chains.get(group.name)
        """Its group's chained drafters (``chain``), or None."""
        self.planners: list[RoundPlanner | None] = fleet.planners[group.name]
        """Each drafter's round planner, in drafter order: its tree, or the group's chain (None:
        it drafts plain chains)."""
        self.escalate_below = group.escalate_below
        # The loader structures it as a policy spec (the schema's DrafterPolicySpec).
        self.drafter_policy = cast("PolicySpec | None", group.drafter_policy)
        """The group's drafter policy (one policy object per request), or None."""
        self.by_replica: list[tuple[list[Drafter], DraftDevice | DraftPath]] | None = None
        """Per target (fleet index): its drafters and its path, with per-target settings (None: none)."""
        self.path_links: list[Link] = []
        """The links of its paths to particular targets (``rtt_ms_by_target``)."""
        net = group.network
        self.network = net
        self.rtt_s = net.rtt_ms / 1e3 if net is not None else 0.0
        """Propagation round trip to the targets, s."""
        self.queue: deque[Request] = deque()
        """Requests bound to it and not started."""
        self.current: Request | None = None
        """The request it runs (None on a :class:`BatchingDraftDevice`: it may run several)."""
        self.free_at = 0.0
        self._busy_s = 0.0
        self._pending_busy: tuple[float, float] | None = None  # (from s, drafting s) of a round drafted ahead
        device = fleet.device_profiles.get(group.name)
        self.throttle = None
        self.availability: tuple[tuple[float, float], ...] = ()
        if device is not None:
            if device.thermal is not None:
                self.throttle = (device.thermal.throttle_after_s, device.thermal.throttle_factor)
            self.availability = tuple((w.start_s, w.end_s) for w in device.availability)
        self.think = group.think_time
        self.up: Link | None = None
        self.down: Link | None = None
        self._header_bytes = fleet.config.bundle_header_bytes
        if net is not None:
            self._one_way_s, self._bandwidth, self._token_bytes = net.one_way_s, net.bandwidth_bytes_per_s, net.bytes_per_token
            name = f"draft/{group.name}/{index}"
            rng_up = fleet.streams(f"{name}/up") if net.random else None
            rng_down = fleet.streams(f"{name}/down") if net.random else None
            bw = net.bandwidth_bytes_per_s
            self.up = Link(env, fleet.uploaded, name=f"{name}/up", rtt_s=self.rtt_s, bandwidth_bytes_per_s=bw,
                           rng=rng_up, dropped=fleet.lost, **net.link_faults())
            self.down = Link(env, fleet.downloaded, name=f"{name}/down", rtt_s=self.rtt_s, bandwidth_bytes_per_s=bw,
                             rng=rng_down, dropped=fleet.lost, **net.link_faults())
        self._idle: Event | None = None
        self._active_since: float | None = None
        self.max_batch = group.max_batch
        """Most requests it runs, and drafts for in one step, at once."""
        self.verdict_ahead: Callable[[Any, float], Message | None] = no_verdict_ahead
        """``Link.put_ahead`` of its downlink when the link carries one request's verdicts at a
        time (a device drafting alone), else a function declining (:meth:`DraftFleet.send_verdict`)."""
        if self.down is not None and group.max_batch == 1:
            self.verdict_ahead = self.down.put_ahead
        self.process = env.process(self._run())

    def bind_targets(self, group: DraftGroupConfig, drafters_by_replica: list[list[Drafter]], targets: FleetTargets) -> None:
        """Use, for a request routed to fleet index ``r``, the drafters ``drafters_by_replica[r]``
        and the path of the most specific ``rtt_ms_by_target`` name of ``r`` (its own links
        otherwise)."""
        paths = {name: DraftPath(self, group, name, ms) for name, ms in group.rtt_ms_by_target.items()}
        self.path_links = [link for path in paths.values() for link in (path.up, path.down)]
        chosen = targets.per_replica(paths)
        self.by_replica = [(drafters_by_replica[r], path if path is not None else self) for r, path in enumerate(chosen)]

    def download_s(self, tokens: int) -> float:
        """Nominal time for a verdict of *tokens* tokens to reach the device, s."""
        if self.network is None:
            return 0.0
        return self._one_way_s + (self._header_bytes + tokens * self._token_bytes) / self._bandwidth  # message_bytes, inline

    def message_bytes(self, tokens: int) -> float:
        """Bytes of a prompt, bundle or verdict carrying *tokens* tokens (needs a network)."""
        return self._header_bytes + tokens * self._token_bytes

    def bind(self, req: Request) -> None:
        """Queue *req* on this device."""
        self.queue.append(req)
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _available_from(self, t: float) -> float:
        """The first time at or after *t* the device is in service."""
        for start, end in self.availability:
            if start <= t < end:
                t = end
        return t

    def _draft_s(self, gamma: int, drafter: Drafter, at_s: float) -> float:
        """Time to draft *gamma* tokens with *drafter*, starting at *at_s* (throttled once the
        device has been running requests without a break for the throttle's ``after_s``)."""
        s = gamma * drafter.draft_token_s
        if self.throttle is not None and self._active_since is not None:
            after_s, factor = self.throttle
            if at_s - self._active_since >= after_s:
                s /= factor
        return s

    def on_verdict(self, req: Request) -> None:
        """The target's answer to *req* reached the device: the next round starts (the γ the
        verdict carries, drafting once the device is in service), its bundle going up
        when drafted; or, when the request has finished or was dropped, the process wakes.

        Rounds run here, in the delivery's instant, rather than in the process: one timer
        per round (the drafting), no process switch."""
        if req.completion_s == req.completion_s or req.dropped_reason:  # finished or dropped
            spec = req.spec
            assert spec is not None  # set while the device runs the request
            if not spec.wake.triggered:
                spec.wake.succeed()
            return
        self.next_round(req, self.env.now)

    def next_round(self, req: Request, at_s: float) -> None:
        """*req*'s verdict reaches the device at *at_s* (now, or later when the fleet knows
        it in advance: :meth:`DraftFleet.send_verdict`): its next round drafts its γ tokens
        from then (once in service), its bundle going up when drafted."""
        spec = req.spec
        assert spec is not None  # set while the device runs the request
        fleet = self.fleet
        gamma = spec.verdict_gamma
        start = self._available_from(at_s) if self.availability else at_s
        spec.round_start_s = start
        plan = spec.plan
        if plan is None:
            draft_s = self._draft_s(gamma, spec.drafter, start) if self.throttle is not None else gamma * spec.drafter.draft_token_s
        else:
            draft_s = plan.draft_s
            throttle = self.throttle
            if throttle is not None and self._active_since is not None and start - self._active_since >= throttle[0]:
                draft_s /= throttle[1]
        pending = self._pending_busy
        if pending is not None:
            self._busy_s += pending[1]
        if at_s > self.env.now:
            self._pending_busy = (at_s, draft_s)  # drafting from at_s: not busy before then
        else:
            self._pending_busy = None
            self._busy_s += draft_s
        fleet.send_bundle(req, self, gamma, start + draft_s)

    @property
    def busy_s(self) -> float:
        """Time spent drafting so far, s (a round drafts from its verdict's arrival)."""
        pending = self._pending_busy
        if pending is not None and self.env.now >= pending[0]:
            return self._busy_s + pending[1]
        return self._busy_s

    def _run(self) -> Generator[Event, None, None]:
        """The device process (module docstring).

        Yields
        ------
        Event
            A bound request, the closed-loop wait, drafting, and each verdict.
        """
        env = self.env
        fleet = self.fleet
        while True:
            while not self.queue:
                self._active_since = None
                self._idle = env.event()
                yield self._idle
                self._idle = None
            req = self.queue.popleft()
            start = self._available_from(max(env.now, self.free_at, req.arrival_s))
            if start > env.now:
                yield env.timeout(start - env.now)
            if self._active_since is None:
                self._active_since = env.now
            self.current = req
            req.draft_wait_s = env.now - req.arrival_s
            req.arrival_s = env.now
            spec = SpecState(fleet, self, fleet.new_policy(), req)
            req.spec = spec
            fleet.send_prompt(req, self)
            yield spec.wake  # its rounds run in on_verdict; this wakes when it has finished or was dropped
            req.spec = None
            self.current = None
            think = 0.0
            if self.think is not None:
                think = max(0.0, float(self.think.sample(fleet.think_rng, 1)[0]))
            self.free_at = env.now + think


class BatchingDraftDevice(DraftDevice):
    """A draft device of a group with ``max_batch`` above 1 (draft-side batching, seed 003
    §6.1): it runs up to ``max_batch`` requests at once, each closed loop in a slot of its
    own, and drafts for their rounds in shared draft steps (:class:`DraftSteps`;
    ``docs/speculative.md``, "Draft-side batching").

    Parameters are :class:`DraftDevice`'s.
    """

    def __init__(self, fleet: DraftFleet, group: DraftGroupConfig, index: int, drafters: list[Drafter]) -> None:
        self._fresh_slots = group.max_batch  # slots never used yet: free from the start
        self._slot_free: list[float] = []  # heap: when each used idle slot may start its next request
        self._running = 0
        super().__init__(fleet, group, index, drafters)
        self.steps = DraftSteps(
            self.env, group.max_batch, group.max_wait_ms / 1e3, step_s=self._step_s,
            back_at=self._available_from if self.availability else None, done=self._drafted,
        )
        """Its draft steps."""

    def _run(self) -> Generator[Event, None, None]:
        """The device process: starts its bound requests in binding order, each in a slot of
        its own (``max_batch`` slots, each closed loop: a request starts at ``max(its
        arrival, the slot's previous request's end + think time)``, later while the device
        is out of service), as soon as one can start.

        Yields
        ------
        Event
            A bound request, a slot freed, or the time the next request may start.
        """
        env = self.env
        queue = self.queue
        while True:
            wake_at = None
            if queue and (self._fresh_slots or self._slot_free):
                now = env.now
                slot_free = 0.0 if self._fresh_slots else self._slot_free[0]
                req = queue[0]
                start = self._available_from(max(now, slot_free, req.arrival_s))
                if start <= now:
                    queue.popleft()
                    if self._fresh_slots:
                        self._fresh_slots -= 1
                    else:
                        heapq.heappop(self._slot_free)
                    self._start_request(req)
                    continue
                wake_at = start
            if not queue and not self._running:
                self._active_since = None
            self._idle = env.event()
            if wake_at is not None:
                timer_at(env, wake_at).callbacks.append(self._wake)
            yield self._idle
            self._idle = None

    def _wake(self, _event: Event | None = None) -> None:
        """Wake the process (a slot freed, or a start time came)."""
        idle = self._idle
        if idle is not None and not idle.triggered:
            idle.succeed()

    def _start_request(self, req: Request) -> None:
        """Start *req* in a free slot now: its prompt goes up."""
        fleet = self.fleet
        now = self.env.now
        if self._active_since is None:
            self._active_since = now
        self._running += 1
        req.draft_wait_s = now - req.arrival_s
        req.arrival_s = now
        spec = SpecState(fleet, self, fleet.new_policy(), req)
        req.spec = spec
        spec.wake.callbacks.append(functools.partial(self._request_ended, req))
        fleet.send_prompt(req, self)

    def _request_ended(self, req: Request, _event: Event) -> None:
        """*req* finished or was dropped: its slot is free after the think time."""
        req.spec = None
        self._running -= 1
        think = 0.0
        if self.think is not None:
            think = max(0.0, float(self.think.sample(self.fleet.think_rng, 1)[0]))
        heapq.heappush(self._slot_free, self.env.now + think)
        self._wake()

    def next_round(self, req: Request, at_s: float) -> None:
        """*req*'s verdict reaches the device at *at_s* (now, or later when the fleet knows it
        in advance): its round is ready then."""
        if at_s > self.env.now:
            timer_at(self.env, at_s).callbacks.append(functools.partial(self._round_ready, req))
        else:
            self._round_ready(req)

    def _round_ready(self, req: Request, _event: Event | None = None) -> None:
        """*req*'s verdict is in: its round starts (now, or when the device is back in service)
        and joins the draft steps, or, drafting nothing, sends its bundle at once."""
        spec = req.spec
        assert spec is not None  # set while the device runs the request
        now = self.env.now
        start = self._available_from(now) if self.availability else now
        spec.round_start_s = start
        gamma = spec.verdict_gamma
        if gamma:
            self.steps.add(req, spec, gamma)
        else:
            self.fleet.send_bundle(req, self, 0, start)

    def _step_s(self, drafter: Drafter, n: int, now: float) -> float:
        """A step of *n* rounds of *drafter* starting at *now*: the drafter's step time at *n*,
        slower once thermally throttled; counted as drafting time."""
        s = drafter.step_s(n)
        if self.throttle is not None and self._active_since is not None:
            after_s, factor = self.throttle
            if now - self._active_since >= after_s:
                s /= factor
        self._busy_s += s
        return s

    def _drafted(self, req: Request, spec: SpecState) -> None:
        """*req*'s round has drafted its tokens: its bundle goes up now."""
        self.fleet.send_bundle(req, self, spec.verdict_gamma, self.env.now)


class DraftFleet:
    """Every draft device, between the workload's *sent* Wire and the router's *arrivals*.

    Parameters
    ----------
    env
        The SimPy environment.
    config
        The scenario's ``speculation`` section.
    sent
        Wire the workload generator and sessions put requests into (it becomes its handler).
    arrivals
        Wire the router reads; a prompt is put there when it reaches the targets.
    recorder
        Told of arrivals, drops, rounds and drafter switches.
    policy_factory
        Builds one γ policy object per request.
    mode_selector
        The mode selector (``hybrid``) or None.
    streams
        ``streams(name)``: the random stream *name* (links' jitter and loss, think times).
    device_profiles
        Each group's :class:`~simpy_llm.serving.devices.DeviceProfile`, by group name.
    dropped
        Wire receiving requests dropped on the network (e.g. the completions Wire).
    targets
        The fleet's replicas by target name: needed when a group gives ``targets``,
        ``rtt_ms_by_target`` or a drafter's ``acceptance_by_target`` (None: none does).
    """

    def __init__(
        self,
        env: simpy.Environment,
        config: SpeculationConfig,
        sent: Wire,
        arrivals: Wire,
        recorder: Recorder,
        *,
        policy_factory: Callable[[], GammaPolicy],
        mode_selector: Any,
        streams: Callable[[str], np.random.Generator],
        device_profiles: dict[str, Any],
        dropped: Wire | None = None,
        targets: FleetTargets | None = None,
    ) -> None:
        from simpy_llm.speculative.curves import acceptance_model

        self.env = env
        self.config = config
        self.arrivals = arrivals
        self.recorder = recorder
        self.new_policy = policy_factory
        self.mode_selector = mode_selector
        self.streams = streams
        self.device_profiles = device_profiles
        self.dropped = dropped
        self.servers: VerifyServers = []
        """The targets, by fleet index (set by the simulation once built; a disaggregated fleet's: its decode pool's)."""
        self.expected_acceptance = config.acceptance_sampling == "expected"
        """Rounds count the acceptance curve's expectation (carried over), not a draw."""
        self.think_rng = streams("draft/think_time")
        self.uploaded, self.downloaded, self.lost = Wire(env), Wire(env), Wire(env)
        self.rejected = Wire(env)
        """Wire the router puts the prompts its admission policy rejects into (the device
        hears at once, and the request goes on to *dropped*)."""
        self.devices: dict[str, list[DraftDevice]] = {}
        """Each group's devices, by group name."""
        self.planners: dict[str, list[RoundPlanner | None]] = {}
        """Each group's drafters' round planners, by group name (None: a plain chain drafter)."""
        self.chains: dict[str, ChainDrafting] = {}
        """Each chained group's drafters, by group name."""
        self.group_of_client: dict[str, str] = {}
        default = None
        for group in config.drafts:
            drafters = []
            for d in group.drafters:
                latency = None
                if d.latency_model is not None:
                    token_s = 0.0  # the latency model's decode step
                    latency = build_policy(d.latency_model, latency_models)
                elif d.draft_token_ms is not None:
                    token_s = d.draft_token_ms / 1e3
                else:
                    bandwidth = device_profiles[group.name].compute.memory_bandwidth_gb_per_s
                    token_s = d.weights_gb / bandwidth
                drafters.append(Drafter(d.name, token_s, acceptance_model(d.acceptance), latency))
            planners: list[RoundPlanner | None] = [
                TreeDrafting(d.tree, drafter, batched=d.latency_model is not None) if d.tree is not None else None
                for d, drafter in zip(group.drafters, drafters, strict=True)
            ]
            if group.chain:
                by_name = {d.name: d for d in drafters}
                chain = self.chains[group.name] = ChainDrafting(
                    by_name[group.chain[0]], by_name[group.chain[1]], streams(f"draft/{group.name}/chain"), expected=self.expected_acceptance,
                )
                planners = [chain] * len(drafters)
            self.planners[group.name] = planners
            kind = DraftDevice if group.max_batch == 1 else BatchingDraftDevice
            self.devices[group.name] = [kind(self, group, i, drafters) for i in range(group.count)]
            for cid in group.clients:
                self.group_of_client[cid] = group.name
            if not group.clients:
                default = group.name
        self.default_group = default
        self.targets = targets
        self.bound: dict[str, frozenset[int]] = {}
        """The fleet indices each group bound to ``targets`` may be verified on, by group name."""
        self.per_target = False
        """Whether some group has per-target drafters or links (routing then tells :meth:`routed`)."""
        if targets is not None:
            self._bind_targets(targets)
        self._next = dict.fromkeys(self.devices, 0)
        self._by_session: dict[str, DraftDevice] = {}
        self.pending: dict[int, Request] = {}
        """Requests bound to a device that have not reached a target, by id."""
        self.fused_fraction: float | None = None
        """Share of newly admitted requests that run fused, set by the planner
        (:meth:`plan_fused_fraction`); None: the scenario's mode (or mode selector) decides."""
        self._fused_credit = 0.0
        self.rejected.connect(self._rejected)
        sent.connect(self._bind)
        self.uploaded.connect(self._uploaded)
        self.downloaded.connect(self._downloaded)
        self.lost.connect(self._lost)

    def _bind_targets(self, targets: FleetTargets) -> None:
        """Each group's allowed targets, and each device's drafters and path per target."""
        for group in self.config.drafts:
            if group.targets:
                self.bound[group.name] = targets.allowed(group.targets)
            if not group.rtt_ms_by_target and not any(d.acceptance_by_target for d in group.drafters):
                continue
            self.per_target = True
            devices = self.devices[group.name]
            base = devices[0].drafters
            curves = [targets.per_replica(d.acceptance_by_target) for d in group.drafters]
            lists: dict[tuple[str | None, ...], list[Drafter]] = {}
            by_replica = []
            for r in range(len(targets.replicas)):
                key = tuple(c[r] for c in curves)
                if key not in lists:
                    lists[key] = base if not any(key) else [self._drafter_at(d, curve) for d, curve in zip(base, key, strict=True)]
                by_replica.append(lists[key])
            for device in devices:
                device.bind_targets(group, by_replica, targets)

    @staticmethod
    def _drafter_at(drafter: Drafter, curve: str | None) -> Drafter:
        """*drafter* with the acceptance curve *curve* (None: its own)."""
        from simpy_llm.speculative.curves import acceptance_model

        if curve is None:
            return drafter
        other = copy.copy(drafter)
        other.acceptance = acceptance_model(curve)
        return other

    def bind_routing(self, policy: RoutingPolicy, *, clusters: bool = False) -> RoutingPolicy:
        """*policy* as a router of the fleet should ask it: restricted, for the requests of a
        group bound to ``targets``, to that group's replicas (*clusters*: to the clusters holding
        any of them), and, over replicas, telling :meth:`routed` of each choice when some group
        has per-target settings. Unchanged when no group needs either."""
        targets = self.targets
        if targets is None or not (self.bound or self.per_target):
            return policy
        if clusters:
            names = {g: {targets.clusters[i] for i in allowed} for g, allowed in self.bound.items()}
            by_cluster = {g: frozenset(c for c, name in enumerate(targets.cluster_names) if name in held) for g, held in names.items()}
            return AllowedTargets(policy, by_cluster) if by_cluster else policy
        return AllowedTargets(policy, self.bound, self.routed if self.per_target else None)

    def routed(self, req: Request, replica: int) -> None:
        """*req* goes to fleet index *replica*: its drafters and path are that target's (its
        smoothed acceptance restarts at its drafter's ``p_1`` there, and its nominal download
        time is that path's)."""
        spec = req.spec
        if spec is None:
            return
        table = spec.device.by_replica
        if table is None:
            return
        drafters, path = table[replica]
        if drafters is not spec.drafters:
            spec.drafters = drafters
            spec.drafter = drafters[spec.drafter_index]
            spec.ewma = spec._prior(req.prompt_tokens + req.generated_tokens)
        if path is not spec.path:
            spec.path = path
            req.download_s = path.download_s(1)

    def plan_gamma(self, gamma: int) -> None:
        """Requests starting from now on run a static γ of *gamma* (``StaticGamma``), whatever
        ``speculation.gamma_policy`` says; requests already started keep their policy."""
        self.new_policy = functools.partial(StaticGamma, gamma=gamma)

    def plan_fused_fraction(self, fraction: float) -> None:
        """From now on, a share *fraction* of the requests admitted by a target run fused, in
        place of the scenario's mode choice (:meth:`planned_mode`)."""
        self.fused_fraction = fraction
        self._fused_credit = 0.0

    def planned_mode(self) -> str:
        """The mode of the next admitted request under :attr:`fused_fraction`: a credit grows
        by the fraction per admission and each whole unit of it makes one request fused, so
        any run of *n* admissions holds ``n x fraction`` fused ones, rounded either way
        (``0.5``: every second one; no random draw).

        >>> import types
        >>> fleet = types.SimpleNamespace(fused_fraction=0.25, _fused_credit=0.0)
        >>> [DraftFleet.planned_mode(fleet) for _ in range(8)].count("fused")
        2
        """
        fraction = self.fused_fraction
        assert fraction is not None  # asked only under a planned fraction
        credit = self._fused_credit + fraction
        if credit >= 1.0 - 1e-9:
            self._fused_credit = credit - 1.0
            return "fused"
        self._fused_credit = credit
        return "distributed"

    def links(self) -> list[Link]:
        """Every device's uplink and downlink, group by group."""
        return [link for devices in self.devices.values() for d in devices for link in (d.up, d.down, *d.path_links) if link is not None]

    # ------------------------------------------------------------------ binding
    def _bind(self, req: Request) -> None:
        group = self.group_of_client.get(req.client_id, self.default_group)
        if group is None:
            raise ValueError(
                f"request {req.id} of client {req.client_id!r}: no draft group names this client and none takes "
                "every other client (speculation.drafts[].clients)"
            )
        device = self._by_session.get(req.session_id) if req.session_id else None
        if device is None:
            devices = self.devices[group]
            k = self._next[group]
            self._next[group] = k + 1
            device = devices[k % len(devices)]
            if req.session_id:
                self._by_session[req.session_id] = device
        req.draft_group = device.group
        req.draft_device = device.index
        self.pending[req.id] = req
        device.bind(req)

    # ------------------------------------------------------------------ messages
    def send_prompt(self, req: Request, device: DraftDevice) -> None:
        """*device* starts *req*: its prompt goes up to the router."""
        if device.up is None:
            self._arrive(req)
        else:
            device.up.send(req, device.message_bytes(req.prompt_tokens))

    def send_bundle(self, req: Request, device: DraftDevice, gamma: int, at_s: float) -> None:
        """*device* will have drafted *gamma* tokens of *req* at *at_s*: the bundle goes up to
        its target then (one scheduled event: the link's, or the submission's)."""
        spec = req.spec
        assert spec is not None  # set while the device runs the request
        spec.sent_gamma = gamma
        up = spec.path.up
        if up is not None:
            plan = spec.plan  # a tree's bundle carries its nodes
            up.put_at(req, device.message_bytes(gamma if plan is None else plan.nodes), at_s)
        elif at_s > self.env.now:
            timer_at(self.env, at_s).callbacks.append(functools.partial(self._submit, req))
        else:
            self._submit(req)

    def _submit(self, req: Request, _event: Event | None = None) -> None:
        spec = req.spec
        assert spec is not None  # set while the device runs the request
        self.servers[req.replica].submit(req, spec.sent_gamma, spec.round_start_s)

    def send_verdict(self, req: Request, tokens: int) -> None:
        """A target answers *req*'s device with *tokens* new tokens (after the prefill or a
        round; when the request ends, its last tokens, or a fused request's whole answer).

        A verdict that continues the request carries the next round's γ, which the target
        chooses now: it sees its own verify queue and KV use as they are when it answers
        (seed 003 §6.4.1 places the γ controller there); the device, a download away,
        could not see them as they are when the verdict lands."""
        spec = req.spec
        assert spec is not None  # set while the device runs the request
        continuing = req.completion_s != req.completion_s and not req.dropped_reason
        if continuing:
            spec.verdict_gamma = spec.next_gamma(self.servers[req.replica])
        device = spec.device
        path = spec.path
        down = path.down
        if down is None:
            device.on_verdict(req)
            return
        size = device.message_bytes(tokens)
        if continuing:
            # The next round depends on nothing but when the verdict arrives: run it now, as
            # of then, and save the delivery's event (Link.put_ahead, when the downlink carries
            # this request's verdicts only, one at a time: a device drafting alone).
            msg = path.verdict_ahead(req, size)
            if msg is not None:
                device.next_round(req, msg.delivered_s)
                return
        down.send(req, size)

    def _arrive(self, req: Request) -> None:
        now = self.env.now
        del self.pending[req.id]
        req.upload_s = now - req.arrival_s
        req.arrival_s = now
        spec = req.spec
        assert spec is not None  # set while the device runs the request
        req.download_s = spec.device.download_s(1)
        self.recorder.on_arrival(req, now)
        self.arrivals.put(req)

    def _uploaded(self, message: Message) -> None:
        req: Request = message.payload
        if req.id in self.pending:
            self._arrive(req)
        elif req.dropped_reason == "":
            spec = req.spec
            assert spec is not None  # set while the device runs the request
            self.servers[req.replica].submit(req, spec.sent_gamma, spec.round_start_s)

    def _downloaded(self, message: Message) -> None:
        req: Request = message.payload
        spec = req.spec
        if spec is not None:
            spec.device.on_verdict(req)

    def _rejected(self, req: Request) -> None:
        """The router's admission policy rejected *req* (already recorded as dropped)."""
        spec = req.spec
        assert spec is not None  # set while the device runs the request
        spec.device.on_verdict(req)
        if self.dropped is not None:
            self.dropped.put(req)

    def _lost(self, message: Message) -> None:
        """A link dropped a prompt, bundle or verdict: its request is dropped."""
        req: Request = message.payload
        reason = f"network_{message.dropped_reason}"
        now = self.env.now
        if req.id in self.pending:
            del self.pending[req.id]
            req.upload_s = math.nan
            req.dropped_reason = reason
            self.recorder.on_arrival(req, now)
            self.recorder.on_drop(req)
            self.recorder.on_departure(now)
            if self.dropped is not None:
                self.dropped.put(req)
        elif req.completion_s != req.completion_s and not req.dropped_reason:
            self.servers[req.replica].abort(req, reason)
        spec = req.spec
        if spec is not None and not spec.wake.triggered:
            spec.wake.succeed()
