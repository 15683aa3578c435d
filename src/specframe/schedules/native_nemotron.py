"""Nemotron-Labs-Diffusion's own block-diffusion decoder (the "native" baseline).

The prompt call adds the first token, the seed of the first block. A block is the seed followed by W slots.
Each bidirectional call over the block (which reads the cache and writes nothing) fills the most confident
open slot plus every slot whose confidence reaches the threshold; once the block is full, one causal call
writes it to the cache, and its last prediction is the next block's seed. There is no verification: the
output is the diffusion decoder's, not the AR model's.
"""

from __future__ import annotations

from specframe.acceptance.base import Proposals
from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult, DraftGroup
from specframe.schedules.base import Schedule, verification_window, verify_planned_chain, window_plan
from specframe.state import DecodeState


class BlockDiffusionSchedule(Schedule):
    """Threshold decoding of fixed blocks ``[seed, slot x W]``.

    Args:
        threshold: Confidence at or above which an open slot is committed in the same call as the most
            confident one (the model card's default is 0.9).
    """

    name = "native"

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = threshold

    def plan(self, state: DecodeState) -> CallPlan:
        """A causal call when no block is open (prompt, or a full block to commit); else a diffusion step."""
        open_slots = self._open_slots(state)
        if not open_slots:
            return window_plan(state, verification_window(state))
        return CallPlan(
            pending=state.pending,
            order=(),
            chain=(),
            num_verify=0,
            drafts=(DraftGroup(context=0, targets=tuple(open_slots)),),
            width=state.ctx.width,
        )

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> None:
        """Take the seed from a causal call, or commit the confident slots of a diffusion step."""
        if plan.num_verify:
            verify_planned_chain(state, plan, result)
            return
        proposals = state.ctx.rule.propose(result.draft_logits[0], state.ctx.generator)
        commit_confident(state, plan.drafts[0].targets, proposals, self.threshold)

    def _open_slots(self, state: DecodeState) -> list[int]:
        pending = state.pending
        if state.first_call or not pending:
            return []
        seed = pending[0][0]
        last = min(state.end, seed + state.ctx.width)
        return [p for p in range(seed + 1, last + 1) if not state.is_resolved(p)]

    def describe(self) -> dict[str, object]:
        """Name and threshold."""
        return {"name": self.name, "threshold": self.threshold}


def commit_confident(state: DecodeState, targets: tuple[int, ...], proposals: Proposals, threshold: float) -> None:
    """Accept the most confident proposal and every proposal whose confidence reaches ``threshold``."""
    scores = proposals.score_list
    tokens = proposals.token_list
    best = max(range(len(targets)), key=lambda i: (scores[i], -i))
    chosen = [i for i in range(len(targets)) if i == best or scores[i] >= threshold]
    kept = state.accept([(targets[i], tokens[i]) for i in chosen])
    state.record(drafted=0, accepted=0, appended=kept)


def make_native(threshold: float = 0.9) -> BlockDiffusionSchedule:
    """Factory for Nemotron's ``native`` schedule.

    Raises:
        ValueError: If ``threshold`` is not in (0, 1].
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
    return BlockDiffusionSchedule(float(threshold))


@hookimpl
def register_schedules(register):
    """Register ``native`` for the Nemotron-Labs-Diffusion family."""
    register("native", make_native, family="nemotron-labs-diffusion")
