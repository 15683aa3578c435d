"""The layers as one operator call (``specframe_kernels::decode_layers``) give the step's own loop bit for bit.

The eager step runs a model's layers through :class:`~specframe.models.forward.LayerProgram` whenever the
invariant kernels run every projection; the loop of single operators stays for what the program does not
take (per-head q/k norms, compiled graphs). Both must give the same logits and write the same cache rows,
alone, in a batch, on a paged cache, with drafting rows on the adapters, in every dtype the kernels run.
"""

from __future__ import annotations

import pytest
import torch

from specframe import kernels
from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.models.forward import LayerProgram
from specframe.models.paged import BlockPool
from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"no kernels: {kernels.unavailable_reason()}")

DTYPES = [("float32", None), ("bfloat16", None), ("float32", "q8_0"), ("bfloat16", "q4_1"), ("float32", "q4_0")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("program")
    return write_random_checkpoint(NEMOTRON, root / "n", seed=31, lora_rank=4, lora_mlp_rank=3, logit_scale=0.05)


def _ready(model):
    """The model's weights after the first call's refresh (the adapters are attached by then)."""
    model.forward(model.new_cache(2), ModelCall(torch.tensor([1]), torch.tensor([0]), torch.ones(1, 1, dtype=bool)))
    return model.inference.weights


def _call(rows: int, start: int, seed: int, adapted: bool = True) -> ModelCall:
    generator = torch.Generator().manual_seed(seed)
    attention = torch.ones(rows, rows, dtype=torch.bool).tril()
    attention |= torch.rand(rows, rows, generator=generator) < 0.3
    attention.fill_diagonal_(True)
    marked = torch.rand(rows, generator=generator) < 0.5 if adapted else None
    ids = torch.randint(0, 30, (rows,), generator=generator)
    return ModelCall(ids, torch.arange(start, start + rows), attention, adapter_rows=marked)


def _both(weights, run, monkeypatch):
    """``run()`` with the layer program, then with the step's loop (the program taken away).

    Every call of the first run must have gone through the program (else the comparison would say nothing).
    """
    ran, original = [], LayerProgram.run

    def spy(self, *args):
        out = original(self, *args)
        ran.append(out is not None)
        return out

    program = weights.program
    with monkeypatch.context() as patched:
        patched.setattr(LayerProgram, "run", spy)
        with_program = run()
    assert ran and all(ran), "the program did not run every call"
    try:
        weights.program = None
        return with_program, run()
    finally:
        weights.program = program


@pytest.mark.parametrize(("dtype", "quant"), DTYPES)
def test_one_request_gets_the_loops_logits_and_cache_rows(folder, dtype, quant, monkeypatch):
    model = load_model(folder, dtype=dtype, quant=quant, adapter=True)
    weights = _ready(model)
    assert weights.program is not None
    for seed, (cached, rows) in enumerate(((0, 7), (5, 1), (11, 4))):

        def run(cached=cached, rows=rows, seed=seed):
            cache = model.new_cache(cached + rows)
            if cached:
                model.forward(cache, _call(cached, 0, seed + 100, adapted=False))
                cache.commit(list(range(cached)))
            logits = model.forward(cache, _call(rows, cached, seed))
            return logits, cache.keys[:, : cached + rows].clone(), cache.values[:, : cached + rows].clone()

        (logits, keys, values), (loop_logits, loop_keys, loop_values) = _both(weights, run, monkeypatch)
        assert torch.equal(logits, loop_logits), (cached, rows)
        assert torch.equal(keys, loop_keys) and torch.equal(values, loop_values)


@pytest.mark.parametrize(("dtype", "quant"), [("float32", None), ("bfloat16", "q4_1")])
def test_a_batch_gets_the_loops_logits(folder, dtype, quant, monkeypatch):
    model = load_model(folder, dtype=dtype, quant=quant, adapter=True)
    weights = _ready(model)

    def run():
        requests = []
        for seed, (cached, rows) in enumerate(((3, 1), (0, 6), (9, 3))):
            cache = model.new_cache(cached + rows)
            if cached:
                model.forward(cache, _call(cached, 0, seed + 50, adapted=False))
                cache.commit(list(range(cached)))
            requests.append((cache, _call(rows, cached, seed)))
        return model.forward_many(requests)

    for program, loop in zip(*_both(weights, run, monkeypatch), strict=True):
        assert torch.equal(program, loop)


def test_a_paged_cache_gets_the_loops_logits(folder, monkeypatch):
    model = load_model(folder, dtype="float32", quant="q4_1", adapter=True)
    weights = _ready(model)

    def run():
        pool = BlockPool.for_model(model, blocks=30, block_size=4)
        pool.new_cache(6)  # this request's blocks start mid-pool
        cache, start, out = pool.new_cache(40), 0, []
        for step, rows in enumerate((7, 1, 5)):
            out.append(model.forward(cache, _call(rows, start, step)))
            cache.commit(list(range(rows)), list(range(start, start + rows)))
            start += rows
        return out

    for program, loop in zip(*_both(weights, run, monkeypatch), strict=True):
        assert torch.equal(program, loop)


def test_per_head_qk_norms_run_in_the_program_with_the_loops_bits(tmp_path, monkeypatch):
    """The SetDLM/Qwen3 block normalises each q and k head before RoPE; the program does it in the same place."""
    folder = write_random_checkpoint(SETDLM, tmp_path / "s", seed=3, logit_scale=0.05)
    for dtype in ("float32", "bfloat16"):
        model = load_model(folder, dtype=dtype)
        weights = _ready(model)
        assert weights.layers[0].qk_norm is not None and weights.program is not None

        def run(model=model):
            cache = model.new_cache(12)
            first = model.forward(cache, _call(5, 0, 7, adapted=False))
            cache.commit(list(range(5)))
            return first, model.forward(cache, _call(3, 5, 8, adapted=False))

        for program, loop in zip(*_both(weights, run, monkeypatch), strict=True):
            assert torch.equal(program, loop), dtype


def test_torch_kernels_keep_the_loop(tmp_path):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "n", seed=4)
    torch_kernels = load_model(folder, dtype="float64")
    assert not torch_kernels.inference.weights.invariant and torch_kernels.inference.weights.program is None
