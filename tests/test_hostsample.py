"""The host top-k path: the same distributions as the dense warp, the dense path where it cannot decide."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specframe.acceptance import hostsample
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
    assert candidates is not None and candidates.ids.shape == (17, top_k)
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
