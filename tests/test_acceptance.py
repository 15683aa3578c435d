"""Acceptance rules in isolation: greedy matching, sampling warps, and rejection sampling's exactness."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specframe.acceptance.base import DraftRef, Proposals
from specframe.acceptance.greedy import GreedyAcceptance, make_greedy
from specframe.acceptance.rejection import RejectionSampling, SamplingWarp, make_rejection


def test_greedy_accepts_the_matching_prefix_and_adds_the_verifier_token():
    rule = GreedyAcceptance()
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])  # argmax 1, 0, 2
    drafts = rule.propose(torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0]]), None)  # tokens 1, 2
    refs = (DraftRef(drafts, 0), DraftRef(drafts, 1))
    verdict = rule.verify(refs, logits, None)
    assert verdict.accepted == 1 and verdict.token == 0  # draft 2 != argmax 0: corrected to 0
    full = rule.propose(torch.tensor([[0.0, 9.0, 0.0], [9.0, 0.0, 0.0]]), None)
    verdict = rule.verify((DraftRef(full, 0), DraftRef(full, 1)), logits, None)
    assert verdict.accepted == 2 and verdict.token == 2  # bonus from rank 3
    verdict = rule.verify((DraftRef(full, 0), DraftRef(full, 1)), logits[:2], None)
    assert verdict.accepted == 2 and verdict.token is None  # no rank left for a bonus


def test_greedy_breaks_ties_towards_the_lowest_id():
    rule = GreedyAcceptance()
    tied = torch.tensor([[1.0, 3.0, 3.0, 3.0]])
    assert rule.propose(tied, None).tokens.tolist() == [1]
    assert rule.verify((), tied, None).token == 1


def test_greedy_takes_no_options():
    with pytest.raises(TypeError, match="rejection"):
        make_greedy(temperature=1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0}, "temperature must be a number > 0"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("inf")}, "temperature must be a number > 0 and finite"),
        ({"temperature": float("nan")}, "temperature must be a number > 0 and finite"),
        ({"temperature": 1e-40}, r"temperature 1e-40 is too small .* use the 'greedy' rule"),
        ({"temperature": 1e-31}, r"temperature 1e-31 is too small .* smallest accepted is 1e-30"),
        ({"top_k": -3}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_rejection_validates_its_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_rejection(**kwargs)


def test_warp_temperature_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.2, 0.1]]))
    assert torch.allclose(SamplingWarp(1.0).probs(logits), torch.tensor([[0.5, 0.2, 0.2, 0.1]]))
    hot = SamplingWarp(2.0).probs(logits)
    assert torch.allclose(hot, torch.softmax(logits / 2, -1))
    # top-k keeps every token tied with the k-th
    assert (SamplingWarp(1.0, top_k=2).probs(logits) > 0).tolist() == [[True, True, True, False]]
    assert (SamplingWarp(1.0, top_k=1).probs(logits) > 0).tolist() == [[True, False, False, False]]
    # top-p keeps the smallest prefix reaching p (the crossing token included)
    assert (SamplingWarp(1.0, top_p=0.6).probs(logits) > 0).tolist() == [[True, True, False, False]]
    assert (SamplingWarp(1.0, top_p=0.5).probs(logits) > 0).tolist() == [[True, False, False, False]]
    nucleus = SamplingWarp(1.0, top_p=0.6).probs(logits)
    assert torch.allclose(nucleus.sum(-1), torch.ones(1))


def test_truncated_proposals_densify_exactly_from_dense_and_sparse_storage():
    rule = RejectionSampling(1.0, top_k=3)
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    proposals = rule.propose(logits, torch.Generator().manual_seed(1))
    dense = proposals.dense(torch.arange(5), 50)
    assert torch.allclose(dense, rule.warp.probs(logits))
    assert torch.equal(proposals.scores, dense.gather(1, proposals.tokens[:, None]).squeeze(1))
    # A rule may store truncated distributions sparsely (values and ids); they densify to the same rows.
    values, ids = torch.topk(dense, 3, dim=-1)
    sparse = Proposals(tokens=proposals.tokens, scores=proposals.scores, probs=values, ids=ids)
    rows = torch.tensor([4, 1])
    assert torch.equal(sparse.dense(rows, 50), dense[rows])


def _chisquare_pvalue(counts, probs):
    probs = np.asarray(probs, dtype=np.float64)
    return stats.chisquare(counts, probs / probs.sum() * counts.sum()).pvalue


def _first_token_distribution(rule, p_logits, q_probs, samples, seed):
    """Empirical distribution of the first emitted token when verifying one draft d ~ q against p."""
    generator = torch.Generator().manual_seed(seed)
    vocab = p_logits.shape[-1]
    counts = np.zeros(vocab)
    q_row = q_probs[None]
    for _ in range(samples):
        token = torch.multinomial(q_probs, 1, generator=generator)
        proposals = Proposals(tokens=token, scores=q_probs[token], probs=q_row)
        verdict = rule.verify((DraftRef(proposals, 0),), p_logits, generator)
        emitted = token.item() if verdict.accepted else verdict.token
        counts[emitted] += 1
    return counts


def test_rejection_sampling_emits_the_target_distribution():
    torch.manual_seed(0)
    p_logits = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0], [0.0] * 5])
    q = torch.tensor([0.05, 0.6, 0.2, 0.05, 0.1])  # a poor proposal
    counts = _first_token_distribution(RejectionSampling(1.0), p_logits, q, 6000, seed=3)
    assert _chisquare_pvalue(counts, torch.softmax(p_logits[0], -1).numpy()) > 1e-3


def test_rejection_sampling_without_the_positive_part_is_detected():
    """The statistical check above has power against a plausible bug: a residual p - q without max(., 0)."""

    class NoPositivePart(RejectionSampling):
        def verify(self, drafts, logits, generator):
            target = self.warp.probs(logits)
            token = drafts[0].token
            q = drafts[0].proposals.dense(torch.tensor([drafts[0].row]), target.shape[-1])[0]
            if torch.rand(1, generator=generator).item() * q[token] < target[0, token]:
                return type(super().verify(drafts, logits, generator))(1, None, target.amax(-1))
            residual = (target[0] - q).abs()  # bug: abs instead of the positive part
            pick = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
            return type(super().verify(drafts, logits, generator))(0, pick, target.amax(-1))

    p_logits = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0], [0.0] * 5])
    q = torch.tensor([0.05, 0.6, 0.2, 0.05, 0.1])
    counts = _first_token_distribution(NoPositivePart(1.0), p_logits, q, 6000, seed=3)
    assert _chisquare_pvalue(counts, torch.softmax(p_logits[0], -1).numpy()) < 1e-6


def test_rejection_with_truncated_warp_matches_the_truncated_target():
    p_logits = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0], [0.0] * 5])
    rule = RejectionSampling(0.7, top_k=3)
    q_logits = torch.tensor([[0.0, 2.0, 1.0, -1.0, 0.5]])
    generator = torch.Generator().manual_seed(11)
    counts = np.zeros(5)
    for _ in range(5000):
        proposals = rule.propose(q_logits, generator)
        verdict = rule.verify((DraftRef(proposals, 0),), p_logits, generator)
        counts[proposals.tokens.item() if verdict.accepted else verdict.token] += 1
    target = rule.warp.probs(p_logits)[0].numpy()
    assert counts[target == 0].sum() == 0
    keep = target > 0
    assert _chisquare_pvalue(counts[keep], target[keep]) > 1e-3


def test_rejection_is_reproducible_with_a_seed():
    rule = RejectionSampling(1.0)
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(5))
    a = rule.propose(logits, torch.Generator().manual_seed(9)).tokens
    b = rule.propose(logits, torch.Generator().manual_seed(9)).tokens
    assert torch.equal(a, b)


class _LastTokenWarp(SamplingWarp):
    """A warp of its own (all mass on the last id); its top_k is set, which the host shortcut would read."""

    def probs(self, logits):
        out = torch.zeros_like(logits, dtype=torch.float64 if logits.dtype == torch.float64 else torch.float32)
        out[..., -1] = 1.0
        return out


@pytest.mark.parametrize("top_k,top_p", [(2, None), (None, 0.5), (3, 0.9)])
def test_a_subclass_warp_that_overrides_probs_is_what_gets_sampled(top_k, top_p):
    rule = RejectionSampling()
    rule.warp = _LastTokenWarp(1.0, top_k, top_p)
    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0], [0.0, 4.0, 1.0, -2.0]])  # the built-in warps never pick id 3
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert rule.propose(logits, generator).token_list == [3, 3]
        drafts = rule.propose(logits[:1], generator)
        proposals, verdict = rule.propose_and_verify((DraftRef(drafts, 0),), logits.repeat(2, 1)[:3], 2, generator)
        assert (verdict.accepted, verdict.token) == (1, 3) and proposals.token_list == [3]
        assert rule.verify((), logits[:1], generator).token == 3
