"""The seam between schedules and model families.

One decoding iteration flows through three records::

    DecodeState --schedule.plan()--> CallPlan       (logical; knows no model family)
    CallPlan    --mask builder-----> PhysicalCall   (input ids, position ids, attention mask, row maps)
    PhysicalCall --model backend---> logits         (one forward over cached prefix + new rows)
    logits      --mask builder-----> CallResult     (verifier logits by rank, drafter logits by group)
    CallResult  --schedule.update()> DecodeState

Positions are absolute: the prompt occupies positions ``0 .. n-1`` and output position ``n + i`` holds the
``i``-th generated token. Every new row of a call may attend to every cached row (the cache only ever holds
accepted tokens, which precede all new rows in generation order); a :class:`PhysicalCall` therefore only
describes attention among its new rows.

What crosses the seam besides: a family's :class:`LayoutTraits` (what its layout can express, which
schedules read), and a lossy schedule's :class:`Guess` (the tokens it commits without a verdict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from specframe.models.base import ModelCall


@dataclass(frozen=True)
class LayoutTraits:
    """What a model family's layout can express, in family-free terms.

    Attributes:
        free_bonus: The verifier scores the position right after a fully drafted window at no extra row
            (a shifted next-token verifier, e.g. Nemotron's causal rows). When False (a same-position
            verifier such as SetDLM's mask rows), verification ends at the window's last position.
        any_order: The verifier can check positions in any order; when False, only left to right.
    """

    free_bonus: bool
    any_order: bool


class Guess(NamedTuple):
    """Tokens a lossy schedule (``exact = False``, such as ``native``) commits without a verdict.

    Attributes:
        pairs: ``(position, token)`` pairs, in the order they are accepted.
    """

    pairs: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class DraftGroup:
    """Positions the drafter (diffusion mode) should propose, and the context it may condition on.

    Attributes:
        context: How many leading ranks of the plan's chain the drafter may see, in addition to the cached
            prefix and the pending tokens. ``0`` drafts from the verified prefix alone (Packed-SS, Linear-SS);
            Quadratic-SS has one group for every possible acceptance boundary.
        targets: Output positions to propose, in increasing order.
    """

    context: int
    targets: tuple[int, ...]


@dataclass(frozen=True)
class CallPlan:
    """What one model call must compute, in model-free terms.

    Attributes:
        pending: ``(position, token)`` pairs that are accepted but not yet in the KV cache, in generation
            order. A family processes them as input rows and commits them when its layout allows.
        order: Output positions in verification rank order: ``order[r]`` is checked at rank ``r + 1``.
            It lists the whole active window (so that layouts can pad to a static shape) and, for families
            whose verifier scores the next position for free, may end with one bonus position after it.
        chain: Draft tokens for the first ``len(chain)`` ranks of ``order`` (the draft chain, kappa).
        num_verify: How many ranks need a verifier distribution (``0`` = a drafting-only call). Rank ``r``
            is scored given the cached prefix, the pending tokens and the chain tokens at ranks ``< r``.
        drafts: Draft groups to propose in the same call.
        width: The speculative width W. Layouts may use it to keep call shapes static.
    """

    pending: tuple[tuple[int, int], ...]
    order: tuple[int, ...]
    chain: tuple[int, ...]
    num_verify: int
    drafts: tuple[DraftGroup, ...]
    width: int

    def __post_init__(self) -> None:
        if len(self.chain) > len(self.order):
            raise ValueError(f"chain of {len(self.chain)} tokens is longer than the order ({len(self.order)})")
        if not 0 <= self.num_verify <= len(self.order):
            raise ValueError(f"num_verify={self.num_verify} must lie in [0, {len(self.order)}]")
        if self.num_verify > len(self.chain) + 1:
            raise ValueError("a verifier can only score one rank past the draft chain")
        for group in self.drafts:
            if not 0 <= group.context <= len(self.chain):
                raise ValueError(f"draft group context {group.context} exceeds the chain ({len(self.chain)})")

    @property
    def chain_positions(self) -> tuple[int, ...]:
        """Output positions of the chain tokens, in rank order."""
        return self.order[: len(self.chain)]


@dataclass(frozen=True, kw_only=True)
class PhysicalCall(ModelCall):
    """A plan laid out as physical rows for one forward pass of a model family.

    It is the :class:`~specframe.models.base.ModelCall` the decoder hands the model (``input_ids``,
    ``position_ids``, ``attention``, ``output_rows``, ``adapter_rows``, ``checked``; ``attention[i, j]`` lets new
    row ``i`` attend to new row ``j``, and every new row also attends to every cached row), plus the maps that
    read its logits back in plan terms.

    Attributes:
        plan: The plan this call realises.
        verify_rows: ``[num_verify]`` indices into ``output_rows``: rank ``r`` -> its verifier logits.
        draft_rows: per draft group, indices into ``output_rows`` for each of its targets.
        commit_rows: ``position -> (row, token)`` for rows whose keys and values represent ``token`` at
            ``position`` with a context that is valid if the position ends up accepted with that token.
        row_slices: ``verify_rows`` and each of ``draft_rows`` as slices of the output rows, when they are
            contiguous (reading logits through a slice is a view, not a gather), or ``None``.
    """

    plan: CallPlan
    verify_rows: torch.Tensor
    draft_rows: tuple[torch.Tensor, ...]
    commit_rows: dict[int, tuple[int, int]] = field(default_factory=dict)
    row_slices: tuple[slice, tuple[slice, ...]] | None = None

    @property
    def num_rows(self) -> int:
        """Evaluated uncached rows, counted as the paper's Table 2 counts them."""
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class PrefillCall(ModelCall):
    """A chunk of a long prompt evaluated ahead of the schedule's first call (chunked prefill).

    Its rows are the next ``len(pairs)`` prompt tokens, causal among themselves after the cached ones; no
    logits are read, and every row is committed (a prompt token's keys and values need no verdict). The
    request's first planned call then carries only what is left of the prompt.

    Attributes:
        pairs: The ``(position, token)`` prompt pairs it evaluates, in order.
    """

    pairs: tuple[tuple[int, int], ...] = ()

    @property
    def num_rows(self) -> int:
        """Evaluated uncached rows."""
        return int(self.input_ids.shape[0])

    @classmethod
    def of(cls, pairs: tuple[tuple[int, int], ...], device: torch.device) -> PrefillCall:
        """The call evaluating ``pairs`` (consecutive prompt positions) on ``device``."""
        rows = len(pairs)
        return cls(
            torch.tensor([t for _, t in pairs], dtype=torch.long, device=device),
            torch.tensor([p for p, _ in pairs], dtype=torch.long, device=device),
            torch.ones(rows, rows, dtype=torch.bool, device=device).tril(),
            torch.zeros(0, dtype=torch.long, device=device),
            checked=True,
            pairs=pairs,
        )


class CallResult:
    """Model outputs of one call, in plan terms.

    Args:
        verify_logits: ``[num_verify, V]`` verifier logits, one row per rank.
        draft_logits: per draft group, ``[len(targets), V]`` drafter logits, one row per target.
        logits: Every returned row when ``verify_logits`` and the groups' ``draft_logits`` are consecutive
            slices of it, in that order (so a rule can treat verifier and drafter rows in one pass), or
            ``None``.
    """

    __slots__ = ("_draft_logits", "_slices", "_verify_logits", "logits")

    def __init__(
        self,
        verify_logits: torch.Tensor,
        draft_logits: tuple[torch.Tensor, ...],
        logits: torch.Tensor | None = None,
    ) -> None:
        self._verify_logits: torch.Tensor | None = verify_logits
        self._draft_logits: tuple[torch.Tensor, ...] | None = tuple(draft_logits)
        self._slices: tuple[slice, tuple[slice, ...]] | None = None
        self.logits = logits

    @classmethod
    def sliced(cls, logits: torch.Tensor, verify: slice, drafts: tuple[slice, ...]) -> CallResult:
        """The result whose verifier and drafter logits are the rows ``verify`` and ``drafts`` of ``logits``.

        The slices are taken when first read: a rule that works on :attr:`logits` in one pass never pays for
        them (on a CPU each tensor slice costs a few microseconds of dispatch).
        """
        result = cls.__new__(cls)
        result._verify_logits = None
        result._draft_logits = None
        result._slices = (verify, drafts)
        result.logits = logits
        return result

    @property
    def verify_logits(self) -> torch.Tensor:
        """``[num_verify, V]`` verifier logits, one row per rank."""
        if self._verify_logits is None:
            rows = self._slices[0]
            whole = rows.start in (0, None) and rows.stop == self.logits.shape[0] and rows.step in (1, None)
            self._verify_logits = self.logits if whole else self.logits[rows]
        return self._verify_logits

    @property
    def draft_logits(self) -> tuple[torch.Tensor, ...]:
        """Per draft group, ``[len(targets), V]`` drafter logits, one row per target."""
        if self._draft_logits is None:
            self._draft_logits = tuple(self.logits[s] for s in self._slices[1])
        return self._draft_logits
