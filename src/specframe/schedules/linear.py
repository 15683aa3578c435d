"""Linear-SS: the standard two-call self-speculative schedule.

Each iteration drafts the window from the newest verified prefix (a drafting-only call), then verifies that
draft (a verification-only call). The first call processes the prompt and adds the first token.

With the confidence order, positions are ranked by the verifier's top probability from the previous
verification (appendix E.6); the order is fixed before the drafting call.
"""

from __future__ import annotations

from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult
from specframe.schedules.base import Schedule, draft_plan, store_group, verify_only_plan, verify_planned_chain
from specframe.state import DecodeState


class LinearSchedule(Schedule):
    """Two calls per iteration: draft from ``P_t``, then verify."""

    name = "linear"

    def plan(self, state: DecodeState) -> CallPlan:
        """Prompt call, then alternately a drafting call (no stored draft) and a verification call."""
        if state.first_call or state.drafts:
            return verify_only_plan(state)
        return draft_plan(state, tuple(state.window()))

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> int:
        """Store a fresh draft, or verify one and remember the verifier's confidence per position."""
        if plan.num_verify == 0:
            store_group(state, plan, result, keep_scores=True)
            return 0
        verdict = verify_planned_chain(state, plan, result)
        scores = dict(zip(plan.order[: plan.num_verify], verdict.scores.tolist(), strict=True))
        state.set_drafts({}, scores)
        return verdict.accepted


@hookimpl
def register_schedules(register):
    """Register the ``linear`` schedule."""
    register("linear", LinearSchedule)
