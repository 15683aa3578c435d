"""Plain autoregressive decoding: one verifier token per call, no drafts.

This is the reference every speculative schedule must reproduce: token for token under greedy decoding, in
distribution under sampling.
"""

from __future__ import annotations

from specframe.acceptance.base import Verdict
from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult
from specframe.schedules.base import Schedule, verify_planned_chain
from specframe.state import DecodeState


class ARSchedule(Schedule):
    """Generate the leftmost unresolved token from the verifier, one call per token."""

    name = "ar"
    exact = True
    takes_width = False  # one token per call: its window is always 1

    def plan(self, state: DecodeState) -> CallPlan:
        """Verify rank 1 of a one-position window with an empty chain."""
        position = state.leftmost_unresolved()
        return CallPlan(pending=state.pending, order=(position,), chain=(), num_verify=1, drafts=(), width=1)

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict:
        """The verifier's token (argmax or sample); no draft is ever accepted."""
        return verify_planned_chain(state, plan, result)


@hookimpl
def register_schedules(register):
    """Register the ``ar`` schedule."""
    register("ar", ARSchedule)
