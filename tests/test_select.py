"""The chunked row selections equal torch's plain reductions exactly, and the decoder's per-call op budget."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from decoding_helpers import NEMOTRON, eos_ids, tiny_model
from specframe import compose
from specframe.acceptance import select
from specframe.acceptance.rejection import SamplingWarp
from specframe.acceptance.select import first_argmax, kth_largest

SHAPES = [(17, 2048), (9, 4096), (3, 24), (1, 2048), (40, 1024), (5, 3000), (3, 16384), (2, 131072)]


def _inputs(rows, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    yield torch.randn(rows, vocab, generator=generator)
    # Few distinct values: ties at the maximum and at the k-th largest everywhere.
    yield torch.randint(-3, 3, (rows, vocab), generator=generator).double()
    spiky = torch.full((rows, vocab), float("-inf"))
    spiky[:, :: max(vocab // 7, 1)] = torch.randn(rows, len(range(0, vocab, max(vocab // 7, 1))), generator=generator)
    yield spiky  # fewer finite entries than k in a row: the k-th largest is -inf


@pytest.mark.parametrize(("rows", "vocab"), SHAPES)
def test_kth_largest_equals_topk(rows, vocab):
    for values in _inputs(rows, vocab, seed=rows * vocab):
        for k in (1, 2, 20, 50):
            if k <= vocab:
                expected = torch.topk(values, k, dim=-1).values[:, -1:]
                assert torch.equal(kth_largest(values, k), expected), (values.dtype, k)


@pytest.mark.parametrize(("rows", "vocab"), SHAPES)
def test_first_argmax_equals_max_indices_ties_included(rows, vocab):
    for values in _inputs(rows, vocab, seed=rows + vocab):
        assert torch.equal(first_argmax(values), values.max(dim=-1).indices)
    transposed = torch.randn(vocab, rows).t()  # not contiguous: the plain path
    assert torch.equal(first_argmax(transposed), transposed.max(dim=-1).indices)


def test_the_chunked_paths_are_the_ones_tested(monkeypatch):
    """The shapes above do reach the chunked code (a threshold change must not silently skip it)."""
    seen = Counter()
    gather = torch.Tensor.gather

    def counted(self, *args, **kwargs):
        seen["gather"] += 1
        return gather(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "gather", counted)
    first_argmax(torch.randn(2, 131072))
    kth_largest(torch.randn(17, 2048), 20)
    assert seen["gather"] == 2
    assert select.CHUNKED_ARGMAX_MIN_VOCAB <= 131072 and select.CHUNKED_TOPK_MIN <= 17 * 2048


def _reference_warp(logits, temperature, top_k):
    scaled = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32) / temperature
    kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
    return torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), dim=-1)


@pytest.mark.parametrize("top_k", [1, 3, 20])
def test_top_k_warp_is_bitwise_the_masked_softmax(top_k):
    """The arithmetic top-k mask gives exactly the probabilities of masking with -inf, ties and infinities kept."""
    generator = torch.Generator().manual_seed(top_k)
    logits = torch.randn(17, 2048, generator=generator) * 4
    logits[0, :40] = 2.5  # a tie across the k-th largest
    logits[1, 5] = float("inf")
    logits[2, :] = float("-inf")
    logits[2, 7] = 1.0
    for dtype in (torch.float32, torch.float64):
        for temperature in (1.0, 0.7):
            got = SamplingWarp(temperature, top_k).probs(logits.to(dtype))
            expected = _reference_warp(logits.to(dtype), temperature, top_k)
            assert torch.equal(got.isnan(), expected.isnan())
            assert torch.equal(got.nan_to_num(), expected.nan_to_num())


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory):
    return tiny_model(NEMOTRON, tmp_path_factory.mktemp("select") / "m", vocab=4096, seed=5)


@pytest.mark.parametrize(
    ("schedule", "acceptance", "budget"),
    [("ar", "greedy", 5), ("packed", "greedy", 13), ("packed", {"name": "rejection", "top_k": 20}, 56)],
)
def test_host_ops_per_call_stay_within_budget(nemotron, schedule, acceptance, budget):
    """Torch ops the decoder runs per call outside the model (each costs several µs of dispatch on a CPU).

    Counts, not times: the model's forward is replaced by fixed logits, so only the host path is counted.
    Steady state: templates are built by a first request, the count is taken over a second one.
    """
    decoder = compose(
        {"model": nemotron, "schedule": schedule, "width": 8, "acceptance": acceptance, "max_new_tokens": 48}
    )
    generator = torch.Generator().manual_seed(0)
    logits = [torch.randn(rows, nemotron.vocab_size, generator=generator) for rows in range(64)]

    def forward(cache, input_ids, position_ids, attention, output_rows=None, adapter_rows=None):
        cache.reserve(input_ids.shape[0])
        return logits[input_ids.shape[0] if output_rows is None else output_rows.shape[0]]

    nemotron.forward = forward
    try:
        with eos_ids(nemotron, ()):
            decoder.generate(prompt_ids=[3, 5, 7, 9])
            with _OpCounter() as counter:
                result = decoder.generate(prompt_ids=[3, 5, 7, 9])
    finally:
        del nemotron.forward
    per_call = sum(counter.ops.values()) / result.metrics.nfe
    assert per_call <= budget, counter.ops.most_common(12)
