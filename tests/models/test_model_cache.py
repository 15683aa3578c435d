"""The KV cache makes incremental evaluation equal to recomputation (float64, both families)."""

from __future__ import annotations

import torch
from zoo_helpers import causal, run

ATOL = 1e-10


def _prompt(model, length: int) -> list[int]:
    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(0, model.vocab_size, (length,), generator=generator)
    return [i for i in ids.tolist() if i != model.mask_token_id][: length - 1] + [3]


def test_incremental_decoding_equals_full_recomputation(model64):
    tokens = _prompt(model64, 24)
    full = run(model64, model64.new_cache(32), tokens, range(len(tokens)), causal(len(tokens)))
    cache = model64.new_cache(len(tokens))  # a fixed capacity: room for every row
    first = run(model64, cache, tokens[:10], range(10), causal(10))
    torch.testing.assert_close(first, full[:10], rtol=0, atol=ATOL)
    cache.commit(list(range(10)), positions=range(10))
    for i in range(10, len(tokens)):
        step = run(model64, cache, [tokens[i]], [i], causal(1))
        torch.testing.assert_close(step[0], full[i], rtol=0, atol=ATOL)
        cache.commit([0], positions=[i])
    assert cache.length == len(tokens)


def test_output_rows_select_rows(model64):
    tokens = _prompt(model64, 12)
    all_rows = run(model64, model64.new_cache(16), tokens, range(12), causal(12))
    some = run(model64, model64.new_cache(16), tokens, range(12), causal(12), output_rows=torch.tensor([11, 2, 5]))
    torch.testing.assert_close(some, all_rows[[11, 2, 5]], rtol=0, atol=ATOL)


def test_scattered_commit_equals_recomputing_only_those_rows(model64):
    """Stage clean rows interleaved with mask rows, keep only the clean ones, and compare with a cache built
    from the clean rows alone (the clean rows never attend to the mask rows, as in SetDLM's layout)."""
    prefix = _prompt(model64, 8)
    clean = [17, 42, 99]
    clean_positions = [11, 8, 9]  # any order: verified positions need not be contiguous or sorted
    mask = model64.mask_token_id
    staged_ids = [clean[0], mask, clean[1], mask, mask, clean[2]]
    staged_positions = [11, 10, 8, 12, 9, 9]
    kept = [0, 2, 5]
    attention = torch.zeros(6, 6, dtype=torch.bool)
    for i, row in enumerate(kept):  # clean rows: causal among clean rows, in staging order
        attention[row, kept[: i + 1]] = True
    for row in (1, 3, 4):  # mask rows: earlier clean rows and themselves
        attention[row, [k for k in kept if k < row] + [row]] = True

    cache = model64.new_cache(16)
    run(model64, cache, prefix, range(8), causal(8))
    cache.commit(list(range(8)))
    run(model64, cache, staged_ids, staged_positions, attention)
    cache.commit(kept, positions=clean_positions)

    fresh = model64.new_cache(16)
    run(model64, fresh, prefix + clean, list(range(8)) + clean_positions, causal(11))
    fresh.commit(list(range(11)))

    probe_ids, probe_positions = [mask, mask, 5], [10, 12, 10]
    probe_attention = torch.eye(3, dtype=torch.bool)
    after_commit = run(model64, cache, probe_ids, probe_positions, probe_attention)
    recomputed = run(model64, fresh, probe_ids, probe_positions, probe_attention)
    torch.testing.assert_close(after_commit, recomputed, rtol=0, atol=ATOL)


def test_mask_block_sees_the_same_prefix_cached_or_recomputed(model64):
    """A diffusion-style block of MASK rows attending to a prefix: cached prefix == prefix in the same call."""
    prefix = _prompt(model64, 9)
    block = [model64.mask_token_id] * 4
    block_positions = list(range(9, 13))

    cache = model64.new_cache(16)
    run(model64, cache, prefix, range(9), causal(9))
    cache.commit(list(range(9)))
    cached = run(model64, cache, block, block_positions, torch.ones(4, 4, dtype=torch.bool))

    attention = torch.zeros(13, 13, dtype=torch.bool)
    attention[:9, :9] = causal(9)
    attention[9:, :] = True  # the block sees the whole prefix and itself, bidirectionally
    together = run(model64, model64.new_cache(16), prefix + block, list(range(13)), attention)
    torch.testing.assert_close(cached, together[9:], rtol=0, atol=ATOL)


def test_rejected_rows_leave_no_trace(model64):
    tokens = _prompt(model64, 10)
    cache = model64.new_cache(16)
    run(model64, cache, tokens[:6], range(6), causal(6))
    cache.commit(list(range(6)))
    run(model64, cache, [7, 8, 9], [6, 7, 8], causal(3))  # staged, then dropped (no commit)
    again = run(model64, cache, tokens[6:], range(6, 10), causal(4))
    full = run(model64, model64.new_cache(16), tokens, range(10), causal(10))
    torch.testing.assert_close(again, full[6:], rtol=0, atol=ATOL)
