"""Plausible sampling bugs, planted on purpose: the sampling suite must reject every one of them.

:class:`ReferenceRejection` is a plain, loop-based speculative rejection sampler written against the public
:class:`~specframe.acceptance.base.AcceptanceRule` interface only (so it does not change when the production
rule is optimised); each ``bug`` switches on one mistake. The schedules below plant bookkeeping mistakes in
otherwise correct built-in schedules, again through public helpers only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specframe.acceptance.base import AcceptanceRule, DraftRef, Proposals, Verdict
from specframe.acceptance.rejection import SamplingWarp
from specframe.schedules.base import planned_chain, propose, store_drafts
from specframe.schedules.packed import PackedSchedule
from specframe.schedules.quadratic import QuadraticSchedule

RULE_BUGS = ("none", "unnormalised-residual", "residual-without-positive-part", "top-k-drafter-only", "seed-reuse")


class ReferenceRejection(AcceptanceRule):
    """Speculative rejection sampling, one rank at a time, with an optional planted bug.

    Drafts are drawn by inverse CDF: row ``i``'s token is where a uniform ``u_i`` falls in the cumulative
    proposal distribution (the uniforms are kept with the proposals, for the ``seed-reuse`` bug).

    Args:
        temperature: Softmax temperature.
        top_k: Top-k truncation of both distributions (the drafter's only, under ``top-k-drafter-only``).
        bug: One of :data:`RULE_BUGS`:

            * ``unnormalised-residual``: the correction is drawn by inverse CDF from ``max(p - q, 0)`` without
              dividing by its mass; a uniform beyond the mass falls back to the last token with residual;
            * ``residual-without-positive-part``: the correction is drawn from ``|p - q|``;
            * ``top-k-drafter-only``: top-k truncates the proposals but not the verifier's distribution;
            * ``seed-reuse``: a draft is accepted or rejected with the same random number it was drawn with
              (what reusing one seed for drafting and verification amounts to), instead of a fresh one.
    """

    stochastic = True

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, bug: str = "none") -> None:
        assert bug in RULE_BUGS, bug
        self.bug = bug
        self.draft_warp = SamplingWarp(temperature, top_k)
        self.verify_warp = SamplingWarp(temperature, None if bug == "top-k-drafter-only" else top_k)

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> Proposals:
        """Sample from the warped drafter distribution by inverse CDF and keep it (dense)."""
        probs = self.draft_warp.probs(logits)
        cdf = probs.cumsum(-1)
        uniforms = torch.rand(probs.shape[0], generator=generator, dtype=probs.dtype) * cdf[:, -1]
        tokens = torch.searchsorted(cdf, uniforms[:, None], right=True).squeeze(-1)
        proposals = Proposals(tokens=tokens, scores=probs.gather(-1, tokens[:, None]).squeeze(-1), probs=probs)
        proposals.draw_uniforms = uniforms.tolist()
        return proposals

    def verify(self, drafts: Sequence[DraftRef], logits: torch.Tensor, generator: torch.Generator | None) -> Verdict:
        """Accept each draft with ``min(1, p/q)``; correct at the first rejection; bonus after a full accept."""
        target = self.verify_warp.probs(logits)
        vocab = target.shape[-1]
        for rank, draft in enumerate(drafts):
            p = target[rank]
            q = draft.proposals.dense(torch.tensor([draft.row]), vocab)[0].to(p.dtype)
            token = draft.token
            if self.bug == "seed-reuse":
                u = draft.proposals.draw_uniforms[draft.row]
            else:
                u = float(torch.rand((), generator=generator, dtype=p.dtype))
            if u * float(q[token]) < float(p[token]):
                continue
            return Verdict(rank, self._correction(p, q, generator), target.amax(-1))
        if len(drafts) < target.shape[0]:
            bonus = int(torch.multinomial(target[len(drafts)], 1, generator=generator))
            return Verdict(len(drafts), bonus, target.amax(-1))
        return Verdict(len(drafts), None, target.amax(-1))

    def _correction(self, p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None) -> int:
        if self.bug == "residual-without-positive-part":
            residual = (p - q).abs()
            return int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        residual = (p - q).clamp_min(0.0)
        if self.bug == "unnormalised-residual":
            u = float(torch.rand((), generator=generator, dtype=p.dtype))
            cdf = residual.cumsum(0)
            index = int(torch.searchsorted(cdf, torch.tensor(u, dtype=p.dtype), right=True))
            return index if index < len(cdf) else int(torch.nonzero(residual).max())
        return int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


class OtherGroupsProposalBug(QuadraticSchedule):
    """Quadratic-SS that stores the kept branch's draft tokens with a neighbouring branch's proposals.

    Where the neighbouring draft group also targets a position, the token drawn from the kept group is stored
    with the neighbour's distribution at that position (which was computed from another context).
    """

    def update(self, state, plan, result):
        verdict = self._verify(state, plan, result)
        outcome = verdict.accepted + (1 if verdict.token is not None else 0)
        branch = outcome - 1
        proposals = propose(state, result.draft_logits[branch])
        neighbour = branch + 1 if branch + 1 < len(plan.drafts) else branch - 1
        if proposals is not None and neighbour >= 0:
            other = propose(state, result.draft_logits[neighbour])
            if other is not None:
                vocab = result.draft_logits[branch].shape[-1]
                proposals = _swap_rows(
                    proposals, plan.drafts[branch].targets, other, plan.drafts[neighbour].targets, vocab
                )
        store_drafts(state, plan.drafts[branch].targets, proposals)
        return verdict

    @staticmethod
    def _verify(state, plan, result):
        chain = planned_chain(state, plan)
        return state.ctx.rule.verify(chain, result.verify_logits, state.ctx.generator)


class StaleProposalBug(PackedSchedule):
    """Packed-SS that verifies each draft against the newest prefix's proposal, not the one it was drawn from."""

    def update(self, state, plan, result):
        chain = planned_chain(state, plan)
        targets = plan.drafts[0].targets
        fresh = propose(state, result.draft_logits[0])
        vocab = result.draft_logits[0].shape[-1]
        swapped = tuple(
            DraftRef(_swap_rows(d.proposals, (p,), fresh, targets, vocab, only_row=d.row), d.row)
            for d, p in zip(chain, plan.chain_positions, strict=True)
        )
        verdict = state.ctx.rule.verify(swapped, result.verify_logits, state.ctx.generator)
        store_drafts(state, targets, fresh)
        return verdict


def _swap_rows(
    mine: Proposals,
    my_targets: Sequence[int],
    other: Proposals,
    other_targets: Sequence[int],
    vocab: int,
    *,
    only_row: int | None = None,
) -> Proposals:
    """``mine`` with the distribution at each shared target replaced by ``other``'s at that position."""
    dense = mine.dense(torch.arange(len(mine.tokens)), vocab).clone()
    other_dense = other.dense(torch.arange(len(other.tokens)), vocab)
    for i, position in enumerate(my_targets):
        if position in other_targets:
            row = i if only_row is None else only_row
            dense[row] = other_dense[list(other_targets).index(position)].to(dense.dtype)
    return Proposals(tokens=mine.tokens, scores=dense.gather(-1, mine.tokens[:, None]).squeeze(-1), probs=dense)
