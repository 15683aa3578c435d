"""Nemotron-Labs-Diffusion's own block-diffusion decoder (the "native" baseline).

The prompt call adds the first token, the seed of the first block. A block is the seed followed by W slots.
Each bidirectional call over the block (which reads the cache and writes nothing) fills the most confident
open slot plus every slot whose confidence reaches the threshold; once the block is full, one causal call
writes it to the cache, and its last prediction is the next block's seed. There is no verification: the
output is the diffusion decoder's, not the AR model's.
"""

from __future__ import annotations

from specframe.acceptance.base import Verdict
from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult, Guess
from specframe.schedules.base import draft_plan, verify_only_plan, verify_planned_chain
from specframe.schedules.native import NativeSchedule
from specframe.state import DecodeState


class BlockDiffusionSchedule(NativeSchedule):
    """Threshold decoding of fixed blocks ``[seed, slot x W]``.

    Args:
        threshold: Confidence at or above which an open slot is committed in the same call as the most
            confident one (the model card's default is 0.9).
    """

    def plan(self, state: DecodeState) -> CallPlan:
        """A causal call when no block is open (prompt, or a full block to commit); else a diffusion step."""
        open_slots = self._open_slots(state)
        if not open_slots:
            return verify_only_plan(state)
        return draft_plan(state, tuple(open_slots))

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict | Guess:
        """Take the seed from a causal call, or commit the confident slots of a diffusion step."""
        if plan.num_verify:
            return verify_planned_chain(state, plan, result)
        return self.commit_confident(state, plan.drafts[0].targets, result.draft_logits[0])

    def _open_slots(self, state: DecodeState) -> list[int]:
        pending = state.pending
        if state.first_call or not pending:
            return []
        seed = pending[0][0]
        last = min(state.end, seed + state.ctx.width)
        return [p for p in range(seed + 1, last + 1) if not state.is_resolved(p)]


@hookimpl
def register_schedules(register):
    """Register ``native`` for the Nemotron-Labs-Diffusion family."""
    register("native", BlockDiffusionSchedule, family="nemotron-labs-diffusion")
