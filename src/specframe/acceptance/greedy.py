"""Greedy acceptance: a draft token is accepted when it equals the verifier's argmax.

Ties are broken towards the lowest token id (``torch.argmax`` returns the first maximal index), in the
drafter and the verifier alike, so every speculative schedule reproduces plain greedy AR decoding token for
token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specframe.acceptance.base import AcceptanceRule, DraftRef, Proposals, Verdict, chain_tokens, first_false
from specframe.hookspecs import hookimpl


class GreedyAcceptance(AcceptanceRule):
    """Argmax drafting and exact-match verification (temperature 0)."""

    stochastic = False

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> Proposals:
        """Argmax of each row; the score is the token's softmax probability."""
        probs = torch.softmax(logits.float() if logits.dtype != torch.float64 else logits, dim=-1)
        scores, tokens = probs.max(dim=-1)
        # max() may pick any maximal index; argmax picks the lowest, which is the documented tie-break.
        tokens = logits.argmax(dim=-1)
        return Proposals(tokens=tokens, scores=scores)

    def verify(self, drafts: Sequence[DraftRef], logits: torch.Tensor, generator: torch.Generator | None) -> Verdict:
        """Accept the longest prefix of drafts equal to the verifier's argmax, then add its next argmax."""
        predicted = logits.argmax(dim=-1)
        kappa = len(drafts)
        if kappa:
            accepted = first_false(chain_tokens(drafts, predicted.device) == predicted[:kappa])
        else:
            accepted = 0
        token = int(predicted[accepted]) if accepted < predicted.shape[0] else None
        scores = torch.softmax(logits.float() if logits.dtype != torch.float64 else logits, dim=-1).amax(-1)
        return Verdict(accepted=accepted, token=token, scores=scores)

    def describe(self) -> dict[str, object]:
        """The rule's name."""
        return {"name": "greedy"}


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
