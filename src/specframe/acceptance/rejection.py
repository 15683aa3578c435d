"""Speculative rejection sampling: exact sampling from the verifier's (warped) distribution.

A draft token ``d`` drawn from the stored proposal ``q`` is accepted with probability ``min(1, p(d)/q(d))``
where ``p`` is the verifier's distribution at that rank; at the first rejection a correction is drawn from
the normalised residual ``max(p - q, 0)``; after a full accept a bonus token is drawn from the next rank's
``p``. Temperature, top-k and top-p are applied identically to ``p`` and ``q``. ``q`` is the distribution the
token was actually drawn from, even when it was computed from an older prefix (Packed-SS drafts one call
ahead): that is what keeps the output distribution exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specframe.acceptance.base import AcceptanceRule, DraftRef, Proposals, Verdict, chain_tokens, first_false
from specframe.hookspecs import hookimpl


class SamplingWarp:
    """Temperature, top-k and top-p, applied the same way to verifier and drafter logits.

    Args:
        temperature: Softmax temperature, > 0.
        top_k: Keep only the ``top_k`` most likely tokens (``None`` or 0: all).
        top_p: Keep the smallest set of most likely tokens whose mass reaches ``top_p`` (``None`` or 1: all).
    """

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
        self.temperature = float(temperature)
        self.top_k = int(top_k) if top_k else None
        self.top_p = float(top_p) if top_p is not None and top_p < 1.0 else None

    @property
    def truncates(self) -> bool:
        """Whether the warped distributions have zero entries (and are stored sparsely)."""
        return self.top_k is not None or self.top_p is not None

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Dense warped distributions ``[k, V]`` (float32, or float64 for float64 logits)."""
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        scaled = logits.to(dtype) / self.temperature
        if self.top_k is not None and self.top_k < scaled.shape[-1]:
            # Tokens tied with the k-th largest logit are all kept, so the truncation is a function of the
            # logits alone (no dependence on how a kernel breaks ties).
            kth = torch.topk(scaled, self.top_k, dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if self.top_p is not None:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
            mass_before = sorted_probs.cumsum(-1) - sorted_probs
            keep_sorted = mass_before < self.top_p  # the token that crosses top_p is kept
            keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
            probs = probs.masked_fill(~keep, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs


class RejectionSampling(AcceptanceRule):
    """Exact speculative sampling with stored proposal distributions.

    Args:
        temperature: Softmax temperature, > 0.
        top_k: Optional top-k truncation.
        top_p: Optional nucleus truncation.
    """

    stochastic = True

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
        self.warp = SamplingWarp(temperature, top_k, top_p)

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> Proposals:
        """Sample one token per row from the warped drafter distribution and store that distribution."""
        probs = self.warp.probs(logits)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        scores = probs.gather(-1, tokens[:, None]).squeeze(-1)
        if not self.warp.truncates:
            return Proposals(tokens=tokens, scores=scores, probs=probs)
        width = int((probs > 0).sum(-1).max())
        values, ids = torch.topk(probs, width, dim=-1)
        return Proposals(tokens=tokens, scores=scores, probs=values, ids=ids)

    def verify(self, drafts: Sequence[DraftRef], logits: torch.Tensor, generator: torch.Generator | None) -> Verdict:
        """Accept with ``min(1, p/q)``; correct from ``max(p - q, 0)``; bonus from ``p`` after a full accept."""
        target = self.warp.probs(logits)
        kappa = len(drafts)
        accepted = 0
        proposal = None
        if kappa:
            tokens = chain_tokens(drafts, target.device)
            proposal = _stack_proposals(drafts, target.shape[-1]).to(target.dtype)
            p = target[:kappa].gather(-1, tokens[:, None]).squeeze(-1)
            q = proposal.gather(-1, tokens[:, None]).squeeze(-1)
            uniforms = torch.rand(kappa, generator=generator, device=target.device, dtype=target.dtype)
            accepted = first_false(uniforms * q < p)  # u < p/q without dividing (q > 0 for drawn tokens)
        if accepted < kappa:
            residual = (target[accepted] - proposal[accepted]).clamp_min(0.0)
            total = residual.sum()
            # A rejection implies p(d) < q(d), so the residual has positive mass; guard rounding anyway.
            dist = residual / total if float(total) > 0 else target[accepted]
            token = int(torch.multinomial(dist, 1, generator=generator))
        elif accepted < target.shape[0]:
            token = int(torch.multinomial(target[accepted], 1, generator=generator))
        else:
            token = None
        return Verdict(accepted=accepted, token=token, scores=target.amax(-1))

    def describe(self) -> dict[str, object]:
        """Name and sampling options."""
        return {
            "name": "rejection",
            "temperature": self.warp.temperature,
            "top_k": self.warp.top_k,
            "top_p": self.warp.top_p,
        }


def _stack_proposals(drafts: Sequence[DraftRef], vocab_size: int) -> torch.Tensor:
    """Dense ``[kappa, V]`` proposal distributions of a chain, gathering rows batch by batch."""
    rows: list[torch.Tensor] = []
    start = 0
    while start < len(drafts):
        batch = drafts[start].proposals
        stop = start
        while stop < len(drafts) and drafts[stop].proposals is batch:
            stop += 1
        index = torch.tensor([d.row for d in drafts[start:stop]], device=batch.tokens.device)
        rows.append(batch.dense(index, vocab_size))
        start = stop
    return torch.cat(rows) if len(rows) > 1 else rows[0]


def make_rejection(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> RejectionSampling:
    """Factory for the ``rejection`` rule with validated options.

    Raises:
        ValueError: For a non-positive temperature, a negative top_k or a top_p outside (0, 1].
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(
            f"temperature must be a number > 0 for rejection sampling, got {temperature!r}; "
            "for temperature 0 use the 'greedy' rule"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"top_k must be a non-negative integer (0 = no truncation), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
    return RejectionSampling(temperature, top_k, top_p)


@hookimpl
def register_acceptance_rules(register):
    """Register the ``rejection`` acceptance rule."""
    register("rejection", make_rejection)
