"""Ablation verification orders for specframe (an example plugin distribution).

Installing this distribution makes the order ``lowest-confidence`` available by name to
``specframe.compose`` and the CLI, with no change to specframe: it is discovered through the ``specframe``
entry-point group declared in this package's ``pyproject.toml``. It also adds a command,
``specframe ablation-order``, which shows the order for some positions and scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specframe import hookimpl
from specframe.orders.base import OrderPolicy, by_score


class LowestConfidenceFirst(OrderPolicy):
    """Verify the least confident draft positions first; unscored positions last, in textual order."""

    left_to_right = False

    def order(self, positions: Sequence[int], scores: Mapping[int, float]) -> list[int]:
        """Scored positions by increasing score (ties: lower position first), then the rest in order."""
        return by_score(positions, scores, highest_first=False)

    def describe(self) -> dict[str, object]:
        """The policy's name."""
        return {"name": "lowest-confidence"}


@hookimpl
def register_order_policies(register):
    """Register the ``lowest-confidence`` order."""
    register("lowest-confidence", LowestConfidenceFirst)


@hookimpl
def register_commands(register):
    """Register ``specframe ablation-order`` (imported only when it runs)."""
    register(
        "ablation-order",
        "specframe_ablation_orders.cli:add_parser",
        help="show the order in which lowest-confidence verifies draft positions",
    )
