"""The one owner of what a request accepted and what its KV cache holds.

A schedule's ``update`` returns what its call decided: a :class:`~specframe.acceptance.base.Verdict` (from
:func:`~specframe.schedules.base.verify_planned_chain` or
:func:`~specframe.schedules.base.verify_and_propose`), a :class:`~specframe.plan.Guess` (tokens a lossy schedule commits
without a verdict) or ``None`` (a drafting-only call). The decoder hands it to the request's
:class:`CacheLedger`, which alone turns it into accepted tokens (applying EOS, stop sequences, stop texts
and the length limit), records the verification, and keeps in the cache exactly the rows of accepted
tokens whose context stayed valid. Schedules read the outcome back from the
:class:`~specframe.state.DecodeState` (tokens, ``end``, ``pending``); nothing else writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from specframe.acceptance.base import Verdict
from specframe.blame import contract_error
from specframe.plan import CallPlan, Guess, PhysicalCall
from specframe.state import DecodeState

if TYPE_CHECKING:
    from specframe.models.cache import KVCache


#: What :meth:`specframe.schedules.base.Schedule.update` returns.
Outcome = Verdict | Guess | None


def outcome_pairs(plan: CallPlan, outcome: Outcome) -> list[tuple[int, int]]:
    """The ``(position, token)`` pairs ``outcome`` accepts for ``plan``, before the stopping rules.

    A verdict accepts the first ``accepted`` chain tokens (read from ``plan.chain``) and the verifier's token
    at the next rank.
    """
    if outcome is None:
        return []
    if isinstance(outcome, Guess):
        return [(int(p), int(t)) for p, t in outcome.pairs]
    accepted, token = outcome.accepted, outcome.token
    pairs = list(zip(plan.order[:accepted], plan.chain[:accepted], strict=True))
    if token is not None:
        pairs.append((plan.order[accepted], token))
    return pairs


class CacheLedger:
    """Accepted tokens and cached rows of one request; the only writer of both.

    Args:
        state: The request's state, whose tokens, end, pending tokens and verifications this ledger writes.
        cache: The request's KV cache (``None``: track acceptance only, as tests of the stopping rules do).
    """

    def __init__(self, state: DecodeState, cache: KVCache | None = None) -> None:
        self.state = state
        self.cache = cache
        self.order = state.generation  # accepted positions, in acceptance order (the state's to read)
        self.cached: set[int] = set()  # positions whose keys and values the cache holds
        self._prefix = 0  # entries of ``order`` known to be cached, from the front
        self._stale = False  # a cached token was dropped by the last accept (its dependants were dropped too)
        self._text_scanned = state.start - 1  # the contiguous output up to here holds no stop text
        # Token window whose text holds any stop text that ends at its last token (a token is >= 1 byte, or a
        # special token decoded to nothing: twice the bytes leave room for those).
        self._text_window = 2 * max((len(s.encode("utf-8")) for s in state.ctx.stop_texts), default=0) + 4
        self._publish()

    @property
    def pending(self) -> tuple[tuple[int, int], ...]:
        """Accepted ``(position, token)`` pairs not yet in the KV cache, in acceptance order."""
        order, cached, prefix = self.order, self.cached, self._prefix
        while prefix < len(order) and order[prefix] in cached:
            prefix += 1
        self._prefix = prefix
        token_at = self.state.token_at
        return tuple([(p, token_at(p)) for p in order[prefix:] if p not in cached])

    def settle(self, schedule: object, plan: CallPlan, call: PhysicalCall | None, outcome: object) -> int:
        """Check a schedule's ``outcome`` for ``plan``, accept it, record it and commit the call's valid rows.

        Returns:
            How many tokens were kept.

        Raises:
            PluginError: Naming the schedule, when ``outcome`` is not a Verdict, Guess or None, when a call
                that verified a window returned no verdict, or when a schedule not declared lossy
                (``exact = False``) returned a :class:`Guess`.
        """
        problem = _outcome_problem(schedule, plan, outcome)
        if problem:
            raise contract_error(schedule, "schedule", problem)
        kept = self._accept(outcome_pairs(plan, outcome))
        if isinstance(outcome, Verdict):
            self.state.record(drafted=len(plan.chain), accepted=outcome.accepted, appended=kept)
        elif isinstance(outcome, Guess):
            self.state.record(drafted=0, accepted=0, appended=kept)
        self.state.calls += 1
        if call is not None:
            self.commit(call, outcome.accepted if isinstance(outcome, Verdict) else 0)
        self._publish()
        return kept

    def prefill(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Commit the rows of a :class:`~specframe.plan.PrefillCall`: prompt tokens, cached as evaluated."""
        positions = [p for p, _ in pairs]
        if self.cache is not None:
            self.cache.commit(list(range(len(positions))), positions)
        self.cached.update(positions)
        self._publish()

    def accept(self, pairs: Sequence[tuple[int, int]]) -> int:
        """Accept ``(position, token)`` pairs in order and apply the stopping rules.

        An EOS token at position ``j`` sets ``end = min(end, j)``; a stop sequence whose tokens are all
        accepted sets ``end`` to its last position (the earliest-ending one wins), as does the token whose
        text completes a stop text. Tokens beyond ``end`` are discarded, also ones accepted earlier
        (any-order verification can accept them before the EOS).

        Returns:
            How many of ``pairs`` are kept.
        """
        kept = self._accept(pairs)
        self._publish()
        return kept

    def _accept(self, pairs: Sequence[tuple[int, int]]) -> int:
        state = self.state
        new: list[int] = []
        tokens, eos, end, start = state.tokens, state.ctx.eos_token_ids, state.end, state.start
        for position, token in pairs:
            if position > state.end:
                continue
            if position < start or position in tokens:
                raise RuntimeError(f"position {position} is already resolved; a schedule accepted it twice")
            tokens[position] = int(token)
            new.append(position)
            if token in eos:
                state.end = min(state.end, position)
        self.order.extend(new)
        if new:
            state.highest = max(state.highest, *new)
        if state.ctx.stop_sequences:
            self._apply_stop_sequences(new)
        if state.ctx.stop_texts and new:
            self._apply_stop_texts()
        for position in new:
            state.drafts.pop(position, None)
            state.scores.pop(position, None)
        if state.end < end:  # tokens beyond ``end`` exist only if this call moved it
            self._prune_beyond_end()
            return sum(1 for p in new if p in tokens)
        return len(new)

    def commit(self, call: PhysicalCall, drafts_accepted: int) -> None:
        """Keep the staged rows of pending tokens and accepted drafts, where the row holds that token.

        The verifier's own token (a correction or bonus) is never committed from this call, even if a row
        happens to carry the same token: it is processed as an input of the next call, as both families'
        layouts expect (appendix D).

        An EOS accepted out of order drops the tokens past it. A row that saw a dropped token is not kept:
        each pending or draft row attends to the whole cache and to the inputs before it (pending tokens in
        acceptance order, then the chain by rank), so nothing is kept when a cached token was dropped, and
        nothing after the first dropped input. Those tokens stay pending and the next call recomputes them.
        """
        if self._stale:
            self._stale = False
            return
        plan, commit_rows, resolved = call.plan, call.commit_rows, self.state.resolved_token
        inputs = [*plan.pending, *zip(plan.order[:drafts_accepted], plan.chain[:drafts_accepted], strict=True)]
        rows, positions = [], []
        for position, token in inputs:
            if resolved(position) != token:
                break  # dropped past an EOS: every later row of this call saw it
            entry = commit_rows.get(position)
            if entry is not None and entry[1] == token:
                rows.append(entry[0])
                positions.append(position)
        if rows and self.cache is not None:
            self.cache.commit(rows, positions)
        self.cached.update(positions)

    def _publish(self) -> None:
        self.state.pending = self.pending

    def _apply_stop_sequences(self, new: list[int]) -> None:
        state = self.state
        for sequence in state.ctx.stop_sequences:
            length = len(sequence)
            for position in new:
                for first in range(max(state.start, position - length + 1), position + 1):
                    last = first + length - 1
                    if last <= state.end and all(state.tokens.get(first + i) == sequence[i] for i in range(length)):
                        state.end = last

    def _apply_stop_texts(self) -> None:
        """End at the first output token whose text completes a stop text, scanning the contiguous output.

        Positions past a gap (any-order verification) are scanned once the gap is filled, so the end is the
        one plain AR finds.
        """
        state = self.state
        tokens, texts, decode = state.tokens, state.ctx.stop_texts, state.ctx.decode
        assert decode is not None  # DecodeContext refuses stop texts without it
        position = self._text_scanned + 1
        while position <= state.end and position in tokens:
            first = max(state.start, position - self._text_window + 1)
            text = decode([tokens[p] for p in range(first, position + 1)])
            if any(stop in text for stop in texts):
                state.end = self._text_scanned = position
                return
            position += 1
        self._text_scanned = position - 1

    def _prune_beyond_end(self) -> None:
        state = self.state
        beyond = {p for p in state.tokens if p > state.end}
        if not beyond:
            return
        for position in beyond:
            del state.tokens[position]
        state.highest = max(state.tokens, default=state.start - 1)
        # Tokens accepted after a dropped one were cached with it in their context: their keys and values
        # must be recomputed without it (they become pending again), so that the verifier conditions on the
        # restricted prefix exactly (Algorithm 3, line 12).
        first = min(i for i, p in enumerate(self.order) if p in beyond)
        stale = {p for p in self.order[first:] if p in self.cached}
        if stale:
            if self.cache is not None:
                self.cache.drop_positions(stale)
            self.cached -= stale
            self._stale = True
        self._prefix = min(self._prefix, first)
        self.order[:] = [p for p in self.order if p not in beyond]
        state.drafts = {p: d for p, d in state.drafts.items() if p <= state.end}
        state.scores = {p: s for p, s in state.scores.items() if p <= state.end}


def _outcome_problem(schedule: object, plan: CallPlan, outcome: object) -> str | None:
    """What is wrong with ``outcome`` as ``schedule``'s update of ``plan``, if anything."""
    if outcome is None:
        if plan.num_verify:
            return (
                "update() returned None for a call that verified a window; return the verdict of "
                "verify_planned_chain (or verify_and_propose)"
            )
        return None
    if isinstance(outcome, Guess):
        if getattr(schedule, "exact", None) is not False:
            return (
                f"update() returned a Guess of {len(outcome.pairs)} token(s) without a verifier's verdict; return "
                "the verdict of verify_planned_chain or verify_and_propose, or declare the schedule lossy with "
                "exact = False"
            )
        return None
    if not isinstance(outcome, Verdict):
        return (
            f"update() returned {type(outcome).__name__} {outcome!r:.40}, not a Verdict (from verify_planned_chain "
            "or verify_and_propose), a Guess (a lossy schedule's tokens) or None (a call that verified nothing)"
        )
    if not plan.num_verify:
        return "update() returned a Verdict for a call that verified nothing (num_verify = 0); return None"
    accepted = outcome.accepted
    if not 0 <= accepted <= len(plan.chain) or (outcome.token is not None and accepted >= plan.num_verify):
        return (
            f"update() returned a Verdict accepting {accepted} draft(s) and token {outcome.token!r} for a chain of "
            f"{len(plan.chain)} with {plan.num_verify} verified rank(s)"
        )
    return None
