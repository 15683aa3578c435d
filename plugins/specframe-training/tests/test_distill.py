"""Drafter self-distillation: rollouts are the AR mode's greedy output, and only drafting rows learn from them."""

from __future__ import annotations

import pytest
import torch
from specframe_training.distill import DistillConfig, distillation_batch, greedy_rollouts
from specframe_training.forward import TrainingForward
from specframe_training.objectives import IGNORE, AnyOrderObjective, BlockDiffusionObjective

from specframe import compose
from specframe.models import load_model
from specframe.testing.models import NEMOTRON, write_random_checkpoint


def test_rollouts_are_exactly_the_decoders_greedy_ar_output(tmp_path):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "model", seed=7, tokenizer=False)
    model = load_model(folder, dtype="float64")
    forward = TrainingForward(model.network, dtype=torch.float64)
    generator = torch.Generator().manual_seed(2)
    prefixes = torch.randint(200, 400, (3, 5), generator=generator)  # clear of the special ids (no early EOS)
    rollouts = greedy_rollouts(forward, prefixes, 7)
    assert torch.equal(rollouts[:, :5], prefixes)
    decoder = compose({"model": model, "schedule": "ar", "max_new_tokens": 7})
    for prefix, rollout in zip(prefixes, rollouts, strict=True):
        expected = decoder.generate(prompt_ids=prefix.tolist()).output_ids
        assert rollout[5 : 5 + len(expected)].tolist() == expected and len(expected) >= 1


def test_rollout_tokens_carry_no_next_token_loss_and_blocks_are_unchanged():
    objective = BlockDiffusionObjective(mask_id=3)
    windows = torch.randint(10, 60, (4, 24), generator=torch.Generator().manual_seed(1))
    plain = objective.batch(windows, torch.Generator().manual_seed(5))
    batch = distillation_batch(objective, windows, 10, torch.Generator().manual_seed(5))
    length = windows.shape[1]
    clean, blocks = batch.targets[:, :length], batch.targets[:, length:]
    assert torch.equal(clean[:, :9], plain.targets[:, :9])  # next tokens inside the real prefix: unchanged
    assert (clean[:, 9:] == IGNORE).all()  # the row before the rollout predicts a generated token: no AR loss
    assert torch.equal(blocks, plain.targets[:, length:])  # every drafting target, rollout included, kept
    assert (blocks[:, 10:] != IGNORE).any()
    assert torch.equal(batch.mask, plain.mask) and torch.equal(batch.input_ids, plain.input_ids)


def test_distillation_needs_the_block_diffusion_objective_and_valid_settings():
    with pytest.raises(TypeError, match="block-diffusion"):
        distillation_batch(AnyOrderObjective(mask_id=3), torch.zeros(1, 8, dtype=torch.long), 4, torch.Generator())
    with pytest.raises(ValueError, match="distill.prefix must be >= 1"):
        DistillConfig(prefix=0)
    with pytest.raises(ValueError, match="distill.lr must be > 0"):
        DistillConfig(lr=0.0)
