"""Greedy acceptance: a draft token is accepted when it equals the verifier's argmax.

Ties are broken towards the lowest token id (:func:`~specframe.acceptance.base.first_argmax`), in the
drafter and the verifier alike, so every speculative schedule reproduces plain greedy AR decoding token for
token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specframe.acceptance.base import (
    AcceptanceRule,
    DraftRef,
    Proposals,
    Verdict,
    draft_tokens,
    first_argmax,
    top_probability,
)
from specframe.acceptance.select import host_first_argmax
from specframe.hookspecs import hookimpl


class GreedyAcceptance(AcceptanceRule):
    """Argmax drafting and exact-match verification (temperature 0)."""

    stochastic = False
    exact = True

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> Proposals:
        """Argmax of each row; the score is the token's softmax probability (computed when asked for).

        (A host list of tokens comes from CPU logits, so the tokens' tensor, if asked for, is made on the
        CPU, :class:`Proposals`' default; a device argmax is its own tensor.)
        """
        return Proposals(_argmax(logits), scores=lambda: top_probability(logits))

    def verify(self, drafts: Sequence[DraftRef], logits: torch.Tensor, generator: torch.Generator | None) -> Verdict:
        """Accept the longest prefix of drafts equal to the verifier's argmax, then add its next argmax.

        On a CPU the argmax is computed on the host (numpy) and the verdict at once; elsewhere it is deferred:
        the argmax stays on the device until the schedule reads the outcome. The comparison with the chain
        (whose tokens the host already knows) is a few integer compares.
        """
        return self._verdict(drafts, _argmax(logits), logits, logits.shape[0])

    @staticmethod
    def _verdict(
        drafts: Sequence[DraftRef], predicted: torch.Tensor | list[int], logits: torch.Tensor, ranks: int
    ) -> Verdict:
        """The verdict from ``predicted``, the argmax of ``logits`` whose first ``ranks`` rows verify.

        ``predicted`` is a host list (the verdict is decided now) or a device tensor (read when needed).
        """
        chain = draft_tokens(drafts)

        def resolve(values: list[list]) -> tuple[int, int | None]:
            argmax = values[0]
            accepted = 0
            while accepted < len(chain) and chain[accepted] == argmax[accepted]:
                accepted += 1
            return accepted, argmax[accepted] if accepted < ranks else None

        def scores() -> torch.Tensor:
            return top_probability(logits[:ranks])

        if isinstance(predicted, list):
            return Verdict(*resolve([predicted]), scores)
        return Verdict.deferred((predicted,), resolve, scores)

    def propose_and_verify(
        self, drafts: Sequence[DraftRef], logits: torch.Tensor, num_verify: int, generator: torch.Generator | None
    ) -> tuple[Proposals | None, Verdict]:
        """One argmax over verifier and drafter rows, then propose and verify as the two methods do.

        A subclass that overrides :meth:`propose` or :meth:`verify` gets its own methods called instead.
        """
        if type(self).propose is not GreedyAcceptance.propose or type(self).verify is not GreedyAcceptance.verify:
            return super().propose_and_verify(drafts, logits, num_verify, generator)
        predicted = _argmax(logits)
        proposals = None
        if logits.shape[0] > num_verify:

            def scores() -> torch.Tensor:
                return top_probability(logits[num_verify:])

            proposals = Proposals(predicted[num_verify:], scores)  # (on the CPU, as in propose)
        return proposals, self._verdict(drafts, predicted, logits, num_verify)

    def describe(self) -> dict[str, object]:
        """The rule's name."""
        return {"name": "greedy"}


def _argmax(logits: torch.Tensor) -> list[int] | torch.Tensor:
    """The first argmax of each row: a host list where numpy computes it (CPU logits), else a device tensor."""
    host = host_first_argmax(logits)
    return first_argmax(logits) if host is None else host


def make_greedy(**options: object) -> GreedyAcceptance:
    """Factory for the ``greedy`` rule, which takes no options."""
    if options:
        raise TypeError(
            f"greedy acceptance takes no options, got {sorted(options)}; "
            "temperature, top_k and top_p belong to the 'rejection' rule"
        )
    return GreedyAcceptance()


@hookimpl
def register_acceptance_rules(register):
    """Register the ``greedy`` acceptance rule."""
    register("greedy", make_greedy)
