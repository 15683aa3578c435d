"""The acceptance-rule interface: how draft tokens are proposed and how a draft chain is verified.

An acceptance rule turns drafter logits into draft tokens (remembering the distribution each token was drawn
from) and decides, given verifier logits for the chain's ranks, how many draft tokens to accept and which
token the verifier adds (a correction after the first rejection, or a bonus after a full accept).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from specframe.acceptance.select import first_argmax  # noqa: F401 - re-exported (the greedy tie-breaking)
from specframe.hostread import DeferredRead


class Proposals(DeferredRead):
    """A batch of draft tokens drawn in one call, with the distributions they were drawn from.

    The tokens and scores stay on the device until the host first needs them (:attr:`token_list`,
    :attr:`score_list`); a schedule reads them in the same transfer as the call's verdict with
    :func:`specframe.hostread.read_together`. A rule that already has the tokens on the host (an argmax
    computed by numpy on a CPU) passes them as a list; the tensor is then made only if someone asks for it.
    A rule may pass the scores as a function, computed only if someone asks for them (a left-to-right order
    never does); :meth:`with_scores` computes them now, so that they are read with the tokens.

    Args:
        tokens: ``[k]`` proposed token ids (a tensor, or a list of host values).
        scores: ``[k]`` confidence of each proposal: the probability its distribution gave the token (or a
            function returning it).
        probs: ``[k, V]`` dense proposal distributions, ``[k, K]`` values when ``ids`` is set (sparse,
            for truncated top-k / top-p distributions), or ``None`` for point masses (greedy).
        ids: ``[k, K]`` token ids of the sparse entries in ``probs``, or ``None`` when dense.
        device: Where the tokens' tensor is made when ``tokens`` is a list (the CPU by default).
    """

    def __init__(
        self,
        tokens: torch.Tensor | list[int],
        scores: torch.Tensor | Callable[[], torch.Tensor],
        probs: torch.Tensor | None = None,
        ids: torch.Tensor | None = None,
        *,
        device: torch.device | None = None,
    ) -> None:
        self.probs = probs
        self.ids = ids
        self._scores = scores
        self._score_list: list[float] | None = None
        if isinstance(tokens, list):
            self._tokens: torch.Tensor | None = None
            self._token_list: list[int] | None = tokens
            self._device = device
            if isinstance(scores, torch.Tensor):
                self._expect(("scores",))
        else:
            self._tokens = tokens
            self._token_list = None
            # One device-to-host copy per batch; reading single tokens from a GPU tensor would sync per token.
            self._expect(("tokens", "scores") if isinstance(scores, torch.Tensor) else ("tokens",))

    @property
    def tokens(self) -> torch.Tensor:
        """``[k]`` proposed token ids on the device."""
        if self._tokens is None:
            self._tokens = torch.tensor(self._token_list, dtype=torch.int64, device=self._device)
        return self._tokens

    @property
    def scores(self) -> torch.Tensor:
        """``[k]`` confidence of each proposal (computed now if the rule deferred it)."""
        if callable(self._scores):
            self._scores = self._scores()
        return self._scores

    def with_scores(self) -> Proposals:
        """Compute deferred scores now, so that they are read in the same transfer as the tokens."""
        if self._score_list is None and "scores" not in self._pending_names:
            self._expect(("scores",) if self._token_list is not None else ("tokens", "scores"))
        return self

    def _expect(self, names: tuple[str, ...]) -> None:
        self._pending_names = names
        self._pending = tuple(self._tokens if name == "tokens" else self.scores for name in names)

    _pending_names: tuple[str, ...] = ()

    def _receive(self, values: list[list]) -> None:
        for name, value in zip(self._pending_names, values, strict=True):
            if name == "tokens":
                self._token_list = value
            else:
                self._score_list = value
        self._pending_names = ()

    @property
    def token_list(self) -> list[int]:
        """The proposed token ids on the host."""
        if self._token_list is None:
            self._read()
        return self._token_list

    @property
    def score_list(self) -> list[float]:
        """The proposals' confidence scores on the host."""
        if self._score_list is None:
            self.with_scores()
            self._read()
        return self._score_list

    def dense(self, rows: torch.Tensor | slice, vocab_size: int) -> torch.Tensor:
        """Dense ``[len(rows), V]`` distributions of the given rows (an index tensor, or a slice: a view)."""
        if self.probs is None:
            tokens = self.tokens[rows]
            out = torch.zeros(tokens.shape[0], vocab_size, dtype=torch.float32, device=self.tokens.device)
            return out.scatter_(1, tokens[:, None], 1.0)
        if self.ids is None:
            return self.probs[rows]
        values = self.probs[rows]
        return values.new_zeros(values.shape[0], vocab_size).scatter_(1, self.ids[rows], values)


class DraftRef(NamedTuple):
    """Where a stored draft token came from: a row of a :class:`Proposals` batch."""

    proposals: Proposals
    row: int

    @property
    def token(self) -> int:
        """The draft token id."""
        return self.proposals.token_list[self.row]


class Verdict(DeferredRead):
    """Outcome of verifying one draft chain.

    A rule that computes the outcome on the device returns :meth:`deferred` verdicts: the outcome is read
    on first access of :attr:`accepted` or :attr:`token`, or earlier together with other results through
    :func:`specframe.hostread.read_together`.

    Args:
        accepted: Number of leading draft tokens accepted (h).
        token: The verifier's token at rank ``accepted + 1`` (a correction, or a bonus after a full
            accept), or ``None`` when every rank was a draft token and all were accepted with no verifier
            rank left to supply a bonus.
        scores: ``[num_verify]`` probability of the verifier's most likely token at each rank (used by
            schedules whose order policy scores positions from the previous verification), or a function
            that computes them when first asked for.
    """

    def __init__(self, accepted: int, token: int | None, scores: torch.Tensor | Callable[[], torch.Tensor]) -> None:
        self._outcome: tuple[int, int | None] = (int(accepted), None if token is None else int(token))
        self._scores = scores
        self._resolve: Callable[[list[list]], tuple[int, int | None]] | None = None

    @classmethod
    def deferred(
        cls,
        tensors: Sequence[torch.Tensor],
        resolve: Callable[[list[list]], tuple[int, int | None]],
        scores: torch.Tensor | Callable[[], torch.Tensor],
    ) -> Verdict:
        """A verdict whose outcome ``resolve(host values of tensors)`` is computed once they are read.

        Args:
            tensors: Device tensors the outcome depends on.
            resolve: Maps their ``tolist()`` values to ``(accepted, token)``.
            scores: As in the constructor.
        """
        verdict = cls(0, None, scores)
        verdict._pending = tuple(tensors)
        verdict._resolve = resolve
        return verdict

    def _receive(self, values: list[list]) -> None:
        self._outcome = self._resolve(values)

    @property
    def accepted(self) -> int:
        """Number of leading draft tokens accepted (h)."""
        if self._pending:
            self._read()
        return self._outcome[0]

    @property
    def token(self) -> int | None:
        """The verifier's token after the accepted drafts, or ``None`` (see the class docstring)."""
        if self._pending:
            self._read()
        return self._outcome[1]

    @property
    def scores(self) -> torch.Tensor:
        """``[num_verify]`` top probability of the verifier at each rank."""
        if callable(self._scores):
            self._scores = self._scores()
        return self._scores

    def __repr__(self) -> str:
        return f"Verdict(accepted={self.accepted}, token={self.token})"


class AcceptanceRule(ABC):
    """Proposes draft tokens and verifies draft chains; exactness of the output distribution rests here."""

    #: Whether the rule samples or is deterministic. It documents the rule: the decoder gives every rule the
    #: request's seeded generator, so a seed reproduces a sampling rule's output even if this is left False.
    stochastic: bool = False

    #: Whether the rule reproduces the verifier's distribution: ``True`` (the output is the verifier's, token
    #: for token under greedy decoding, in distribution when sampling), ``False`` (lossy), or ``None``: not
    #: declared, and then not assumed exact. Bench, ``generate --json`` and ``specframe plugins`` report it. A
    #: subclass of a built-in rule declares its own (it does not inherit the built-in's; see
    #: :mod:`specframe.exactness`).
    exact: bool | None = None

    #: Whether the widths change this rule's output for a given seed; ``None``: decided from ``stochastic``
    #: and ``exact`` (a sampling or not-exact rule's output does). Where the widths change the output,
    #: ``width: "auto"`` chooses them from the request alone (see :func:`specframe.exactness.width_changes_output`).
    output_depends_on_width: bool | None = None

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
            generator: The request's seeded random generator (every rule receives one).

        Returns:
            How many drafts were accepted and the verifier's token after them.
        """

    def propose_and_verify(
        self, drafts: Sequence[DraftRef], logits: torch.Tensor, num_verify: int, generator: torch.Generator | None
    ) -> tuple[Proposals | None, Verdict]:
        """Draft from and verify with one call's logits: what Packed-SS does with every call.

        Rules may share work between the two (one pass over all rows); the default verifies, then proposes
        (the order in which separate calls of the two would draw their random numbers).

        Args:
            drafts: The chain's draft tokens in rank order, as for :meth:`verify`.
            logits: ``[num_verify + k, V]``: the verifier rows of the chain's ranks, then ``k`` drafter rows.
            num_verify: How many leading rows are verifier rows.
            generator: The request's seeded random generator (every rule receives one).

        Returns:
            The proposals of the ``k`` drafter rows (``None`` when ``k == 0``) and the verdict.
        """
        verdict = self.verify(drafts, logits[:num_verify], generator)
        proposals = self.propose(logits[num_verify:], generator) if logits.shape[0] > num_verify else None
        return proposals, verdict

    def describe(self) -> dict[str, object]:
        """JSON-friendly description of the rule and its options."""
        return {"name": type(self).__name__}


def draft_tokens(drafts: Sequence[DraftRef]) -> tuple[int, ...]:
    """The token ids of ``drafts`` on the host (each batch's host list fetched once, not once per token)."""
    tokens: list[int] = []
    batch = values = None
    for proposals, row in drafts:
        if proposals is not batch:
            batch, values = proposals, proposals.token_list
        tokens.append(values[row])
    return tuple(tokens)


def chain_rows(drafts: Sequence[DraftRef]) -> list[tuple[Proposals, torch.Tensor | slice]]:
    """The chain's drafts grouped by the batch they came from: ``(proposals, rows)`` in rank order.

    Rows are a slice where they are consecutive in their batch (the common case: Packed-SS verifies the
    still-unresolved tail of the last call's proposals), so that reading them is a view; else an index tensor.
    """
    groups = []
    start = 0
    while start < len(drafts):
        batch = drafts[start].proposals
        stop = start
        while stop < len(drafts) and drafts[stop].proposals is batch:
            stop += 1
        rows = [d.row for d in drafts[start:stop]]
        if rows == list(range(rows[0], rows[0] + len(rows))):
            groups.append((batch, slice(rows[0], rows[0] + len(rows))))
        else:
            groups.append((batch, torch.tensor(rows, device=batch.tokens.device)))
        start = stop
    return groups


def leading_true(flags: torch.Tensor) -> torch.Tensor:
    """How many leading entries of a 1-D boolean tensor are ``True``, as a 0-d int64 tensor (no host sync)."""
    return flags.to(torch.int64).cumprod(0).sum()


def top_probability(logits: torch.Tensor) -> torch.Tensor:
    """``[k]`` probability of each row's most likely token (float32, or float64 for float64 logits).

    The softmax's row maximum, in two torch ops. (A numpy ``1 / sum(exp(x - max))`` was tried and was slower
    on the one thread the bundled models run on: ``docs/performance.md#host-side-choices``.)
    """
    return torch.softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1).amax(-1)
