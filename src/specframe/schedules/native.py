"""What the families' own diffusion decoders (the ``native`` baselines) share: committing confident guesses.

Both decoders predict a set of open positions in one call, commit the most confident prediction together
with every prediction whose confidence reaches a threshold, and verify nothing: the output is the diffusion
decoder's, not the AR model's. They differ only in which positions a call predicts (a fixed block for
Nemotron-Labs-Diffusion, a sliding window for SetDLM).
"""

from __future__ import annotations

import torch

from specframe.plan import Guess
from specframe.schedules.base import Schedule
from specframe.state import DecodeState


class NativeSchedule(Schedule):
    """Base of the threshold decoders; subclasses choose the positions each call predicts.

    Args:
        threshold: Confidence at or above which an open position is committed in the same call as the most
            confident one (both released decoders use 0.9).

    Raises:
        ValueError: If ``threshold`` is not a number in (0, 1].
    """

    name = "native"
    auto_width = 8  # the released decoders' block size / window; no cost model chooses it
    exact = False  # commits unverified guesses: the output is the diffusion decoder's

    def __init__(self, threshold: float = 0.9) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
        self.threshold = float(threshold)

    def commit_confident(self, state: DecodeState, targets: tuple[int, ...], logits: torch.Tensor) -> Guess:
        """Propose ``targets`` from ``logits``; the most confident and every confident proposal, as a guess."""
        proposals = state.ctx.rule.propose(logits, state.ctx.generator)
        scores = proposals.score_list
        tokens = proposals.token_list
        best = max(range(len(targets)), key=lambda i: (scores[i], -i))
        chosen = [i for i in range(len(targets)) if i == best or scores[i] >= self.threshold]
        return Guess(tuple((targets[i], tokens[i]) for i in chosen))

    def describe(self) -> dict[str, object]:
        """Name and threshold."""
        return {"name": self.name, "threshold": self.threshold}
