"""Per-request decoding state shared by every schedule.

The state knows which output positions hold accepted tokens, which accepted tokens are still pending (not
in the KV cache), the stored draft tokens with their proposals, and the last output position ``end`` (E in
the paper's Algorithm 3), which an accepted EOS token or a completed stop sequence moves earlier. It knows no
model family. Schedules read it to build plans and keep their drafts in it; the accepted tokens, ``end`` and
``pending`` are written by the request's :class:`~specframe.ledger.CacheLedger` alone, from the verdicts the
schedule returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from specframe.acceptance.base import AcceptanceRule, DraftRef
from specframe.orders.base import OrderPolicy
from specframe.plan import LayoutTraits


@dataclass(frozen=True)
class DecodeContext:
    """Fixed settings of one request, handed to the schedule through the state.

    Attributes:
        width: Speculative width W (>= 1).
        order: Verification order policy.
        rule: Acceptance rule.
        traits: Layout traits of the model family.
        generator: The request's random generator, seeded for reproducibility (given to every acceptance rule).
        eos_token_ids: Token ids that end generation.
        stop_sequences: Token sequences that end generation once all their tokens are accepted.
        stop_texts: Texts that end generation at the output token whose text completes one, however the
            model spelled it in tokens (a blank line as one token or as two newlines); needs ``decode``.
        decode: Turns token ids into text (the model's tokenizer), for ``stop_texts``.
    """

    width: int
    order: OrderPolicy
    rule: AcceptanceRule
    traits: LayoutTraits
    generator: torch.Generator | None = None
    eos_token_ids: frozenset[int] = frozenset()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    stop_texts: tuple[str, ...] = ()
    decode: Callable[[Sequence[int]], str] | None = None

    def __post_init__(self) -> None:
        if self.stop_texts and self.decode is None:
            raise ValueError("stop_texts need decode, the function that turns token ids into text")


@dataclass
class Verification:
    """Outcome of one verification: drafted chain length, accepted drafts, tokens appended."""

    drafted: int
    accepted: int
    appended: int


@dataclass
class DecodeState:
    """Mutable state of one generation request.

    Args:
        prompt: Prompt token ids (positions ``0 .. n-1``).
        max_new_tokens: Output length limit L; the last output position is ``n + L - 1``.
        ctx: The request's fixed settings.

    Attributes:
        tokens: Accepted output tokens by position (read them with :meth:`token_at` / :meth:`resolved_token`).
        drafts: The stored draft token of each position that has one, with the proposal it came from; a
            schedule replaces them with :meth:`set_drafts`.
        scores: Confidence of each stored draft (what an order policy reads).
        verifications: One :class:`Verification` per verification so far, in call order.
        calls: Model calls made for this request.
        start: The first output position (the prompt's length n).
        end: The last output position the length limit allows (``n + L - 1``).
        width: The width of the call being planned (``ctx.width`` unless a schedule choosing it per call sets it).
        pending: Accepted ``(position, token)`` pairs not yet in the KV cache, in acceptance order (what a
            plan hands the next call; the prompt before the first call).
        highest: No accepted output position is higher (an upper bound).
    """

    prompt: tuple[int, ...]
    max_new_tokens: int
    ctx: DecodeContext
    tokens: dict[int, int] = field(default_factory=dict)
    drafts: dict[int, DraftRef] = field(default_factory=dict)
    scores: dict[int, float] = field(default_factory=dict)
    verifications: list[Verification] = field(default_factory=list)
    calls: int = 0

    def __post_init__(self) -> None:
        self.prompt = tuple(int(t) for t in self.prompt)
        self.start = len(self.prompt)
        self.end = self.start + self.max_new_tokens - 1
        self.generation: list[int] = list(range(self.start))  # accepted positions, in acceptance order
        self.pending: tuple[tuple[int, int], ...] = tuple(enumerate(self.prompt))
        self._frontier = self.start
        self.highest = self.start - 1
        # The width of the call being planned: the context's W, unless a schedule that chooses the width
        # per call (width "auto") sets it before planning.
        self.width = self.ctx.width

    # -- reading -----------------------------------------------------------------------------------------
    def token_at(self, position: int) -> int:
        """The prompt or accepted output token at ``position``."""
        return self.prompt[position] if position < self.start else self.tokens[position]

    def resolved_token(self, position: int) -> int | None:
        """The prompt or accepted token at ``position``, or ``None`` while it is unresolved."""
        return self.prompt[position] if position < self.start else self.tokens.get(position)

    def is_resolved(self, position: int) -> bool:
        """Whether ``position`` holds a prompt or accepted token."""
        return position < self.start or position in self.tokens

    def generation_order(self) -> list[int]:
        """Every accepted position (prompt included) in the order it was accepted."""
        return list(self.generation)

    def leftmost_unresolved(self) -> int | None:
        """The first output position without an accepted token, or ``None`` when generation is complete."""
        while self._frontier in self.tokens:
            self._frontier += 1
        return self._frontier if self._frontier <= self.end else None

    @property
    def done(self) -> bool:
        """Whether every output position up to ``end`` is resolved."""
        return self.leftmost_unresolved() is None

    @property
    def first_call(self) -> bool:
        """True before the first model call of this request."""
        return self.calls == 0

    def window(self, width: int | None = None, *, after: Iterable[int] = ()) -> list[int]:
        """Unresolved positions of the active window, in increasing order.

        The window starts at the leftmost unresolved position and spans ``width`` consecutive positions
        (clipped at ``end``); resolved positions inside it are skipped (Algorithm 3, line 4).

        Args:
            width: Window length; the current call's width (:attr:`width`) by default.
            after: Positions to treat as resolved too (to compute the window after a hypothetical accept).
        """
        width = self.width if width is None else width
        tokens = self.tokens
        left = self.leftmost_unresolved()
        if left is None:
            return []
        if after:
            assumed = set(after)
            while left in tokens or left in assumed:
                left += 1
            right = min(self.end, left + width - 1)
            return [p for p in range(left, right + 1) if p not in tokens and p not in assumed]
        right = min(self.end, left + width - 1)
        if self.highest < left:  # nothing resolved past the frontier (always so when decoding left to right)
            return list(range(left, right + 1))
        return [p for p in range(left, right + 1) if p not in tokens]

    def output_ids(self) -> list[int]:
        """Generated token ids in textual order (up to the first unresolved position)."""
        out = []
        for position in range(self.start, self.end + 1):
            if position not in self.tokens:
                break
            out.append(self.tokens[position])
        return out

    # -- writing (schedules) -------------------------------------------------------------------------------
    def set_drafts(self, drafts: dict[int, DraftRef], scores: dict[int, float]) -> None:
        """Replace the stored draft with new draft tokens (kept only at unresolved positions <= end)."""
        start, end, tokens = self.start, self.end, self.tokens
        self.drafts = {p: d for p, d in drafts.items() if start <= p <= end and p not in tokens}
        self.scores = {p: s for p, s in scores.items() if start <= p <= end and p not in tokens} if scores else {}

    def record(self, drafted: int, accepted: int, appended: int) -> None:
        """Record a verification outcome for the metrics (the ledger does, for every verdict it settles)."""
        self.verifications.append(Verification(drafted, accepted, appended))
