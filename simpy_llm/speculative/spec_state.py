"""A request's speculative-decoding state: :class:`SpecState`, on ``request.spec`` while a draft
device (:mod:`simpy_llm.speculative.draft`) runs it.

It asks the request's γ policy for each round's γ (and, for a tree or chained drafter, plans the
round's shape), turns a round's accepted prefix into tokens and records the round, and changes
the request's drafter: escalating to a larger one when the smoothed acceptance falls below the
group's ``escalate_below``, or as the group's drafter policy
(:mod:`simpy_llm.policies.drafter_selection`) answers when the request starts and after each
distributed round.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simpy_llm.config.structure import build_policy
from simpy_llm.policies.drafter_selection import DrafterState, drafter_policies
from simpy_llm.policies.gamma import GammaState, StaticGamma
from simpy_llm.speculative.tree import RoundPlan, RoundPlanner, queued_verify_tokens

if TYPE_CHECKING:
    from simpy.events import Event

    from simpy_llm.entities import Request
    from simpy_llm.policies.drafter_selection import DrafterPolicy
    from simpy_llm.policies.gamma import GammaPolicy
    from simpy_llm.speculative.draft import DraftDevice, DraftFleet, DraftPath
    from simpy_llm.speculative.verify import VerifyServer

__all__ = ["ACCEPTANCE_EWMA", "SpecState"]

ACCEPTANCE_EWMA = 0.3
"""Weight of the newest round in a request's smoothed acceptance rate (``acceptance_ewma``)."""
_NO_SLO = (None, None, None)


class SpecState:
    """One request's speculative-decoding state (on ``request.spec`` while it runs)."""

    __slots__ = (
        "_first", "_reads_probabilities", "accepted_last", "carry", "device", "drafter", "drafter_index", "drafters", "ewma",
        "fleet", "gamma", "last_token_s", "mode", "path", "plan", "planner", "policy", "proposed_last", "req", "round_start_s",
        "selector", "sent_gamma", "verdict_gamma", "wake",
    )

    def __init__(self, fleet: DraftFleet, device: DraftDevice, policy: GammaPolicy, req: Request) -> None:
        self.fleet = fleet
        self.req = req
        self.device = device
        self.policy = policy
        self._reads_probabilities = getattr(policy, "reads_position_probabilities", True)
        bind = getattr(policy, "bind_request", None)  # a policy keeping memory beyond its request (per target)
        if bind is not None:
            bind(req, fleet)
        self.mode = ""
        self.drafters = device.drafters
        """The group's drafters as they run against the request's target (each with its curve
        there, once routed: ``acceptance_by_target``)."""
        self.path: DraftDevice | DraftPath = device
        """The links and round trip to the request's target: the device's own, or, once routed to
        a target of ``rtt_ms_by_target``, that target's."""
        self.drafter_index = 0
        # A chained group's request drafts with the level the target verifies (records, γ policies).
        self.drafter = device.drafters[0] if device.chain is None else device.chain.mid
        cfg = fleet.config
        self.gamma = min(max(getattr(policy, "default_gamma", getattr(policy, "gamma", cfg.k_min)), cfg.k_min), cfg.k_max)
        self.accepted_last = 0
        self.proposed_last = 0
        self.selector: DrafterPolicy | None = None
        """The request's drafter policy (None: the first drafter, or ``escalate_below``)."""
        self.ewma = self._prior(req.prompt_tokens)
        if device.drafter_policy is not None:
            self.selector = build_policy(device.drafter_policy, drafter_policies)
            index = self._choose_drafter(req, None)
            if index:
                self.drafter_index = index
                self.drafter = self.drafters[index]
                self.ewma = self._prior(req.prompt_tokens)
        self.carry = 0.0
        self.sent_gamma = 0
        self.last_token_s = math.nan
        self.round_start_s = math.nan
        self.wake: Event = fleet.env.event()
        """Succeeded when the request has finished or was dropped (its device's process waits for it)."""
        self._first: int | None = None
        self.verdict_gamma = 0
        """γ of the next distributed round: the target's choice as it sent the verdict."""
        self.planner: RoundPlanner | None = device.planners[self.drafter_index]
        """Plans each distributed round of the current drafter when it drafts a tree or a
        chained round (None: a plain chain of γ tokens)."""
        self.plan: RoundPlan | None = None
        """The current distributed round's plan (None: a plain chain of γ tokens)."""

    def _prior(self, context: int) -> float:
        """The drafter's first-position acceptance at *context*: the smoothed rate's start."""
        return self.drafter.acceptance.position_probabilities(max(context, 1), 1, self.fleet.config.temperature)[0]

    def _choose_drafter(self, req: Request, server: VerifyServer | None) -> int:
        """The drafter policy's answer, from the telemetry of *server* (None: the request is
        starting, no target yet: its figures are 0)."""
        selector = self.selector
        assert selector is not None  # asked only under a drafter policy
        device = self.device
        drafters = self.drafters
        index = selector.choose(DrafterState(
            drafters=tuple(drafters), current=self.drafter_index, rounds=req.spec_rounds,
            context_tokens=req.prompt_tokens + req.generated_tokens, gamma=self.gamma,
            temperature=self.fleet.config.temperature, rtt_s=self.path.rtt_s,
            verify_queue_wait_s=server.queue_wait_s if server is not None else 0.0,
            verify_step_s=server.pass_s if server is not None else 0.0,
            accepted_last=self.accepted_last, proposed_last=self.proposed_last, acceptance_ewma=self.ewma,
        ))
        if not 0 <= index < len(drafters):
            raise ValueError(f"drafter policy {type(selector).__name__} returned drafter {index}; group {device.group!r} has {len(drafters)}")
        return index

    def _switch_drafter(self, req: Request, index: int, now: float) -> None:
        """Run *req*'s next rounds on drafter *index*: its smoothed acceptance restarts at that
        drafter's ``p_1`` at the current context, and the switch is recorded."""
        device = self.device
        old = self.drafter.name
        self.drafter_index = index
        self.drafter = self.drafters[index]
        self.planner = device.planners[index]
        self.plan = None
        req.drafter = self.drafter.name
        self.ewma = self._prior(req.prompt_tokens + req.generated_tokens)
        self.fleet.recorder.on_drafter_switch((now, req.id, device.group, device.index, old, self.drafter.name))

    def first_gamma(self, server: VerifyServer) -> int:
        """γ of the first round, asked once (the mode selector reads it before the round)."""
        if self._first is None:
            self._first = self._ask(server, fused=False)
        return self._first

    def next_gamma(self, server: VerifyServer, *, fused: bool = False) -> int:
        """γ of the next round: the policy's, and never more than the tokens still to make
        minus the target's own token."""
        if self._first is not None:
            gamma, self._first = self._first, None
        else:
            gamma = self._ask(server, fused=fused)
        self.gamma = gamma
        req = self.req
        left = req.output_tokens - req.generated_tokens - 1
        capped = gamma if gamma <= left else (left if left > 0 else 0)
        planner = self.planner
        if planner is None or fused:
            return capped
        # A tree or chained round, planned here as the verdict leaves (the target's verify
        # backlog as it is now); γ caps a tree's depth, and the depth is the round's γ.
        plan = self.plan = planner.plan(
            capped, req.prompt_tokens + req.generated_tokens, self.fleet.config.temperature,
            queued_verify_tokens(server.rounds) if planner.control is not None else 0,
        )
        return plan.depth

    def _ask(self, server: VerifyServer, *, fused: bool) -> int:
        cfg = self.fleet.config
        k_min, k_max = cfg.k_min, cfg.k_max
        policy = self.policy
        if type(policy) is StaticGamma:  # the rule needs no telemetry: skip building it
            gamma = policy.gamma
            return (gamma if gamma < k_max else k_max) if gamma > k_min else k_min
        req = self.req
        if self._reads_probabilities:
            model = server.fused_acceptance if fused else self.drafter.acceptance
            probabilities = model.position_probabilities(req.prompt_tokens + req.generated_tokens, k_max, cfg.temperature)
        else:
            probabilities = ()
        # Clamps as conditional expressions, not min()/max() calls: this runs once per round.
        kv = server.kv
        used = kv.used_blocks / kv.num_blocks if kv.num_blocks else 0.0
        ewma = self.ewma
        state = GammaState.trusted_values((  # field order; values valid by construction
            self.gamma, k_min, k_max,
            0.0 if fused else self.path.rtt_s,
            server.queue_wait_s,
            used if used < 1.0 else 1.0,
            self.accepted_last, self.proposed_last,
            (ewma if ewma < 1.0 else 1.0) if ewma > 0.0 else 0.0,
            probabilities,
            server.fused_draft_s if fused else self.drafter.draft_token_s,
            server.pass_s, server.slo.get(req.slo_class, _NO_SLO)[1],
        ))
        gamma = int(policy.next_gamma(state))
        return (gamma if gamma < k_max else k_max) if gamma > k_min else k_min

    def settle_round(self, req: Request, gamma: int, accepted: float, rolled_back: bool, now: float, replica: int, fused: bool) -> int:
        """A round's verify pass ended at *now*: count its tokens and figures; returns the
        tokens it added (the accepted prefix and the target's token, capped at what is left)."""
        left = req.output_tokens - req.generated_tokens
        fleet = self.fleet
        if fleet.expected_acceptance:
            self.carry += accepted + 1.0
            gained = int(self.carry)
            self.carry -= gained
        else:
            gained = int(accepted) + 1
        if gained > left:
            gained = left
        req.generated_tokens += gained
        if req.streaming and not req.warm_up:  # a round's tokens reach the client together
            fleet.recorder.on_token_burst(now - self.last_token_s, gained)
        self.last_token_s = now
        req.spec_rounds += 1
        req.drafted_tokens += gamma
        req.accepted_tokens += gained - 1
        req.rollbacks += rolled_back
        device = self.device
        down = 0.0 if fused else self.path.download_s(gained)
        tvt = now + down - self.round_start_s
        if not tvt <= req.tvt_s:  # also replaces NaN
            req.tvt_s = tvt
        if gamma:
            self.ewma += ACCEPTANCE_EWMA * ((accepted if accepted < gamma else gamma) / gamma - self.ewma)
        self.accepted_last = int(accepted)
        self.proposed_last = gamma
        fleet.recorder.on_spec_round((
            now, req.id, replica, device.group, device.index, "fused" if fused else "distributed",
            "" if fused else self.drafter.name, gamma, float(accepted), gained,
            req.prompt_tokens + req.generated_tokens - gained, tvt, int(rolled_back),
        ))
        plan = self.plan
        if plan is not None and not fused:
            plan.record(fleet.recorder, len(fleet.recorder.spec_rounds) - 1)
        threshold = device.escalate_below
        if (
            not fused and threshold is not None and self.ewma < threshold
            and self.drafter_index + 1 < len(self.drafters) and req.generated_tokens < req.output_tokens
        ):
            self._switch_drafter(req, self.drafter_index + 1, now)
        elif self.selector is not None and not fused and req.generated_tokens < req.output_tokens:
            index = self._choose_drafter(req, fleet.servers[replica])
            if index != self.drafter_index:
                self._switch_drafter(req, index, now)
        return gained
