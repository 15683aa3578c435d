"""The chunked row selections and the candidate nucleus equal their full-vocabulary references exactly; op budget."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from decoding_helpers import NEMOTRON, eos_ids, tiny_model
from specframe import compose
from specframe.acceptance import nucleus, select
from specframe.acceptance.nucleus import Nucleus, nucleus_candidates, nucleus_sorted
from specframe.acceptance.rejection import SamplingWarp
from specframe.acceptance.select import chunked_first_argmax, first_argmax, host_first_argmax, kth_largest

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
        expected = values.max(dim=-1).indices
        assert torch.equal(first_argmax(values), expected)
        assert torch.equal(chunked_first_argmax(values), expected)
        assert host_first_argmax(values) == expected.tolist()
    transposed = torch.randn(vocab, rows).t()  # not contiguous: the plain path
    assert torch.equal(first_argmax(transposed), transposed.max(dim=-1).indices)
    assert torch.equal(chunked_first_argmax(transposed), transposed.max(dim=-1).indices)


def test_numpy_argmax_matches_torch_on_nan_and_infinite_rows():
    values = torch.zeros(4, 64)
    values[1, [5, 9]] = 1.0
    values[2, [7, 3]] = float("nan")
    values[3] = float("-inf")
    values = torch.cat([values, values.half().float()])
    for tensor in (values, values.double(), values.half()):
        expected = tensor.max(dim=-1).indices
        assert host_first_argmax(tensor) == expected.tolist() == [0, 5, 3, 0] * 2
        assert torch.equal(first_argmax(tensor), expected)
    assert host_first_argmax(values.bfloat16()) is None  # numpy has no bfloat16: the torch path
    assert host_first_argmax(values.requires_grad_()) is None


def test_the_chunked_paths_are_the_ones_tested(monkeypatch):
    """The shapes above do reach the chunked code (a threshold change must not silently skip it)."""
    seen = Counter()
    gather = torch.Tensor.gather

    def counted(self, *args, **kwargs):
        seen["gather"] += 1
        return gather(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "gather", counted)
    chunked_first_argmax(torch.randn(2, 131072))
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


def _nucleus_inputs(seed):
    """``[17, 2048]`` probabilities: smooth, peaked, heavily tied (ties at the cut), with -inf, with a top-k."""
    generator = torch.Generator().manual_seed(seed)
    yield torch.softmax(torch.randn(17, 2048, generator=generator), -1)
    yield torch.softmax(torch.randn(17, 2048, generator=generator) * 6, -1)
    tied = torch.randint(-4, 4, (17, 2048), generator=generator).double()
    tied[0, :100] = 9.0  # 100 equal leaders: the cut falls inside a tie that spans past 64 candidates
    tied[1, 3::50] = 8.0  # 41 tied leaders spread over the row: ties at the 32nd candidate
    yield torch.softmax(tied, -1)
    spiky = torch.full((17, 2048), float("-inf"))
    spiky[:, ::97] = torch.randn(17, 22, generator=generator)
    spiky[3, :] = float("-inf")
    spiky[3, 11] = 0.0  # one finite logit: a single token of mass 1
    yield torch.softmax(spiky, -1)  # fewer non-zero tokens than candidates: all the rest are exact zeros
    yield SamplingWarp(1.0, 20).probs(torch.randn(17, 2048, generator=generator) * 2)


@pytest.mark.parametrize("top_p", [1e-6, 0.3, 0.9, 0.999999])
def test_candidate_nucleus_is_bitwise_the_full_sort(top_p):
    """Every candidate count gives exactly the full sort's result, whether the rows are decided or fall back."""
    fallbacks = 0
    for seed, probs in enumerate(_nucleus_inputs(int(top_p * 1000))):
        for dtype in (torch.float32, torch.float64):
            probs = probs.to(dtype)
            expected = nucleus_sorted(probs, top_p)
            for candidates in (1, 32, 64, 300):
                got, undecided = nucleus_candidates(probs, top_p, candidates)
                fallbacks += undecided
                assert torch.equal(got, expected), (seed, dtype, candidates)
    assert fallbacks  # some rows did take the full sort


def test_nucleus_decides_or_falls_back_where_it_must():
    """Decided rows skip the full sort; a tie across the last candidate and a cut past them do not."""
    probs = torch.softmax(torch.tensor([[5.0, 4.0, 3.0, 1.0, 1.0, 1.0, 1.0, 0.0]] * 3), -1)
    probs[1] = torch.softmax(torch.tensor([3.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0]), -1)  # tie over the 4th
    probs[2] = torch.full((8,), 1 / 8)  # a flat row: at top_p 0.9 the cut lies past 4 candidates
    got, undecided = nucleus_candidates(probs, 0.9, 4)
    assert undecided == 2
    assert torch.equal(got, nucleus_sorted(probs, 0.9))
    _, undecided = nucleus_candidates(probs[:1], 0.9, 4)
    assert undecided == 0
    # Among the tied tokens at the cut the lowest indices are kept, as the stable sort keeps them.
    tied = torch.tensor([[0.1, 0.3, 0.1, 0.3, 0.1, 0.1, 0.0, 0.0]])
    got, undecided = nucleus_candidates(tied, 0.65, 7)
    assert undecided == 0 and (got > 0).tolist() == [[True, True, False, True, False, False, False, False]]
    assert torch.equal(got, nucleus_sorted(tied, 0.65))


def test_nucleus_grows_its_candidates_to_the_cap(monkeypatch):
    """Wide nuclei double the candidate count up to its cap; the result is the full sort's either way."""
    flat = torch.softmax(torch.randn(17, 2048, generator=torch.Generator().manual_seed(1)) * 0.1, -1)
    rule = Nucleus(0.9)
    assert rule.candidates == nucleus.DEFAULT_CANDIDATES and Nucleus(0.9, top_k=20).candidates == 21
    for _ in range(6):
        assert torch.equal(rule(flat), nucleus_sorted(flat, 0.9))
    assert rule.candidates == 2048 * nucleus.MAX_CANDIDATE_SHARE
    wide = Nucleus(0.9, top_k=1500)  # more candidates than the cap: the full sort directly
    calls = []
    monkeypatch.setattr(nucleus, "nucleus_candidates", lambda *a: calls.append(a))
    assert torch.equal(wide(flat), nucleus_sorted(flat, 0.9)) and not calls


def test_top_p_warp_is_the_full_sort_after_top_k():
    """The warp's top-p is the full-sort reference applied to its top-k softmax, over several calls."""
    generator = torch.Generator().manual_seed(7)
    for top_k in (None, 20, 400):
        warp, plain = SamplingWarp(0.8, top_k, 0.9), SamplingWarp(0.8, top_k)
        for _ in range(4):
            logits = torch.randn(17, 2048, generator=generator) * 3
            logits[0, :50] = 6.0
            assert torch.equal(warp.probs(logits), nucleus_sorted(plain.probs(logits), 0.9))


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
    [
        ("ar", "greedy", 2),
        ("packed", "greedy", 2),
        ("ar", {"name": "rejection", "top_k": 20}, 4),
        ("packed", {"name": "rejection", "top_k": 20}, 8),
        ("ar", {"name": "rejection", "top_p": 0.9}, 5),
        ("packed", {"name": "rejection", "top_p": 0.9}, 8),
    ],
)
def test_host_ops_per_call_stay_within_budget(nemotron, schedule, acceptance, budget):
    """Torch ops the decoder runs per call outside the model (each costs several µs of dispatch on a CPU).

    Greedy argmax and top-k / top-p sampling run on the host (numpy), leaving the ids' wrapping, one ``rand``
    and, for a top-p without top-k, the softmax.

    Counts, not times: the model's forward is replaced by fixed logits, so only the host path is counted.
    Steady state: templates are built by a first request, the count is taken over a second one.
    """
    decoder = compose(
        {"model": nemotron, "schedule": schedule, "acceptance": acceptance, "max_new_tokens": 48}
        | {"width": "auto" if schedule == "ar" else 8}  # ar takes no width
    )
    generator = torch.Generator().manual_seed(0)
    logits = [torch.randn(rows, nemotron.vocab_size, generator=generator) for rows in range(64)]

    def forward(cache, call):
        cache.reserve(call.input_ids.shape[0])
        return logits[call.input_ids.shape[0] if call.output_rows is None else call.output_rows.shape[0]]

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
