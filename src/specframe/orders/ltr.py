"""Left-to-right verification order: positions in textual order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specframe.hookspecs import hookimpl
from specframe.orders.base import OrderPolicy


class LeftToRight(OrderPolicy):
    """Verify the window from its leftmost position to its rightmost."""

    left_to_right = True
    uses_scores = False

    def order(self, positions: Sequence[int], scores: Mapping[int, float]) -> list[int]:
        """Positions in increasing order."""
        return sorted(positions)

    def describe(self) -> dict[str, object]:
        """The policy's name."""
        return {"name": "ltr"}


@hookimpl
def register_order_policies(register):
    """Register the ``ltr`` order."""
    register("ltr", LeftToRight)
