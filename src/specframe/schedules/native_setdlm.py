"""SetDLM's own sliding-window diffusion decoder (the "native" baseline).

The active window is the W unresolved positions from the leftmost one. Each call predicts every masked
position of the window from the decoded context; the most confident prediction is committed together with
every prediction whose confidence reaches the threshold (0.9 in the released decoder), and the window
slides. Newly decoded tokens enter the next call as clean rows, which the cache then keeps. There is no
verification: the output is the diffusion decoder's, not the any-order AR model's.
"""

from __future__ import annotations

from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult, DraftGroup
from specframe.schedules.base import Schedule
from specframe.schedules.native_nemotron import commit_confident, make_native
from specframe.state import DecodeState


class SlidingWindowSchedule(Schedule):
    """Threshold decoding over a sliding window of W positions.

    Args:
        threshold: Confidence at or above which a position is committed besides the most confident one.
    """

    name = "native"

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = threshold

    def plan(self, state: DecodeState) -> CallPlan:
        """Predict every unresolved position of the window from the decoded context."""
        return CallPlan(
            pending=state.pending,
            order=(),
            chain=(),
            num_verify=0,
            drafts=(DraftGroup(context=0, targets=tuple(state.window())),),
            width=state.ctx.width,
        )

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> None:
        """Commit the confident predictions."""
        proposals = state.ctx.rule.propose(result.draft_logits[0], state.ctx.generator)
        commit_confident(state, plan.drafts[0].targets, proposals, self.threshold)

    def describe(self) -> dict[str, object]:
        """Name and threshold."""
        return {"name": self.name, "threshold": self.threshold}


def make_sliding_window(threshold: float = 0.9) -> SlidingWindowSchedule:
    """Factory for SetDLM's ``native`` schedule (validates ``threshold`` like Nemotron's)."""
    return SlidingWindowSchedule(make_native(threshold).threshold)


@hookimpl
def register_schedules(register):
    """Register ``native`` for the SetDLM family."""
    register("native", make_sliding_window, family="setdlm")
