"""The order-policy interface: in which order the positions of the active window are verified."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence


class OrderPolicy(ABC):
    """Chooses the verification order of the unresolved positions in the active window.

    The order is fixed before the model call from information available then (Appendix C of the paper).
    """

    #: True when the policy always returns positions in increasing (textual) order. Families whose
    #: verifier is left-to-right only (Nemotron) accept only such policies.
    left_to_right: bool = False

    #: Whether :meth:`order` reads the scores. When False, schedules neither compute nor store them.
    uses_scores: bool = True

    #: Whether the widths change which tokens are accepted; ``None``: unless the policy is left to right
    #: (any-order verification accepts other tokens at other widths). Where they do, ``width: "auto"``
    #: chooses them from the request alone (see :func:`specframe.exactness.width_changes_output`).
    output_depends_on_width: bool | None = None

    @abstractmethod
    def order(self, positions: Sequence[int], scores: Mapping[int, float]) -> list[int]:
        """Return ``positions`` permuted into verification rank order.

        Args:
            positions: Unresolved output positions of the active window, in increasing order.
            scores: Confidence scores the schedule recorded for some positions (higher = check earlier).
        """

    def describe(self) -> dict[str, object]:
        """JSON-friendly description."""
        return {"name": type(self).__name__}


def by_score(positions: Sequence[int], scores: Mapping[int, float], *, highest_first: bool) -> list[int]:
    """Scored positions by score (ties: lower position first), then the unscored ones in textual order.

    A position is scored when ``scores`` holds a finite number for it (typically: it has a draft token).
    """
    keyed, rest = [], []  # (signed score, position) pairs sort by score, ties by position
    sign = -1.0 if highest_first else 1.0
    isfinite, get = math.isfinite, scores.get
    for position in positions:
        score = get(position)
        if score is not None and isfinite(score):
            keyed.append((sign * score, position))
        else:
            rest.append(position)
    keyed.sort()
    rest.sort()
    return [p for _, p in keyed] + rest
