"""Speculative rejection sampling: exact sampling from the verifier's (warped) distribution.

A draft token ``d`` drawn from the stored proposal ``q`` is accepted with probability ``min(1, p(d)/q(d))``
where ``p`` is the verifier's distribution at that rank; at the first rejection a correction is drawn from
the normalised residual ``max(p - q, 0)``; after a full accept a bonus token is drawn from the next rank's
``p``. Temperature, top-k and top-p are applied identically to ``p`` and ``q``. ``q`` is the distribution the
token was actually drawn from, even when it was computed from an older prefix (Packed-SS drafts one call
ahead): that is what keeps the output distribution exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specframe.acceptance import hostsample
from specframe.acceptance.base import AcceptanceRule, DraftRef, Proposals, Verdict, chain_rows, leading_true
from specframe.acceptance.nucleus import Nucleus
from specframe.acceptance.select import kth_largest
from specframe.hookspecs import hookimpl

#: The smallest temperature :func:`make_rejection` accepts. Logits divided by a temperature overflow float32 once
#: ``|logit| > 3.4e38 * temperature`` (the probabilities turn NaN and the sampled ids leave the vocabulary;
#: below about 1e-38 the temperature itself is not a normal float32). At this bound only logits beyond 3.4e8
#: would overflow, which no model gives, and a smaller temperature would pick the most likely token anyway.
MIN_TEMPERATURE = 1e-30

#: The smallest top-p the nucleus compares with. Probabilities are float32 (or float64), and a top-p below
#: float32's smallest subnormal (about 7e-46) rounds to 0 there: no token would be kept. Every top-p in
#: ``(0, MIN_TOP_P]`` keeps the same tokens (each row's most likely one: the mass before any later rank is at
#: least that token's probability, >= 1/V), so a smaller top-p is raised to it without changing the output.
MIN_TOP_P = 1e-30

#: Subtracted from the logits that top-k drops: their softmax weight underflows to exactly 0, as with -inf.
MASKED = 1e30


def _below(scaled: torch.Tensor, kth: torch.Tensor) -> torch.Tensor:
    """1 where ``scaled < kth``, else 0, in ``scaled``'s dtype.

    Arithmetic (``sign(max(kth - x, 0))``) instead of a comparison: on a CPU, ops with a boolean result
    and ``masked_fill`` run scalar loops, several times slower. ``nan_to_num`` keeps ``-inf`` logits under a
    ``-inf`` threshold (``-inf - -inf`` is NaN) where a comparison keeps them.
    """
    return (kth - scaled).clamp_min_(0).sign_().nan_to_num_(0.0)


class SamplingWarp:
    """Temperature, top-k and top-p, applied the same way to verifier and drafter logits.

    Args:
        temperature: Softmax temperature, > 0.
        top_k: Keep only the ``top_k`` most likely tokens (``None`` or 0: all).
        top_p: Keep the smallest set of most likely tokens whose mass reaches ``top_p`` (``None`` or 1: all); one
            below :data:`MIN_TOP_P` is compared as :data:`MIN_TOP_P`, which keeps the same tokens.
    """

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
        self.temperature = float(temperature)
        self.top_k = int(top_k) if top_k else None
        self.top_p = max(float(top_p), MIN_TOP_P) if top_p is not None and top_p < 1.0 else None
        self._nucleus = Nucleus(self.top_p, self.top_k) if self.top_p is not None else None

    @property
    def truncates(self) -> bool:
        """Whether the warped distributions have zero entries (and are stored sparsely)."""
        return self.top_k is not None or self.top_p is not None

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Dense warped distributions ``[k, V]`` (float32, or float64 for float64 logits)."""
        probs = self.softmax(logits)
        if self._nucleus is not None:
            probs = self._nucleus(probs)
        return probs

    def softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The warp before its top-p: temperature and top-k, then the softmax (as :meth:`probs`' dtype)."""
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        scaled = logits.to(dtype)
        if self.temperature != 1.0:
            scaled = scaled / self.temperature
        if self.top_k is not None and self.top_k < scaled.shape[-1]:
            # Tokens tied with the k-th largest logit are all kept, so the truncation is a function of the
            # logits alone (no dependence on how a kernel breaks ties).
            if scaled.dim() == 2:
                kth = kth_largest(scaled, self.top_k)
            else:
                kth = kth_largest(scaled.reshape(-1, scaled.shape[-1]), self.top_k).view(*scaled.shape[:-1], 1)
            scaled = scaled.sub(_below(scaled, kth), alpha=MASKED)
        return torch.softmax(scaled, dim=-1)


class RejectionSampling(AcceptanceRule):
    """Exact speculative sampling with stored proposal distributions.

    Args:
        temperature: Softmax temperature, > 0.
        top_k: Optional top-k truncation.
        top_p: Optional nucleus truncation.

    Attributes:
        warp: The :class:`SamplingWarp` whose ``probs`` turn verifier and drafter logits alike into the
            distributions sampled from. A subclass may replace it with a subclass of :class:`SamplingWarp`
            that overrides ``probs`` (a min-p warp, say): the output is then exactly AR sampling from those
            distributions, on every schedule. (The host shortcuts for top-k and top-p are taken only by a
            warp that does not override ``probs`` or ``softmax``.)
    """

    stochastic = True
    exact = True

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
        self.warp = SamplingWarp(temperature, top_k, top_p)

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> Proposals:
        """Sample one token per row from the warped drafter distribution and store that distribution.

        The distributions are stored densely (``[k, V]``): finding the width of a sparse copy would cost a
        host synchronisation per call. Top-k and top-p distributions of CPU logits are sampled on the host
        and stored as their candidates (:mod:`specframe.acceptance.hostsample`).
        """
        candidates = self._candidates(logits)
        if candidates is not None:
            return hostsample.step((), None, candidates, 0, generator)[0]
        return self._draw(self.warp.probs(logits), generator)

    def verify(self, drafts: Sequence[DraftRef], logits: torch.Tensor, generator: torch.Generator | None) -> Verdict:
        """Accept with ``min(1, p/q)``; correct from ``max(p - q, 0)``; bonus from ``p`` after a full accept.

        Everything runs on the device over the whole chain at once (one uniform per draft, one categorical
        draw); the verdict is read when the schedule needs it. Top-k and top-p distributions of CPU logits
        are verified on the host (:mod:`specframe.acceptance.hostsample`).
        """
        step = self._host_step(drafts, logits, logits.shape[0], generator)
        if step is not None:
            return step[1]
        return self._verify(drafts, self.warp.probs(logits), generator)

    def propose_and_verify(
        self, drafts: Sequence[DraftRef], logits: torch.Tensor, num_verify: int, generator: torch.Generator | None
    ) -> tuple[Proposals | None, Verdict]:
        """Warp verifier and drafter rows in one pass, then propose and verify as the two methods do.

        A subclass that overrides :meth:`propose` or :meth:`verify` gets its own methods called instead.
        """
        if type(self).propose is not RejectionSampling.propose or type(self).verify is not RejectionSampling.verify:
            return super().propose_and_verify(drafts, logits, num_verify, generator)
        step = self._host_step(drafts, logits, num_verify, generator)
        if step is not None:
            return step
        probs = self.warp.probs(logits)
        target = probs[:num_verify] if num_verify < probs.shape[0] else probs
        accepted, dist = self._judge(drafts, target, generator)
        if num_verify == probs.shape[0]:
            return None, self._verdict(accepted, sample_rows(dist, generator), target)
        drafter = probs[num_verify:]
        # One draw per row for the verifier's token and the new drafts together (independent uniforms).
        tokens = sample_rows(torch.cat([dist, drafter]), generator)
        return self._proposals(drafter, tokens[1:]), self._verdict(accepted, tokens, target)

    def _candidates(self, logits: torch.Tensor) -> hostsample.Candidates | None:
        """The host candidates of a top-k or top-p warp of CPU ``logits``, or ``None`` for the dense path."""
        warp = self.warp
        if type(warp).probs is not SamplingWarp.probs or type(warp).softmax is not SamplingWarp.softmax:
            return None  # a warp of its own: the shortcuts below compute the built-in one
        if warp.top_k is not None:
            return hostsample.top_k_candidates(logits, warp.top_k, warp.temperature, warp.top_p)
        if warp.top_p is not None and logits.device.type == "cpu":
            return hostsample.top_p_candidates(warp.softmax(logits), warp.top_p)
        return None

    def _host_step(
        self, drafts: Sequence[DraftRef], logits: torch.Tensor, num_verify: int, generator: torch.Generator | None
    ) -> tuple[Proposals | None, Verdict] | None:
        """:func:`hostsample.step` where both the logits' warp and the chain's proposals allow it, else ``None``."""
        candidates = self._candidates(logits)
        if candidates is None:
            return None
        chain = hostsample.host_chain(drafts) if drafts else None
        if drafts and chain is None:
            return None
        return hostsample.step(drafts, chain, candidates, num_verify, generator)

    @staticmethod
    def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> Proposals:
        return RejectionSampling._proposals(probs, sample_rows(probs, generator))

    @staticmethod
    def _proposals(probs: torch.Tensor, tokens: torch.Tensor) -> Proposals:
        """Proposals of ``[k, 1]`` tokens drawn from ``probs`` (scores computed when asked for)."""
        return Proposals(tokens=tokens.squeeze(-1), scores=lambda: probs.gather(-1, tokens).squeeze(-1), probs=probs)

    @staticmethod
    def _verify(drafts: Sequence[DraftRef], target: torch.Tensor, generator: torch.Generator | None) -> Verdict:
        accepted, dist = RejectionSampling._judge(drafts, target, generator)
        return RejectionSampling._verdict(accepted, sample_rows(dist, generator), target)

    @staticmethod
    def _judge(
        drafts: Sequence[DraftRef], target: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """How many drafts are accepted (0-d) and the ``[1, V]`` weights the verifier's token is drawn from."""
        ranks, vocab = target.shape
        kappa = len(drafts)
        if not kappa:
            return torch.zeros((), dtype=torch.int64, device=target.device), target[:1]
        tokens, proposal = _chain_proposals(drafts, vocab)
        proposal = proposal.to(target.dtype)
        p = target.gather(-1, tokens)  # [kappa, 1]: gather reads the first kappa rows of the target
        q = proposal.gather(-1, tokens)
        uniforms = torch.rand(kappa, 1, generator=generator, device=target.device, dtype=target.dtype)
        accepted = leading_true(uniforms * q < p)  # u < p/q without dividing (q > 0 for drawn tokens)
        # The rank the verifier's token goes to (clamped: after a full accept with no rank left the draw is
        # discarded), and the proposal row its residual subtracts.
        row = accepted.clamp(max=ranks - 1).view(1)
        verifier = target.index_select(0, row)
        residual = (verifier - proposal.index_select(0, row.clamp(max=kappa - 1))).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        if ranks > kappa:  # the bonus rank has no proposal: after a full accept its "residual" is p itself
            mass = mass * (kappa - accepted)
        # A rejection implies p(d) < q(d), so the residual has positive mass; guard rounding anyway.
        return accepted, torch.where(mass > 0, residual, verifier)

    @staticmethod
    def _verdict(accepted: torch.Tensor, tokens: torch.Tensor, target: torch.Tensor) -> Verdict:
        """The deferred verdict of ``accepted`` drafts (0-d) and the verifier's token, ``tokens[0, 0]``.

        Both are read as they are (two small reads in the one transfer), not joined on the device first.
        """
        ranks = target.shape[0]

        def resolve(values: list) -> tuple[int, int | None]:
            count, drawn = values[0], values[1][0][0]
            return count, drawn if count < ranks else None

        return Verdict.deferred((accepted, tokens), resolve, lambda: target.amax(-1))

    def describe(self) -> dict[str, object]:
        """Name and sampling options."""
        return {
            "name": "rejection",
            "temperature": self.warp.temperature,
            "top_k": self.warp.top_k,
            "top_p": self.warp.top_p,
        }


def sample_rows(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of non-negative ``[k, V]`` weights (each row with positive mass), drawn exactly.

    Inverse-CDF sampling: a uniform in ``(0, 1]`` scaled by the row's total picks the first token whose
    cumulative weight reaches it, so a token of zero weight is never drawn. On a CPU this costs a few
    vectorised ops, far less than a ``torch.multinomial`` call (``docs/performance.md#host-side-choices``).

    Returns:
        ``[k, 1]`` int64 token ids.
    """
    cumulative = weights.cumsum(-1)
    uniforms = torch.rand(weights.shape[0], 1, generator=generator, device=weights.device, dtype=weights.dtype)
    thresholds = (1.0 - uniforms) * cumulative[:, -1:]  # in (0, total]: 1 - u with u in [0, 1)
    return torch.searchsorted(cumulative, thresholds)


def _chain_proposals(drafts: Sequence[DraftRef], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain's ``[kappa, 1]`` draft tokens and dense ``[kappa, V]`` proposals, on the device."""
    groups = chain_rows(drafts)
    tokens = [batch.tokens[rows] for batch, rows in groups]
    dense = [batch.dense(rows, vocab_size) for batch, rows in groups]
    if len(groups) == 1:
        return tokens[0][:, None], dense[0]
    return torch.cat(tokens)[:, None], torch.cat(dense)


def make_rejection(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> RejectionSampling:
    """Factory for the ``rejection`` rule with validated options.

    Raises:
        ValueError: For a non-positive, infinite or too small temperature (below :data:`MIN_TEMPERATURE`), a
            negative top_k or a top_p outside (0, 1].
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ValueError(
            f"temperature must be a number > 0 and finite for rejection sampling, got {temperature!r}; "
            "for temperature 0 use the 'greedy' rule"
        )
    if temperature < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature {temperature!r} is too small to sample with: logits divided by it overflow float32 "
            f"(the smallest accepted is {MIN_TEMPERATURE:g}); a temperature this small picks the most likely "
            "token anyway, so use the 'greedy' rule (--temperature 0 on the command line)"
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
