"""The paged KV cache: blocks from one pool, attention reading them in place, bitwise a contiguous cache.

* the pool: blocks taken and given back, a request that can never fit or cannot fit now refused clearly;
* the cache: commits in any order and dropped positions leave exactly the rows a contiguous cache keeps;
* the model: a call against a paged cache (blocks scattered over the pool) gives bitwise the logits of the
  same call against a contiguous cache, with specframe's kernels (read in place) in float32, bfloat16 and
  q4_1, and with torch's (gathered) in float64;
* the engine core: requests decoded through a Batch whose caches are paged from a pool too small for all of
  them at once wait for free blocks, and each gives exactly its output alone.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe import batching, compose, kernels
from specframe.errors import InputError
from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.models.cache import KVCache
from specframe.models.paged import BlockPool
from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("paged")
    return {
        NEMOTRON: write_random_checkpoint(NEMOTRON, root / "n", seed=21, logit_scale=0.05),
        SETDLM: write_random_checkpoint(SETDLM, root / "s", seed=22, logit_scale=0.05),
    }


def test_the_pool_lends_blocks_and_takes_them_back():
    pool = BlockPool(2, 1, 4, blocks=6, block_size=4, dtype=torch.float32, device="cpu")
    first = pool.new_cache(9)  # 3 blocks
    assert pool.free_blocks == 3 and first.capacity == 9 and len(set(first.rows.tolist())) == 9
    assert pool.fits(12) and not pool.fits(13)
    with pytest.raises(InputError, match="has 3 free blocks and this request needs 4"):
        pool.new_cache(13)
    with pytest.raises(InputError, match="can never fit this pool of 6 blocks"):
        pool.new_cache(25)
    second = pool.new_cache(12)
    assert not set(first.rows.tolist()) & set(second.rows.tolist())
    pool.release(first)
    pool.release(first)  # once only
    assert pool.free_blocks == 3
    with pytest.raises(RuntimeError, match="given back"):
        first.reserve(1)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_commits_and_dropped_positions_keep_what_a_contiguous_cache_keeps(data):
    pool = BlockPool(2, 1, 3, blocks=14, block_size=3, dtype=torch.float64, device="cpu")
    pool.new_cache(7)  # another request's blocks first: this one's are not the pool's first
    paged, plain = pool.new_cache(30), KVCache(2, 1, 3, 30, torch.float64, "cpu")
    position = 0
    for _ in range(data.draw(st.integers(1, 5), label="calls")):
        rows = data.draw(st.integers(1, 5), label="rows")
        if plain.length + rows > 30:
            break
        keys, values = torch.randn(rows, 1, 3, dtype=torch.float64), torch.randn(rows, 1, 3, dtype=torch.float64)
        seen = []
        for cache in (paged, plain):
            cache.reserve(rows)
            seen.append([cache.write(layer, keys + layer, values - layer) for layer in range(2)])
        for (paged_keys, paged_values), (plain_keys, plain_values) in zip(*seen, strict=True):
            assert torch.equal(paged_keys, plain_keys) and torch.equal(paged_values, plain_values)
        kept = data.draw(st.permutations(range(rows)), label="order")[: data.draw(st.integers(0, rows))]
        positions = list(range(position, position + len(kept)))
        position += len(kept)
        for cache in (paged, plain):
            cache.commit(kept, positions)
        if position and data.draw(st.booleans(), label="drop"):
            dropped = set(data.draw(st.lists(st.integers(0, position - 1), max_size=3), label="dropped"))
            for cache in (paged, plain):
                cache.drop_positions(dropped)
        assert paged.length == plain.length and paged.positions == plain.positions
        rows_kept = paged.rows[: paged.length]
        assert torch.equal(paged.keys.index_select(1, rows_kept), plain.keys[:, : plain.length])
        assert torch.equal(paged.values.index_select(1, rows_kept), plain.values[:, : plain.length])


def _call(rows: int, start: int, seed: int) -> ModelCall:
    generator = torch.Generator().manual_seed(seed)
    attention = torch.ones(rows, rows, dtype=torch.bool).tril()
    attention |= torch.rand(rows, rows, generator=generator) < 0.3  # drafting rows see more than causal
    attention.fill_diagonal_(True)
    return ModelCall(torch.randint(0, 30, (rows,), generator=generator), torch.arange(start, start + rows), attention)


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
@pytest.mark.parametrize(
    ("dtype", "quant", "needs_kernels"),
    [("float32", None, True), ("bfloat16", None, True), ("float32", "q4_1", True), ("float64", None, False)],
)
def test_a_call_against_paged_blocks_gives_the_contiguous_caches_bits(folders, family, dtype, quant, needs_kernels):
    if needs_kernels and not kernels.available():
        pytest.skip(f"no kernels: {kernels.unavailable_reason()}")
    model = load_model(folders[family], dtype=dtype, quant=quant)
    pool = BlockPool.for_model(model, blocks=40, block_size=4)
    pool.new_cache(10)  # scatter: this request's blocks start mid-pool
    paged, plain = pool.new_cache(60), model.new_cache(60)
    start = 0
    for step, rows in enumerate((9, 1, 4, 7)):
        call = _call(rows, start, seed=step)
        outputs = [model.forward(cache, call) for cache in (paged, plain)]
        assert torch.equal(outputs[0], outputs[1]), (step, rows)
        kept = list(range(rows))[::2] if step % 2 else list(range(rows))  # drafts rejected: gaps committed over
        for cache in (paged, plain):
            cache.commit(kept, list(range(start, start + len(kept))))
        start += len(kept)


@pytest.mark.parametrize("schedule", ["ar", "packed", "quadratic"])
def test_a_batch_paged_from_a_small_pool_admits_by_free_blocks_and_changes_no_output(folders, schedule):
    model = load_model(folders[NEMOTRON], dtype="float64")
    config = {"model": model, "schedule": schedule, "max_new_tokens": 10, "cost": {"tau": 0.01, "delta": 0.001}}
    if schedule != "ar":
        config["width"] = 3
    decoder = compose(config)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12], [13, 14, 15]]
    alone = [compose(config).generate(prompt_ids=p, seed=i).output_ids for i, p in enumerate(prompts)]
    steppers = [decoder.stepper(prompt_ids=p, seed=i) for i, p in enumerate(prompts)]
    pool = BlockPool.for_model(model, blocks=2 * -(-max(s.capacity for s in steppers) // 4), block_size=4)
    active, most = set(), 0
    outputs = {}
    for progress in batching.run(steppers, max_batch=6, pool=pool):
        active.add(progress.key)
        most = max(most, len(active))
        if progress.generation is not None:
            outputs[progress.key] = progress.generation.output_ids
            active.discard(progress.key)
    assert [outputs[i] for i in range(len(prompts))] == alone
    assert most <= 2 < len(prompts)  # the pool held two requests' blocks at a time
    assert pool.free_blocks == pool.blocks  # every block given back


def test_a_request_no_pool_could_hold_is_refused_with_the_numbers(folders):
    model = load_model(folders[SETDLM], dtype="float64")
    decoder = compose({"model": model, "schedule": "packed", "width": 3, "max_new_tokens": 40})
    pool = BlockPool.for_model(model, blocks=3, block_size=4)
    with pytest.raises(InputError, match=r"needing \d+ KV rows \(\d+ blocks of 4\) can never fit this pool of 3"):
        list(batching.run([decoder.stepper(prompt_ids=[1, 2, 3])], max_batch=1, pool=pool))


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
@pytest.mark.parametrize(("dtype", "needs_kernels"), [("float32", True), ("bfloat16", True), ("float64", False)])
@pytest.mark.parametrize("schedule", ["ar", "packed", "quadratic"])
def test_a_prompt_prefilled_in_chunks_decodes_as_in_one_call(folders, family, dtype, needs_kernels, schedule):
    """Chunked prefill (a Batch's prefill_chunk): the prompt is cached a few rows per call first, through a
    paged cache too; the output and every verified logit are those of the whole prompt in one call."""
    if needs_kernels and not kernels.available():
        pytest.skip(f"no kernels: {kernels.unavailable_reason()}")
    model = load_model(folders[family], dtype=dtype)
    config = {"model": model, "schedule": schedule, "max_new_tokens": 8, "cost": {"tau": 0.01, "delta": 0.001}}
    if schedule != "ar":
        config["width"] = 3
    decoder = compose(config)
    prompts = [list(range(1, 12)), [5, 6, 7], list(range(20, 29))]
    whole = [compose(config).generate(prompt_ids=p).output_ids for p in prompts]
    pool = BlockPool.for_model(model, blocks=64, block_size=4)
    for paging in (None, pool):
        steppers = [decoder.stepper(prompt_ids=p) for p in prompts]
        batch = batching.Batch(paging, prefill_chunk=4)
        for index, stepper in enumerate(steppers):
            batch.add(index, stepper)
        while len(batch):
            assert all(progress.error is None for progress in batch.step())
        assert [s.result().output_ids for s in steppers] == whole
        metrics = steppers[0].result().metrics
        labels = [label for label, _ in metrics.choices]
        assert labels[:2] == ["prefill", "prefill"] and "prefill" not in labels[2:]  # 4 + 4 rows, then the rest
        assert metrics.rows_per_call[:2] == [4, 4] and metrics.prompt_calls == [0, 1, 2]
        assert metrics.rows_per_call_max == max(metrics.rows_per_call[3:], default=0)  # prompt calls aside
        assert steppers[1].result().metrics.choices[0][0] != "prefill"  # a short prompt: one call, as before


def test_a_batch_refuses_a_prefill_chunk_below_one():
    with pytest.raises(ValueError, match="prefill_chunk must be an integer >= 1 or None, got 0"):
        batching.Batch(prefill_chunk=0)
