"""The any-order greedy guarantee, checked call by call, for testing an order policy or a schedule.

Under greedy decoding a left-to-right decoder's output is plain AR's, which a test compares directly. With
an order that verifies positions out of textual order (``order: confidence``, or a plugin's order policy,
on a family whose layout allows it, such as SetDLM) the output may differ from plain AR's, and what holds
instead is the serial guarantee (Proposition C.1 of the paper): **every accepted token is the greedy
conditional given what was accepted before it** -- the call's verified prefix, in generation order, plus the
tokens the same call accepted earlier. :func:`any_order_violations` decodes one request and checks exactly
that, recomputing each conditional from scratch with the family's own mask builder
(:func:`specframe.testing.reference.conditional_logits`)::

    decoder = compose({"model": model, "schedule": "packed", "order": "my-order", "width": 4,
                       "max_new_tokens": 16})
    assert any_order_violations(decoder, [0, 1, 2]) == []

Use a small float64 model (:func:`specframe.testing.models.write_random_checkpoint`): each accepted token
costs one cache-free forward over its context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specframe.acceptance.greedy import GreedyAcceptance
from specframe.ledger import Outcome, outcome_pairs
from specframe.plan import CallPlan, CallResult
from specframe.schedules.base import Schedule
from specframe.state import DecodeState
from specframe.testing.reference import conditional_logits

if TYPE_CHECKING:
    from specframe.decoder import Decoder, Generation


@dataclass(frozen=True)
class OrderViolation:
    """An accepted token that is not the greedy conditional given what was accepted before it.

    Attributes:
        call: The model call (0-based) that accepted it.
        position: Its position.
        token: The token accepted there.
        expected: The verifier's greedy token there given ``context``.
        context: The ``(position, token)`` pairs accepted before it, in generation order (prompt included).
    """

    call: int
    position: int
    token: int
    expected: int
    context: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class AcceptedCall:
    """What one model call accepted, and the context it was scored in.

    Attributes:
        context: The ``(position, token)`` pairs accepted before the call, in generation order.
        accepted: The pairs the call accepted, in the order it accepted them (before the length limit, an
            EOS or a stop sequence pruned any; positions past the request's last one are left out).
    """

    context: tuple[tuple[int, int], ...]
    accepted: tuple[tuple[int, int], ...]


class RecordingSchedule(Schedule):
    """Wraps a schedule and records, for each call, its context and the tokens it accepted, in order.

    Everything but :meth:`plan` and :meth:`update` is the wrapped schedule's.

    Args:
        inner: The schedule to record.
    """

    def __init__(self, inner: Schedule) -> None:
        self.inner = inner
        self.name = inner.name
        self.takes_width = inner.takes_width
        self.calls: list[AcceptedCall] = []

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)

    def for_request(self) -> RecordingSchedule:
        """A recorder over the wrapped schedule's copy for one request, adding to this recorder's calls."""
        copied = RecordingSchedule(self.inner.for_request())
        copied.calls = self.calls
        return copied

    def plan(self, state: DecodeState) -> CallPlan:
        """The wrapped schedule's plan."""
        return self.inner.plan(state)

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Outcome:
        """The wrapped schedule's update, recording the tokens its outcome accepts."""
        context = tuple((p, state.token_at(p)) for p in state.generation_order())
        outcome = self.inner.update(state, plan, result)
        accepted = tuple((int(p), int(t)) for p, t in outcome_pairs(plan, outcome) if p <= state.end)
        self.calls.append(AcceptedCall(context, accepted))
        return outcome

    def describe(self) -> dict[str, object]:
        """The wrapped schedule's description."""
        return self.inner.describe()

    def label(self) -> str:
        """The wrapped schedule's label."""
        return self.inner.label()


def record_calls(decoder: Decoder, prompt_ids: Sequence[int], **generate: Any) -> tuple[Generation, list[AcceptedCall]]:
    """Decode one request with ``decoder`` and record every call's context and accepted tokens.

    Args:
        decoder: A composed decoder (its schedule is wrapped for this request only).
        prompt_ids: The prompt's token ids.
        **generate: Further arguments of :meth:`specframe.decoder.Decoder.generate` (``seed``, ...).

    Returns:
        The result and one :class:`AcceptedCall` per model call that accepted or verified anything.
    """
    recorder = RecordingSchedule(decoder.schedule)
    decoder.schedule = recorder
    try:
        result = decoder.generate(prompt_ids=list(prompt_ids), **generate)
    finally:
        decoder.schedule = recorder.inner
    return result, recorder.calls


def any_order_violations(decoder: Decoder, prompt_ids: Sequence[int], **generate: Any) -> list[OrderViolation]:
    """Decode one request and list every accepted token that breaks the any-order greedy guarantee.

    Each accepted token must be the verifier's argmax at its position given the call's context and the
    tokens the same call accepted before it (see the module docstring). The decoder must decode greedily
    (``acceptance: greedy``, the default); any schedule, width and order policy may be tested.

    Args:
        decoder: A composed, greedy decoder.
        prompt_ids: The prompt's token ids.
        **generate: Further arguments of :meth:`specframe.decoder.Decoder.generate`.

    Returns:
        The violations in call order; empty when the guarantee holds.

    Raises:
        ValueError: If the decoder's acceptance rule is not greedy (a subclass of
            :class:`~specframe.acceptance.greedy.GreedyAcceptance`): the guarantee is about greedy tokens.
    """
    if not isinstance(decoder.rule, GreedyAcceptance):
        name = decoder.rule.describe().get("name")
        raise ValueError(f"any_order_violations needs a greedy decoder (acceptance 'greedy'), not {name!r}")
    _, calls = record_calls(decoder, prompt_ids, **generate)
    violations = []
    for index, call in enumerate(calls):
        group = list(call.context)
        for position, token in call.accepted:
            expected = int(conditional_logits(decoder.model, group, position).argmax())
            if expected != token:
                violations.append(OrderViolation(index, position, token, expected, tuple(group)))
            group.append((position, token))
    return violations
