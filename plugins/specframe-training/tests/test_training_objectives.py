"""The training objectives' layouts, and the training forward against the inference forward."""

from __future__ import annotations

import torch
from specframe_training.forward import TrainingForward
from specframe_training.objectives import IGNORE, AnyOrderObjective, BlockDiffusionObjective, batch_losses

from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint

MASK = 7


def windows(size=3, length=40, seed=0):
    return torch.randint(10, 50, (size, length), generator=torch.Generator().manual_seed(seed))


def test_block_diffusion_layout():
    tokens = windows()
    size, length = tokens.shape
    objective = BlockDiffusionObjective(mask_id=MASK, min_block=2, max_block=9)
    batch = objective.batch(tokens, torch.Generator().manual_seed(1))
    assert batch.input_ids.shape == (size, 2 * length)
    assert torch.equal(batch.position_ids[:, :length], batch.position_ids[:, length:])
    clean, blocks = batch.mask[:, :length], batch.mask[:, length:]
    # clean rows: causal, never see block rows
    assert torch.equal(clean[:, :, :length], torch.ones(length, length, dtype=torch.bool).tril().expand(size, -1, -1))
    assert not clean[:, :, length:].any()
    for b in range(size):
        within = blocks[b, :, length:]
        for i in range(length):
            members = within[i].nonzero().flatten()
            start, end = int(members.min()), int(members.max()) + 1
            assert torch.equal(members, torch.arange(start, end))  # a contiguous block, bidirectional
            assert 1 <= end - start <= 9
            assert torch.equal(blocks[b, i, :length].nonzero().flatten(), torch.arange(start))  # the clean prefix
        noisy = batch.input_ids[b, length:]
        masked = noisy == MASK
        assert masked.any()
        assert torch.equal(noisy[~masked], tokens[b][~masked])
        assert torch.equal(batch.targets[b, length:][masked], tokens[b][masked])
        assert (batch.targets[b, length:][~masked] == IGNORE).all()
        assert torch.equal(batch.targets[b, : length - 1], tokens[b, 1:])  # next-token targets
    seeds = [
        bool(batch.input_ids[b, length + i] != MASK)
        for b in range(size)
        for i in range(length)
        if i == 0 or not torch.equal(blocks[b, i, length:], blocks[b, i - 1, length:])
    ]
    assert any(seeds) and not all(seeds)  # blocks with a clean seed and seedless blocks both occur


def test_any_order_layout():
    tokens = windows()
    size, length = tokens.shape
    objective = AnyOrderObjective(mask_id=MASK, span=6, ltr_prob=0.0, draft_prob=0.5, max_lag=4)
    generator = torch.Generator().manual_seed(2)
    ranks = objective.ranks(size, length, torch.Generator().manual_seed(2))
    batch = objective.batch(tokens, generator)
    assert (batch.input_ids[:, length:] == MASK).all()
    assert torch.equal(batch.targets[:, length:], tokens)
    assert (batch.targets[:, :length] == IGNORE).all()
    for b in range(size):
        assert sorted(ranks[b].tolist()) == list(range(length))
        assert (ranks[b] - torch.arange(length)).abs().max() < 6  # local shuffling only
        for i in range(length):
            seen = batch.mask[b, i, :length].nonzero().flatten()
            assert set(seen.tolist()) == {j for j in range(length) if ranks[b, j] <= ranks[b, i]}
            query = batch.mask[b, length + i]
            assert query[length:].nonzero().flatten().tolist() == [i]  # a mask sees only itself
            visible = query[:length].nonzero().flatten().tolist()
            lag = ranks[b, i] - max((int(ranks[b, j]) for j in visible), default=-1) - 1
            assert all(ranks[b, j] < ranks[b, i] for j in visible)
            assert visible == sorted(j for j in range(length) if ranks[b, j] < ranks[b, i] - lag)
            if visible:
                assert int(batch.kinds[b, length + i]) == int(lag > 0)


def test_any_order_heldout_is_left_to_right():
    tokens = windows(size=1, length=12)
    batch = AnyOrderObjective(mask_id=MASK).heldout(tokens)
    queries = batch.mask[0, 12:, :12]
    assert torch.equal(queries, torch.ones(12, 12, dtype=torch.bool).tril(-1))


def test_losses_split_by_term():
    tokens = windows(size=2, length=16)
    batch = BlockDiffusionObjective(mask_id=MASK).batch(tokens, torch.Generator().manual_seed(0))
    rows = int(batch.loss_rows.sum())
    logits = torch.zeros(rows, 64)
    total, terms = batch_losses(logits, batch)
    assert set(terms) == {"ar", "diffusion"}
    assert abs(float(total) - 2 * torch.log(torch.tensor(64.0)).item()) < 1e-5


def test_training_forward_equals_inference_forward(tmp_path):
    for family in (NEMOTRON, SETDLM):
        folder = write_random_checkpoint(family, tmp_path / family, seed=3, tokenizer=False)
        model = load_model(folder, dtype="float64")
        network = model.network
        forward = TrainingForward(network, dtype=torch.float64)
        ids = torch.randint(0, 400, (12,), generator=torch.Generator().manual_seed(4))
        positions = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8])
        attention = torch.ones(12, 12, dtype=torch.bool).tril()
        attention[8:, 5:8] = False
        attention[8:, 8:] = True  # a bidirectional block over the causal prefix 0..4
        expected = model.forward(model.new_cache(16), ModelCall(ids, positions, attention))
        got = forward.logits(ids[None], positions[None], attention[None])[0]
        if family == SETDLM:
            got[:, model.mask_token_id] = expected[:, model.mask_token_id]
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
        selected = torch.zeros(1, 12, dtype=torch.bool)
        selected[0, [2, 9]] = True
        rows = forward.logits(ids[None], positions[None], attention[None], selected)
        torch.testing.assert_close(rows[:, :5], got[[2, 9], :5])


def test_loops_train_the_drafter_only():
    tokens = windows(size=8, length=64, seed=5)
    objective = BlockDiffusionObjective(mask_id=MASK, repeat_prob=1.0, max_period=5)
    batch = objective.batch(tokens, torch.Generator().manual_seed(3))
    clean = batch.input_ids[:, :64]
    for b in range(8):
        ignored = (batch.targets[b, :63] == IGNORE).nonzero().flatten()
        prefix = int(ignored.min()) + 1  # the first row whose next token is a loop token
        assert 8 <= prefix <= 32
        assert torch.equal(clean[b, :prefix], tokens[b, :prefix])
        period = next(p for p in range(2, 6) if torch.equal(clean[b, prefix:], clean[b, prefix - p : 64 - p]))
        assert torch.equal(clean[b, prefix - period : prefix], tokens[b, prefix - period : prefix])
        assert torch.equal(batch.targets[b, : prefix - 1], tokens[b, 1:prefix])
        masked = batch.input_ids[b, 64:] == MASK
        assert torch.equal(batch.targets[b, 64:][masked], clean[b][masked])  # the drafter learns the loop
    assert torch.equal(BlockDiffusionObjective(mask_id=MASK).batch(tokens, torch.Generator()).input_ids[:, :64], tokens)
