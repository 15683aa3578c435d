"""Linear-SS: the standard two-call self-speculative schedule.

Each iteration drafts the window from the newest verified prefix (a drafting-only call), then verifies that
draft (a verification-only call). The first call processes the prompt and adds the first token.

With the confidence order, positions are ranked by the verifier's top probability from the previous
verification (appendix E.6); the order is fixed before the drafting call.
"""

from __future__ import annotations

from specframe.acceptance.base import Verdict
from specframe.hookspecs import hookimpl
from specframe.hostread import HostCopy, read_together
from specframe.plan import CallPlan, CallResult
from specframe.schedules.base import Schedule, draft_plan, planned_chain, store_group, verify_only_plan
from specframe.state import DecodeState


class LinearSchedule(Schedule):
    """Two calls per iteration: draft from ``P_t``, then verify."""

    name = "linear"
    exact = True
    rate_model = "linear"  # width "auto" chooses its width (specframe.auto.rates)

    def plan(self, state: DecodeState) -> CallPlan:
        """Prompt call, then alternately a drafting call (no stored draft) and a verification call."""
        if state.first_call or state.drafts:
            return verify_only_plan(state)
        return draft_plan(state, tuple(state.window()))

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict | None:
        """Store a fresh draft, or verify one and remember the verifier's confidence per position."""
        if plan.num_verify == 0:
            store_group(state, plan, result, keep_scores=True)
            return None
        ctx = state.ctx
        chain = planned_chain(state, plan)
        verdict = ctx.rule.verify(chain, result.verify_logits, ctx.generator)
        confidence = HostCopy(verdict.scores) if ctx.order.uses_scores else None
        read_together(verdict, confidence)  # one host transfer for the outcome and the scores
        scores = dict(zip(plan.order[: plan.num_verify], confidence.values, strict=True)) if confidence else {}
        state.set_drafts({}, scores)
        return verdict


@hookimpl
def register_schedules(register):
    """Register the ``linear`` schedule."""
    register("linear", LinearSchedule)
