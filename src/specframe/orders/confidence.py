"""Confidence verification order (appendix E.6 of the paper).

Positions are ranked by decreasing score, ties broken by textual position; positions without a finite score
(typically: no draft token yet) come last in textual order, so an iteration without scores is left to right.
What the score means is the schedule's business: Packed-SS and Quadratic-SS record the probability of each
draft token when it was proposed; Linear-SS records the verifier's top probability from the previous
iteration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specframe.hookspecs import hookimpl
from specframe.orders.base import OrderPolicy, by_score


class ConfidenceOrder(OrderPolicy):
    """Verify the most confident positions first."""

    left_to_right = False

    def order(self, positions: Sequence[int], scores: Mapping[int, float]) -> list[int]:
        """Scored positions by decreasing score (ties: lower position first), then the rest in order."""
        return by_score(positions, scores, highest_first=True)

    def describe(self) -> dict[str, object]:
        """The policy's name."""
        return {"name": "confidence"}


@hookimpl
def register_order_policies(register):
    """Register the ``confidence`` order."""
    register("confidence", ConfidenceOrder)
