"""Proof, not luck: with specframe's kernels a verified position's logits are bitwise plain AR's at that position.

Three levels, in float32, bfloat16 and the GGUF block formats, on both bundled families:

* the model: any call that holds a request's next tokens in order, with any other rows (drafts, masks, junk)
  interleaved and hidden from them, gives those tokens' rows exactly the logits one-row AR calls give;
* a batch: several requests' calls in one ``forward_many`` give each request exactly its logits alone;
* the decoder: every row any schedule evaluates whose context (the tokens it sees, in cache order) a plain AR
  run also evaluated gets the same bits, and every verified position is such a row; outputs are AR's.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe import compose, kernels
from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.models.cache import KVCache
from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"no kernels: {kernels.unavailable_reason()}")

DTYPES = [("float32", None), ("bfloat16", None), ("float32", "q8_0"), ("bfloat16", "q4_1"), ("float32", "q4_0")]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bitwise")
    return {
        # the drafting rows run adapters on o_proj and down_proj
        NEMOTRON: write_random_checkpoint(
            NEMOTRON, root / "n", seed=11, lora_rank=4, lora_mlp_rank=3, logit_scale=0.05
        ),
        SETDLM: write_random_checkpoint(SETDLM, root / "s", seed=12, logit_scale=0.05),
    }


_loaded: dict = {}


def _model(folders, family: str, dtype: str, quant: str | None):
    key = (family, dtype, quant)
    if key not in _loaded:
        _loaded[key] = load_model(folders[family], dtype=dtype, quant=quant, adapter=family == NEMOTRON or None)
    return _loaded[key]


def _causal(rows: int) -> torch.Tensor:
    return torch.ones(rows, rows, dtype=torch.bool).tril()


def _prefilled(model, tokens: torch.Tensor, length: int) -> KVCache:
    cache = model.new_cache(160)
    model.forward(cache, ModelCall(tokens[:length], torch.arange(length), _causal(length)))
    cache.commit(list(range(length)), list(range(length)))
    return cache


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
@pytest.mark.parametrize(("dtype", "quant"), DTYPES)
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_next_tokens_among_any_other_rows_get_one_row_ar_logits_bitwise(folders, family, dtype, quant, seed):
    model = _model(folders, family, dtype, quant)
    rng = random.Random(seed)
    total, prompt = 36, rng.randint(1, 12)
    tokens = torch.randint(0, model.vocab_size, (total,), generator=torch.Generator().manual_seed(seed))
    cache, ar = _prefilled(model, tokens, prompt), {}
    for p in range(prompt, total):
        ar[p] = model.forward(cache, ModelCall(tokens[p : p + 1], torch.tensor([p]), _causal(1)))[0]
        cache.commit([0], [p])
    cache, at = _prefilled(model, tokens, prompt), prompt
    while at < total:
        count, junk = rng.randint(1, min(16, total - at)), rng.randint(0, 12)
        slots = sorted(rng.sample(range(count + junk), count))  # the real rows in order, junk between
        offset = [-1] * (count + junk)
        for k, slot in enumerate(slots):
            offset[slot] = k
        rows = len(offset)
        ids = torch.tensor([int(tokens[at + k]) if k >= 0 else rng.randrange(model.vocab_size) for k in offset])
        positions = torch.tensor([at + k if k >= 0 else at + rng.randrange(count + 2) for k in offset])
        attention = torch.rand(rows, rows, generator=torch.Generator().manual_seed(seed + at)) < 0.6
        attention |= torch.eye(rows, dtype=torch.bool)
        for i, k in enumerate(offset):
            if k >= 0:  # a real row sees exactly the real rows up to itself
                attention[i] = torch.tensor([0 <= j <= k for j in offset])
        adapter = torch.tensor([k < 0 and rng.random() < 0.5 for k in offset])
        logits = model.forward(cache, ModelCall(ids, positions, attention, adapter_rows=adapter))
        for i, k in enumerate(offset):
            if k >= 0:
                assert torch.equal(logits[i], ar[at + k]), (at + k, rows)
        cache.commit(slots, [at + k for k in range(count)])
        at += count


@pytest.mark.parametrize(("dtype", "quant"), DTYPES)
def test_a_batch_gives_each_request_its_logits_alone_bitwise(folders, dtype, quant):
    model = _model(folders, NEMOTRON, dtype, quant)
    generator = torch.Generator().manual_seed(4)
    requests = []
    for cached, rows in ((7, 1), (0, 5), (12, 9), (3, 2), (20, 17), (9, 1)):
        ids = torch.randint(0, model.vocab_size, (cached + rows,), generator=generator)
        cache = model.new_cache(cached + rows + 1)
        if cached:
            model.forward(cache, ModelCall(ids[:cached], torch.arange(cached), _causal(cached)))
            cache.commit(list(range(cached)))
        attention = (torch.rand(rows, rows, generator=generator) < 0.5) | torch.eye(rows, dtype=torch.bool)
        call = ModelCall(ids[cached:], torch.arange(cached, cached + rows), attention)
        requests.append((cache, call))
    alone = []
    for cache, call in requests:
        alone.append(model.forward(cache, call))
        cache.staged = 0
    together = model.forward_many(requests)
    for one, batched in zip(alone, together, strict=True):
        assert torch.equal(one, batched)


# -- the decoder: every schedule's verifier rows against a plain AR run --------------------------------------
@contextmanager
def _recorded(model) -> Iterator[dict]:
    """Record the logits of every row the model evaluates, keyed by what the row sees.

    A row's context is the (position, token, adapter) of every cached and new row it attends to, in the order
    the kernel reduces over them (cache order, then call order), plus its own: equal contexts must give equal
    logits. Cache contents are followed through ``KVCache.commit``.
    """
    seen: dict[tuple, torch.Tensor] = {}
    contents: dict[int, list] = {}
    pending: dict[int, list] = {}
    forward_many, commit = model.forward_many, KVCache.commit

    def record(batch):
        results = forward_many(batch)
        for (cache, call), logits in zip(batch, results, strict=True):
            rows = call.input_ids.shape[0]
            adapter = call.adapter_rows if call.adapter_rows is not None else torch.zeros(rows, dtype=torch.bool)
            rows_of = zip(call.position_ids.tolist(), call.input_ids.tolist(), adapter.tolist(), strict=True)
            new = [(p, t, bool(a)) for p, t, a in rows_of]
            pending[id(cache)] = new
            if cache.length == 0:  # a new request's cache (ids of freed caches are reused)
                contents[id(cache)] = []
            cached = tuple(contents.get(id(cache), ()))
            out = range(rows) if call.output_rows is None else call.output_rows.tolist()
            for index, row in enumerate(out):
                visible = cached + tuple(new[j] for j in range(rows) if call.attention[row, j])
                seen.setdefault((visible, new[row]), logits[index].clone())
        return results

    def tracked_commit(self, rows, positions=None):
        new = pending.get(id(self), [])
        contents.setdefault(id(self), []).extend(new[r] for r in rows)
        return commit(self, rows, positions)

    model.forward_many = record
    model.forward = lambda cache, call: record([(cache, call)])[0]
    KVCache.commit = tracked_commit
    try:
        yield seen
    finally:
        del model.forward_many, model.forward
        KVCache.commit = commit


SCHEDULES = [("linear", 3), ("quadratic", 4), ("packed", 2), ("packed", 7), ("packed", 16), ("kbranch", 4)]


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
@pytest.mark.parametrize(("dtype", "quant"), [("bfloat16", None), ("float32", "q4_1")])
def test_every_schedule_verifies_with_ar_logits_bitwise_and_outputs_ar(folders, family, dtype, quant):
    model = _model(folders, family, dtype, quant)
    prompts = [[5, 9, 2, 7], [1, 3], [4, 4, 8, 15, 16, 23, 42, 3]]
    base = {"model": model, "max_new_tokens": 24, "acceptance": "greedy", "cost": {"tau": 0.01, "delta": 0.0}}
    with _recorded(model) as ar_rows:
        reference = [compose({**base, "schedule": "ar"}).generate(prompt_ids=p).output_ids for p in prompts]
    ar_logits = dict(ar_rows)
    for schedule, width in SCHEDULES:
        with _recorded(model) as rows:
            outputs = [
                compose({**base, "schedule": schedule, "width": width}).generate(prompt_ids=p).output_ids
                for p in prompts
            ]
        assert outputs == reference, (schedule, width)
        shared = [key for key in rows if key in ar_logits]
        # each output token was chosen from a row of its schedule's run that an AR run also evaluated
        assert len(shared) >= sum(len(o) for o in reference), (schedule, width, len(shared))
        for key in shared:
            assert torch.equal(rows[key], ar_logits[key]), (schedule, width, key[1])


def test_beside_block_quantized_weights_the_adapters_run_in_bfloat16_on_drafting_rows_only(folders):
    """A 4-bit model's adapters stream in bfloat16 (half the bytes); unmarked rows still never run them."""
    model = _model(folders, NEMOTRON, "float32", "q4_0")
    plain = load_model(folders[NEMOTRON], dtype="float32", quant="q4_0")
    ids = torch.randint(0, model.vocab_size, (6,), generator=torch.Generator().manual_seed(3))
    marked = torch.tensor([False, False, False, True, True, True])
    call = ModelCall(ids, torch.arange(6), _causal(6), adapter_rows=marked)
    logits = model.forward(model.new_cache(8), call)
    base = plain.forward(plain.new_cache(8), call)
    layers = model.inference.weights.layers
    assert {t.dtype for layer in layers for adapter in layer.adapters() for t in adapter[:2]} == {torch.bfloat16}
    assert torch.equal(logits[~marked], base[~marked])
    assert not torch.allclose(logits[marked], base[marked])  # the adapters do run on drafting rows
    dense = _model(folders, NEMOTRON, "float32", None)  # beside float32 weights they stay float32
    dense.forward(dense.new_cache(8), call)
    assert {t.dtype for layer in dense.inference.weights.layers for a in layer.adapters() for t in a[:2]} == {
        torch.float32
    }
