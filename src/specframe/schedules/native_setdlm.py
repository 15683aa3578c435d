"""SetDLM's own sliding-window diffusion decoder (the "native" baseline).

The active window is the W unresolved positions from the leftmost one. Each call predicts every masked
position of the window from the decoded context; the most confident prediction is committed together with
every prediction whose confidence reaches the threshold (0.9 in the released decoder), and the window
slides. Newly decoded tokens enter the next call as clean rows, which the cache then keeps. There is no
verification: the output is the diffusion decoder's, not the any-order AR model's.
"""

from __future__ import annotations

from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult, Guess
from specframe.schedules.base import draft_plan
from specframe.schedules.native import NativeSchedule
from specframe.state import DecodeState


class SlidingWindowSchedule(NativeSchedule):
    """Threshold decoding over a sliding window of W positions.

    Args:
        threshold: Confidence at or above which a position is committed besides the most confident one.
    """

    def plan(self, state: DecodeState) -> CallPlan:
        """Predict every unresolved position of the window from the decoded context."""
        return draft_plan(state, tuple(state.window()))

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Guess:
        """Commit the confident predictions."""
        return self.commit_confident(state, plan.drafts[0].targets, result.draft_logits[0])


@hookimpl
def register_schedules(register):
    """Register ``native`` for the SetDLM family."""
    register("native", SlidingWindowSchedule, family="setdlm")
