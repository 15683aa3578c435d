"""Drafter self-distillation: teach the diffusion mode to predict the AR mode's own greedy continuations.

Under greedy verification a draft token is accepted when it equals the verifier's argmax, not when it equals
the data. A drafter trained only on data learns what text comes next; at inference it is asked for what *this
model's AR mode* will say next, on contexts that are largely this model's own output. The distillation stage
closes that gap with a short phase after the main objective:

1. cut prefixes from the training stream and extend each with a greedy AR rollout of the current network
   (float32, exactly the tokens the verifier would choose);
2. train on ``[prefix | rollout]`` windows with the family's objective, except that the rows whose next
   token belongs to the rollout carry no next-token loss: the AR mode (the verifier, and so the output of
   every schedule) keeps learning from real text only, while the drafting blocks over the rollout learn to
   continue the model's own greedy text.

Only the block-diffusion objective of Nemotron-Labs-Diffusion is supported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specframe_training.forward import TrainingForward
from specframe_training.objectives import IGNORE, Batch, BlockDiffusionObjective, causal_mask


@dataclass(frozen=True)
class DistillConfig:
    """Settings of the distillation stage.

    Attributes:
        prefix: Real tokens before each rollout.
        rollout: Greedy tokens generated after each prefix.
        batch_size: Windows per step.
        lr: Constant AdamW learning rate of the stage (a fresh optimizer, no weight decay).
    """

    prefix: int = 64
    rollout: int = 64
    batch_size: int = 32
    lr: float = 5e-4

    def __post_init__(self) -> None:
        for name in ("prefix", "rollout", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"distill.{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"distill.lr must be > 0, got {self.lr}")


@torch.no_grad()
def greedy_rollouts(forward: TrainingForward, prefixes: torch.Tensor, length: int) -> torch.Tensor:
    """Extend each prefix with ``length`` greedy next tokens of the AR mode (causal rows, float32).

    Args:
        forward: The training forward of the network (run without autocast, so the argmax is the float32 one).
        prefixes: ``[B, P]`` token ids.
        length: Tokens to generate.

    Returns:
        ``[B, P + length]``: the prefixes followed by their rollouts.
    """
    ids = prefixes.long()
    size = ids.shape[0]
    for _ in range(length):
        rows = ids.shape[1]
        positions = torch.arange(rows, device=ids.device).expand(size, rows)
        hidden = forward.hidden(ids, positions, causal_mask(rows, ids.device).expand(size, rows, rows))
        following = forward.network.logits(hidden[:, -1]).argmax(dim=-1)
        ids = torch.cat([ids, following[:, None]], dim=1)
    return ids


def distillation_batch(
    objective: BlockDiffusionObjective, windows: torch.Tensor, prefix: int, generator: torch.Generator
) -> Batch:
    """The objective's rows for ``[prefix | rollout]`` windows, without next-token loss on rollout tokens.

    Args:
        objective: The block-diffusion objective (its masking and block settings apply unchanged).
        windows: ``[B, prefix + rollout]`` windows from :func:`greedy_rollouts`.
        prefix: Length of the real prefix of every window.
        generator: Random source of the blocks and masks.
    """
    if not isinstance(objective, BlockDiffusionObjective):
        raise TypeError("drafter distillation supports the block-diffusion (Nemotron-Labs-Diffusion) objective only")
    batch = objective.batch(windows, generator)
    targets = batch.targets.clone()
    length = windows.shape[1]
    targets[:, prefix - 1 : length] = IGNORE  # clean rows whose next token is generated
    return replace(batch, targets=targets)
