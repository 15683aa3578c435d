"""Width and schedule chosen per call (``width: "auto"``, ``schedule: "auto"``): a thin dispatcher.

:class:`AutoSchedule` asks its :class:`~specframe.auto.policy.WidthPolicy` which candidate (schedule, width)
plans each call, lets that schedule plan and update, and tells the policy what the call verified and, through
:meth:`observe_call` (the decoder times every forward), what it cost. The candidates are the widths the
schedules declare (:meth:`Schedule.width_candidates`), so a plugin schedule can have its width chosen too; a
width of 0 is a plain AR call that checks what is stored and drafts nothing. Only plans change:
verification, acceptance and the cache are the library's, and every candidate is lossless.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from specframe.acceptance.base import DraftRef, Proposals, Verdict
from specframe.auto.costs import CostModel
from specframe.auto.policy import WidthPolicy
from specframe.auto.rates import AR, Candidate
from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult
from specframe.schedules.base import Schedule, store_drafts, verification_window, verify_planned_chain, window_plan
from specframe.schedules.kbranch import KBranchSchedule
from specframe.schedules.packed import PackedSchedule
from specframe.schedules.quadratic import QuadraticSchedule
from specframe.state import DecodeState

#: Largest width ``width: "auto"`` considers.
AUTO_MAX_WIDTH = 16


class DraftlessCall(Schedule):
    """A plain AR call that also checks a stored draft's first token, and drafts nothing (width 0)."""

    name = "ar"
    exact = True

    def plan(self, state: DecodeState) -> CallPlan:
        """Verify the one-position window (with the stored draft there, if any); no draft groups."""
        if not state.drafts:  # nothing stored: the window is the leftmost open position, as for plain AR
            position = state.leftmost_unresolved()
            return CallPlan(pending=state.pending, order=(position,), chain=(), num_verify=1, drafts=(), width=0)
        return window_plan(state, verification_window(state), (), width=0)

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict:
        """The verifier's verdict; drop the rest of the stored draft."""
        verdict = verify_planned_chain(state, plan, result)
        store_drafts(state, (), None)
        return verdict


class AutoSchedule(Schedule):
    """Plans each call with the candidate its policy chooses among ``schedules``' declared widths.

    Args:
        schedules: The schedules whose widths are chosen (each declares its ``width_candidates``).
        widths: Only these widths (``None``: every declared one); 0, a plain AR call, is always kept.
        name: The name metrics and reports show (``auto``, or the schedule whose width is chosen).
        k: Draft groups of ``kbranch`` candidates (their chain model needs it).
    """

    name = "auto"
    exact = True

    def __init__(
        self, schedules: Sequence[Schedule], *, widths: Sequence[int] | None = None, name: str = "auto", k: int = 2
    ) -> None:
        self.schedules = list(schedules)
        self.widths = tuple(widths) if widths is not None else None
        self.name, self.k = name, k
        self.deterministic = False
        self.policy: WidthPolicy | None = None
        self._cost: CostModel | None = None
        self._cost_source: Callable[[], CostModel] | None = None
        self._rows_of_plan: Callable[[CallPlan], int] | None = None
        self._planners: dict[Candidate, Schedule] = {}
        self._rows: dict[tuple[Candidate, int, int], int] = {}
        #: The template policy of each decoder width (``width + 1``): what its requests learn together.
        self._policies: dict[int, WidthPolicy] = {}
        self._offsets: dict[int, tuple[str, int]] = {}
        self._ctx = None
        self._acceptance: Sequence[float] | None = None

    def bind(
        self, cost: CostModel | Callable[[], CostModel], rows: Callable[[CallPlan], int], *,
        deterministic: bool = False, acceptance: Sequence[float] | None = None,
    ) -> None:  # fmt: skip
        """Give the schedule its cost model and the family's row count of a plan (``compose`` does).

        Args:
            cost: The cost model, or a function that gets it at first use (calibrating, announced, if needed).
            rows: The rows the family's layout needs for a plan.
            deterministic: Choose from what the request alone determines (see ``WidthPolicy.bind``).
            acceptance: The drafter's measured agreement by offset, the choice's prior (``None``: neutral).
        """
        self._cost, self._cost_source = (cost, None) if isinstance(cost, CostModel) else (None, cost)
        self._rows_of_plan, self.deterministic, self._acceptance = rows, deterministic, acceptance
        self.policy = None
        self._rows.clear()
        self._policies.clear()
        self._planners.clear()

    @property
    def cost(self) -> CostModel | None:
        """The cost model the choice uses (got, calibrating with a one-line notice if needed, at first use)."""
        if self._cost is None and self._cost_source is not None:
            self._cost, self._cost_source = self._cost_source(), None
        return self._cost

    @property
    def rates(self) -> dict[str, float]:
        """The latest throughput estimate (tokens per second) of each candidate, by label."""
        if self.policy is not None:
            return self.policy.rates
        return self.learned.learning.rates if self.learned is not None else {}

    @property
    def learned(self) -> WidthPolicy | None:
        """The template policy the requests of this schedule learned together (the latest width's), if any."""
        return next(reversed(self._policies.values()), None)

    def candidates(self, maximum: int) -> list[Candidate]:
        """Every candidate for a decoder width of ``maximum``; remembers which schedule plans each."""
        planners: dict[Candidate, Schedule] = {}
        for schedule in self.schedules:
            for width in schedule.width_candidates(maximum):
                if width == 0:
                    planners.setdefault(AR, DraftlessCall())
                elif self.widths is None or width in self.widths:
                    planners[Candidate(schedule.rate_model, width, schedule.name)] = schedule
        if not planners:
            raise ValueError(f"no width of {[s.name for s in self.schedules]} fits a decoder width of {maximum}")
        self._planners.update(planners)
        return list(planners)

    def describe(self) -> dict[str, object]:
        """Name, candidates, whether the choice is deterministic, and the pooled acceptance by offset."""
        out: dict[str, object] = {"name": self.name, "width": "auto" if self.widths is None else list(self.widths)}
        if self.deterministic:
            out["deterministic"] = True
        if len(self.schedules) > 1 or any(s.rate_model == "kbranch" for s in self.schedules):
            out["candidates"] = [s.name for s in self.schedules]
            out["k"] = self.k
        policy = self.learned if self.policy is None else self.policy
        if policy is not None:
            out.update(policy.stats.describe())
        return out

    def for_request(self) -> AutoSchedule:
        """The schedule of one request: its own pick, probes and draft offsets; the learning is the template's.

        Interleaved requests never share the policy's per-request state (the candidate that planned a call is
        the one that judges its result); what they share, and when, is :class:`~specframe.auto.policy.Learning`'s
        rule. The schedules it chooses among are copied for the request too (their ``for_request``); the rows
        memo and the cost model are layout and machine facts, shared.
        """
        if self._cost_source is not None and self._rows_of_plan is not None:
            _ = self.cost  # got once here, not once per request
        copied = copy.copy(self)
        copied.policy, copied._offsets, copied._ctx = None, {}, None
        copied.schedules = [schedule.for_request() for schedule in self.schedules]  # each plans this request only
        own = {id(schedule): mine for schedule, mine in zip(self.schedules, copied.schedules, strict=True)}
        copied._planners = {candidate: own.get(id(p), p) for candidate, p in self._planners.items()}
        return copied

    def label(self) -> str:
        """The candidate that planned the last call (``packed/w4``, ``ar``, ...)."""
        current = self.policy.current if self.policy is not None else None
        return current.label if current is not None else self.name

    # -- one call --------------------------------------------------------------------------------------
    def plan(self, state: DecodeState) -> CallPlan:
        """Choose the candidate for this call, then plan it with that schedule at that width."""
        if state.first_call:
            self._start_request(state)
        policy = self.policy
        current = policy.current
        if current is None or current.kind != "linear" or not state.drafts:  # Linear-SS's pair keeps its width
            current = policy.choose(state.start + len(state.tokens))
        state.width = max(current.width, 1)
        return self._planners[current].plan(state)

    def observe_call(self, state: DecodeState, rows: int, seconds: float, batch_rows: int | None = None) -> None:
        """Tell the policy what a steady-state call cost (a prompt call is no sample of one)."""
        if not state.first_call and self.policy is not None:
            self.policy.observe_call(rows, seconds, state.start + len(state.tokens), batch_rows)

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict | None:
        """Let the planning schedule judge the result; tell the policy what its verification accepted."""
        policy = self.policy
        if not plan.chain and policy.current.kind == "ar":  # a plain AR call: nothing to learn, nothing stored
            verdict = verify_planned_chain(state, plan, result)
            if state.drafts or state.scores:
                state.set_drafts({}, {})
            self._offsets = {}
            policy.observe_verification((), 0, 1)
            return verdict
        known = []
        for position in plan.chain_positions if plan.num_verify else ():
            entry = self._offsets.get(position)
            if entry is None:
                break
            known.append(entry)
        verdict = self._planners[policy.current].update(state, plan, result)
        accepted = 0 if verdict is None else verdict.accepted
        policy.observe_verification(known, accepted, accepted + (plan.num_verify > accepted))
        self._offsets = _draft_offsets(state, plan)
        return verdict

    def _start_request(self, state: DecodeState) -> None:
        ctx = state.ctx
        if self._rows_of_plan is None:
            raise RuntimeError("AutoSchedule needs bind(cost, rows) before use; compose() does this")
        candidates = self.candidates(ctx.width)  # and this request's planner of each
        template = self._policies.get(ctx.width + 1)
        if template is None:
            template = WidthPolicy(candidates, self._row_count, size=ctx.width + 1, free_bonus=ctx.traits.free_bonus,
                                   k=self.k, acceptance=self._acceptance)  # fmt: skip
            template.bind(self.cost, deterministic=self.deterministic)
            self._policies[ctx.width + 1] = template
        self.policy = template.for_request()
        self._ctx = replace(ctx, eos_token_ids=frozenset(), stop_sequences=(), stop_texts=())
        self._offsets = {}

    # -- rows of a candidate's calls, from the family's layout of its plan -----------------------------
    def _row_count(self, candidate: Candidate, kappa: int) -> int:
        """Rows of a steady-state call of ``candidate`` verifying ``kappa`` drafts (memoised)."""
        key = (candidate, kappa, self._ctx.width)  # shared by a batch's copies: a layout fact, no request's
        if key not in self._rows:
            self._rows[key] = self._rows_of_plan(self._steady_plan(candidate, kappa))
        return self._rows[key]

    def _steady_plan(self, candidate: Candidate, kappa: int) -> CallPlan:
        """The plan ``candidate`` makes mid-request: one pending token, ``kappa`` stored drafts after it."""
        state = DecodeState((0, 0), 4 * (self._ctx.width + 2), self._ctx)
        state.pending = ((1, 0),)  # the prompt's first token is cached
        state.calls = 1
        state.width = max(candidate.width, 1)
        if kappa:
            proposals = Proposals(torch.zeros(kappa, dtype=torch.long), torch.ones(kappa))
            window = state.window()[:kappa]
            state.set_drafts({p: DraftRef(proposals, i) for i, p in enumerate(window)}, {})
        return self._planners[candidate].for_request().plan(state)  # a throwaway copy: no request's state


def _draft_offsets(state: DecodeState, plan: CallPlan) -> dict[int, tuple[str, int]]:
    """Source (``prefix`` or ``branch``) and offset of each stored draft token, from its draft group.

    The offset counts from the last position the group's context showed; a group is a prefix group when it
    drafts from the position right after that one, a branch when it skips an unknown verifier token.
    """
    groups = []
    pending = [p for p, _ in plan.pending]
    for group in plan.drafts:
        if group.targets:
            seen = pending + list(plan.chain_positions[: group.context])
            groups.append((group.targets, max(seen) if seen else group.targets[0] - 1))
    offsets = {}
    for position, ref in state.drafts.items():
        for targets, end in groups:
            rows = len(ref.proposals.token_list)
            if rows == len(targets) and ref.row < rows and targets[ref.row] == position:
                offsets[position] = ("prefix" if targets[0] == end + 1 else "branch", position - end)
                break
    return offsets


def auto_schedule(k: int = 2) -> AutoSchedule:
    """Factory of ``schedule: "auto"``: packed (and plain AR calls), kbranch (``k`` groups) and quadratic.

    Raises:
        ValueError: If ``k`` is not an integer >= 1.
    """
    return AutoSchedule([PackedSchedule(), KBranchSchedule(k), QuadraticSchedule()], name="auto", k=k)


@hookimpl
def register_schedules(register):
    """Register ``auto``."""
    register("auto", auto_schedule)
