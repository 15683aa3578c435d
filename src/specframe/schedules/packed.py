"""Packed-SS: verify the current draft and draft the next one in ONE call (the paper's Algorithms 1-3).

The drafter runs one call ahead: while the verifier checks the draft ``D_{t-1}``, the diffusion mode proposes
the W positions of the current window from the verified prefix ``P_{t-1}`` alone. After acceptance, the
proposals at positions that are still unresolved become the next draft; the others are discarded. Input size
stays linear in W, and because each draft token is verified against the distribution it was drawn from, the
output is exactly the verifier's (Theorem 3.3).

Initial call (appendix E.2): with no draft yet the verifier adds exactly one token, so the first call drafts
the W positions after it and the second call verifies a full draft. The prompt is processed in that first
call for both families; the paper's SetDLM runs spend a separate counted prompt-cache call first, so SetDLM
responses here count one NFE fewer than that protocol.
"""

from __future__ import annotations

from specframe.acceptance.base import Verdict
from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult, DraftGroup
from specframe.schedules.base import Schedule, store_drafts, verification_window, verify_and_propose, window_plan
from specframe.state import DecodeState


class PackedSchedule(Schedule):
    """One call per iteration: verify ``D_{t-1}`` and draft from ``P_{t-1}`` together."""

    name = "packed"
    exact = True
    rate_model = "packed"  # width "auto" chooses its width (specframe.auto.rates)

    def plan(self, state: DecodeState) -> CallPlan:
        """Verify the stored draft over the window and draft the window from the verified prefix."""
        window = verification_window(state)
        if state.first_call:
            # Rank 1 is resolved by this very call, so its proposal would be discarded: draft past it.
            targets = tuple(state.window(after=window.order[:1]))
        else:
            targets = window.window
        return window_plan(state, window, (DraftGroup(context=0, targets=targets),))

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict:
        """Verify against the stored proposals, then keep the fresh proposals at unresolved positions.

        Both come from the same call's logits and reach the host in one transfer (:func:`verify_and_propose`).
        """
        verdict, proposals = verify_and_propose(state, plan, result)
        store_drafts(state, plan.drafts[0].targets, proposals)
        return verdict


@hookimpl
def register_schedules(register):
    """Register the ``packed`` schedule."""
    register("packed", PackedSchedule)
