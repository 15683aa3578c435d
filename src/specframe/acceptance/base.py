"""The acceptance-rule interface: how draft tokens are proposed and how a draft chain is verified.

An acceptance rule turns drafter logits into draft tokens (remembering the distribution each token was drawn
from) and decides, given verifier logits for the chain's ranks, how many draft tokens to accept and which
token the verifier adds (a correction after the first rejection, or a bonus after a full accept).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Proposals:
    """A batch of draft tokens drawn in one call, with the distributions they were drawn from.

    Attributes:
        tokens: ``[k]`` proposed token ids.
        scores: ``[k]`` confidence of each proposal: the probability its distribution gave the token.
        probs: ``[k, V]`` dense proposal distributions, ``[k, K]`` values when ``ids`` is set (sparse,
            for truncated top-k / top-p distributions), or ``None`` for point masses (greedy).
        ids: ``[k, K]`` token ids of the sparse entries in ``probs``, or ``None`` when dense.
    """

    tokens: torch.Tensor
    scores: torch.Tensor
    probs: torch.Tensor | None = None
    ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # One device-to-host copy per batch; reading single tokens from a GPU tensor would sync per token.
        self.token_list: list[int] = self.tokens.tolist()
        self.score_list: list[float] = self.scores.tolist()

    def dense(self, rows: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Dense ``[len(rows), V]`` distributions of the given rows."""
        if self.probs is None:
            out = torch.zeros(len(rows), vocab_size, dtype=torch.float32, device=self.tokens.device)
            return out.scatter_(1, self.tokens[rows, None], 1.0)
        if self.ids is None:
            return self.probs[rows]
        out = self.probs.new_zeros(len(rows), vocab_size)
        return out.scatter_(1, self.ids[rows], self.probs[rows])


@dataclass(frozen=True)
class DraftRef:
    """Where a stored draft token came from: a row of a :class:`Proposals` batch."""

    proposals: Proposals
    row: int

    @property
    def token(self) -> int:
        """The draft token id."""
        return self.proposals.token_list[self.row]


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one draft chain.

    Attributes:
        accepted: Number of leading draft tokens accepted (h).
        token: The verifier's token at rank ``accepted + 1`` (a correction, or a bonus after a full
            accept), or ``None`` when every rank was a draft token and all were accepted with no verifier
            rank left to supply a bonus.
        scores: ``[num_verify]`` probability of the verifier's most likely token at each rank (used by
            schedules whose order policy scores positions from the previous verification).
    """

    accepted: int
    token: int | None
    scores: torch.Tensor


class AcceptanceRule(ABC):
    """Proposes draft tokens and verifies draft chains; exactness of the output distribution rests here."""

    #: Whether the rule samples (uses the random generator) or is deterministic.
    stochastic: bool = False

    @abstractmethod
    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> Proposals:
        """Draw one draft token per row of drafter logits ``[k, V]``."""

    @abstractmethod
    def verify(
        self,
        drafts: Sequence[DraftRef],
        logits: torch.Tensor,
        generator: torch.Generator | None,
    ) -> Verdict:
        """Verify a draft chain against verifier logits.

        Args:
            drafts: The chain's draft tokens in rank order (kappa of them), with their stored proposals.
            logits: ``[m, V]`` verifier logits for ranks ``1..m``, where ``m`` is ``kappa`` or ``kappa + 1``.
            generator: Random generator for stochastic rules.

        Returns:
            How many drafts were accepted and the verifier's token after them.
        """

    def describe(self) -> dict[str, object]:
        """JSON-friendly description of the rule and its options."""
        return {"name": type(self).__name__}


def chain_tokens(drafts: Sequence[DraftRef], device: torch.device) -> torch.Tensor:
    """The chain's token ids as a ``[kappa]`` tensor on ``device``."""
    return torch.tensor([d.token for d in drafts], dtype=torch.long, device=device)


def first_false(flags: torch.Tensor) -> int:
    """Index of the first ``False`` in a 1-D boolean tensor, or its length when all are ``True``.

    This is the one host synchronisation of a verification.
    """
    if flags.numel() == 0:
        return 0
    failed = ~flags
    return int(torch.where(failed.any(), failed.to(torch.int8).argmax(), flags.numel()))
