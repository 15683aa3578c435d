"""The host top-k path: the same distributions as the dense warp, the dense path where it cannot decide."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specframe.acceptance import hostsample, nucleus
from specframe.acceptance.base import DraftRef
from specframe.acceptance.rejection import RejectionSampling, SamplingWarp


def _dense(candidates, vocab):
    dense = np.zeros((candidates.ids.shape[0], vocab), dtype=candidates.probs.dtype)
    np.put_along_axis(dense, candidates.ids, candidates.probs, 1)
    return torch.from_numpy(dense)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 1, None), (1.0, 20, None), (0.7, 5, None), (0.8, 20, 0.6)]
)
def test_candidates_are_the_dense_warp(dtype, temperature, top_k, top_p):
    generator = torch.Generator().manual_seed(top_k)
    logits = (torch.randn(17, 300, generator=generator) * 3).to(dtype)
    candidates = hostsample.top_k_candidates(logits, top_k, temperature, top_p)
    assert candidates is not None and candidates.ids.shape[0] == 17
    assert candidates.ids.shape[1] == top_k if top_p is None else candidates.ids.shape[1] <= top_k
    dense = _dense(candidates, 300)
    expected = SamplingWarp(temperature, top_k, top_p).probs(logits)
    assert torch.equal(dense > 0, expected > 0)  # the same kept tokens
    tolerance = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(dense, expected, rtol=tolerance, atol=tolerance)


def test_the_dense_path_serves_what_the_host_cannot_decide():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    assert hostsample.top_k_candidates(logits, 4) is not None
    tied = logits.clone()
    tied[1, :5] = 10.0  # five tokens tied at the top: a top-4 keeps all five
    assert hostsample.top_k_candidates(tied, 4) is None
    assert SamplingWarp(1.0, 4).probs(tied)[1].count_nonzero() == 5
    with_nan = logits.clone()
    with_nan[2, 7] = float("nan")
    assert hostsample.top_k_candidates(with_nan, 4) is None
    assert hostsample.top_k_candidates(logits.bfloat16(), 4) is None
    assert hostsample.top_k_candidates(logits, 49) is None  # no (k + 1)-th to compare with
    assert hostsample.top_k_candidates(logits, hostsample.MAX_TOP_K + 1) is None


def test_draw_follows_the_candidates_and_never_a_zero_weight():
    ids = np.array([[7, 3, 9, 4]] * 20_000)
    probs = np.array([[0.5, 0.0, 0.3, 0.2]] * 20_000)
    uniforms = torch.rand(20_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64).numpy()
    tokens, chosen = hostsample.draw(ids, probs, uniforms)
    counts = [(tokens == t).sum() for t in (7, 3, 9, 4)]
    assert counts[1] == 0
    assert stats.chisquare([counts[0], counts[2], counts[3]], [10_000, 6_000, 4_000]).pvalue > 1e-4
    weight = {7: 0.5, 3: 0.0, 9: 0.3, 4: 0.2}
    assert chosen.tolist() == [weight[t] for t in tokens.tolist()]
    single = [hostsample.draw_one(ids[0], probs[0], u) for u in uniforms[:50]]
    assert single == tokens[:50].tolist()


def test_rule_methods_take_the_host_path_and_its_proposals_verify_densely(monkeypatch):
    """propose / verify / propose_and_verify use the host path on CPU logits; its sparse proposals are read by
    the dense path too (a later call that falls back), giving the same acceptance probabilities."""
    rule = RejectionSampling(1.0, 3)
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    proposals = rule.propose(logits[3:], generator)
    assert proposals.ids is not None and proposals.ids.shape == (3, 3)
    drafts = [DraftRef(proposals, i) for i in range(3)]
    tokens = torch.tensor(proposals.token_list)
    # the draft's q, read sparsely by the host path and densely by the dense one
    chain = hostsample.host_chain(drafts)
    dense_q = proposals.dense(slice(0, 3), 40)
    sparse_q = (chain[2] * (chain[1] == chain[0][:, None])).sum(1)
    assert np.allclose(sparse_q, dense_q.gather(1, tokens[:, None])[:, 0].numpy())
    verdict = rule.verify(drafts, logits[:4], generator)
    assert 0 <= verdict.accepted <= 3
    monkeypatch.setattr(hostsample, "top_k_candidates", lambda *a, **k: None)
    dense_verdict = rule.verify(drafts, logits[:4], generator)  # the dense path, on sparse proposals
    assert 0 <= dense_verdict.accepted <= 3


# -- the host nucleus (top-p without top-k) ------------------------------------------------------------------------
def _nucleus_rows(seed):
    """``[17, 2048]`` probabilities: smooth, peaked, flat, tied at the cut, with exact zeros, after a top-k."""
    generator = torch.Generator().manual_seed(seed)
    yield torch.softmax(torch.randn(17, 2048, generator=generator), -1)
    yield torch.softmax(torch.randn(17, 2048, generator=generator) * 6, -1)
    yield torch.softmax(torch.randn(17, 2048, generator=generator) * 0.05, -1)  # nuclei of ~1800 tokens
    tied = torch.randint(-4, 4, (17, 2048), generator=generator).double()
    tied[0, :100] = 9.0  # 100 equal leaders: the cut falls inside a tie
    tied[1, 3::50] = 8.0  # 41 tied leaders spread over the row
    yield torch.softmax(tied, -1)
    spiky = torch.full((17, 2048), float("-inf"))
    spiky[:, ::97] = torch.randn(17, 22, generator=generator)
    spiky[3, :] = float("-inf")
    spiky[3, 11] = 0.0  # a single token of mass 1
    yield torch.softmax(spiky, -1)
    yield SamplingWarp(1.0, 20).probs(torch.randn(17, 2048, generator=generator) * 2)


def _dense_nucleus(probs, top_p):
    ids, kept = nucleus.host_nucleus(probs.numpy(), top_p)
    assert all(len(set(row)) == len(row) for row in ids.tolist())  # distinct ids: a row scatters densely
    dense = np.zeros(probs.shape, dtype=kept.dtype)
    np.put_along_axis(dense, ids, kept, 1)
    return torch.from_numpy(dense)


@pytest.mark.parametrize("top_p", [1e-6, 0.3, 0.9, 0.999999])
@pytest.mark.parametrize(("prefix", "head"), [(128, 512), (3, 7), (1, 1)])
def test_host_nucleus_keeps_exactly_the_full_sorts_tokens(monkeypatch, top_p, prefix, head):
    """The host nucleus keeps the reference's tokens with their values, bit for bit: ties at the cut, cuts past
    the first prefix and past the sorted head (small sizes make every row take them), float32 and float64."""
    monkeypatch.setattr(nucleus, "HOST_PREFIX", prefix)
    monkeypatch.setattr(nucleus, "HOST_HEAD", head)
    for seed, probs in enumerate(_nucleus_rows(int(top_p * 1000))):
        for dtype in (torch.float32, torch.float64):
            probs = probs.to(dtype)
            reference = nucleus.nucleus_sorted(probs, top_p)
            expected = torch.where(reference > 0, probs, 0.0)  # the reference's kept values, before renormalising
            assert torch.equal(_dense_nucleus(probs, top_p), expected), (seed, dtype)


def test_host_nucleus_cuts_where_the_mass_before_reaches_top_p():
    """A token is kept while the mass before it is < top_p (float32 sums, as torch's): equal mass stops it."""
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]])  # sums exact in binary
    for top_p, kept in [(0.75, 2), (0.7500001, 3), (0.5, 1), (0.50000006, 2), (0.875, 3), (0.8750001, 4)]:
        ids, values = nucleus.host_nucleus(probs.numpy(), top_p)
        assert int((values > 0).sum()) == kept, top_p
        assert torch.equal(_dense_nucleus(probs, top_p) > 0, nucleus.nucleus_sorted(probs, top_p) > 0), top_p
    # among tokens tied at the cut the lowest ids are kept, wherever they lie in the row
    tied = torch.tensor([[0.1, 0.3, 0.1, 0.3, 0.1, 0.1, 0.0, 0.0]])
    ids, values = nucleus.host_nucleus(tied.numpy(), 0.65)
    assert ids[0, :3].tolist() == [1, 3, 0] and (values[0] > 0).sum() == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_top_p_candidates_are_the_dense_warp(dtype):
    generator = torch.Generator().manual_seed(3)
    logits = (torch.randn(17, 2048, generator=generator) * 3).to(dtype)
    logits[4, :30] = 7.0  # a tie across the cut
    logits[5, 100:] = float("-inf")  # zeros past 100 tokens
    warp = SamplingWarp(0.8, top_p=0.9)
    candidates = hostsample.top_p_candidates(warp.softmax(logits), 0.9)
    expected = warp.probs(logits)
    dense = _dense(candidates, 2048)
    assert torch.equal(dense > 0, expected > 0)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(dense, expected, rtol=tolerance, atol=tolerance)
    widths = (candidates.probs > 0).sum(1)
    assert candidates.ids.shape[1] == widths.max() and widths.min() < widths.max()  # narrow rows are padded
    # a NaN row (NaN or infinite logits) leaves the call to the dense path
    for bad in (float("nan"), float("inf")):
        broken = logits.clone()
        broken[2, 9] = bad
        assert hostsample.top_p_candidates(warp.softmax(broken), 0.9) is None
    assert hostsample.top_p_candidates(warp.softmax(logits).bfloat16(), 0.9) is None


def test_the_rule_takes_the_host_nucleus_on_cpu(monkeypatch):
    """A top-p without top-k is served by the host path: sparse proposals, host verification; and a chain of
    proposals of different widths (each call's nucleus has its own) is verified as their dense forms are."""
    rule = RejectionSampling(1.0, top_p=0.8)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(5)) * 2
    logits[6:] *= 3  # narrower nuclei in the second batch
    first, second = rule.propose(logits[3:6], generator), rule.propose(logits[6:], generator)
    assert first.ids is not None and second.ids is not None and first.ids.shape[1] != second.ids.shape[1]
    drafts = [DraftRef(first, 0), DraftRef(first, 1), DraftRef(second, 0)]
    tokens, ids, probs = hostsample.host_chain(drafts)
    dense = torch.cat([first.dense(slice(0, 2), 300), second.dense(slice(0, 1), 300)])
    for row, token in enumerate(tokens.tolist()):
        q = dense[row].numpy()
        assert hostsample._lookup(ids[row], probs[row], np.array([token, 7, 299]))[0] == q[token]
        np.testing.assert_array_equal(hostsample._lookup(ids[row], probs[row], np.arange(300)), q)
    calls = []
    monkeypatch.setattr(hostsample, "step", lambda *a: calls.append(a) or (None, None))
    rule.verify(drafts, logits[:4], generator)
    assert len(calls) == 1
