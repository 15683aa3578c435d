"""K-branch: between Packed-SS and Quadratic-SS, a few draft branches per call instead of one or all.

One call verifies the stored draft and proposes ``k`` draft groups:

* the Packed-SS group: the window, drafted from the verified prefix alone (context 0);
* ``k - 1`` Quadratic-SS branches for the longest possible outcomes of this verification: the branch for
  outcome ``a`` (the verifier adds ``a`` tokens: ``a - 1`` accepted drafts and its own token) conditions on the
  first ``a - 1`` chain tokens and drafts the window that would follow.

After verification the branch of the outcome that occurred becomes the next draft; when that outcome has no
branch, the Packed-SS group's proposals at the still-unresolved positions do. Long accepted runs are thus
followed by a fresh full-width draft (as in Quadratic-SS), short ones by the leftover of the prefix draft (as
in Packed-SS), with ``O(k W)`` rows per call. ``k = 1`` plans exactly Packed-SS's calls.

Each stored draft token keeps the proposals it was drawn from, and only the kept group is sampled, so
rejection sampling verifies every token against its own proposal distribution and the output is exact.
"""

from __future__ import annotations

from specframe.acceptance.base import Verdict
from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult, DraftGroup
from specframe.schedules.base import Schedule, store_group, verification_window, verify_planned_chain, window_plan
from specframe.schedules.packed import PackedSchedule
from specframe.state import DecodeState


class KBranchSchedule(Schedule):
    """Packed-SS plus draft branches for the ``k - 1`` longest acceptance outcomes.

    Args:
        k: Draft groups per call (>= 1): the prefix group plus ``k - 1`` branches.

    Raises:
        ValueError: If ``k`` is not an integer >= 1.
    """

    name = "kbranch"
    exact = True
    rate_model = "kbranch"  # width "auto" chooses its width (specframe.auto.rates)

    def __init__(self, k: int = 2) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        self.k = k
        self._packed = PackedSchedule()

    def describe(self) -> dict[str, object]:
        """Name and ``k``."""
        return {"name": self.name, "k": self.k}

    def plan(self, state: DecodeState) -> CallPlan:
        """The Packed-SS plan plus one branch per outcome among the ``k - 1`` longest (outcomes >= 2)."""
        if self.k == 1 or state.first_call:
            return self._packed.plan(state)
        window = verification_window(state)
        groups = [DraftGroup(context=0, targets=window.window)]
        longest = window.num_verify
        for outcome in range(longest, max(1, longest - self.k + 1), -1):
            targets = tuple(state.window(after=window.order[:outcome]))
            groups.append(DraftGroup(context=min(outcome - 1, len(window.chain)), targets=targets))
        return window_plan(state, window, tuple(groups))

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict:
        """Verify, then keep the branch of the outcome that occurred, else the prefix group.

        Returns:
            The verdict.
        """
        verdict = verify_planned_chain(state, plan, result)
        outcome = verdict.accepted + (1 if verdict.token is not None else 0)
        store_group(state, plan, result, branch_for(plan, outcome))
        return verdict


def branch_for(plan: CallPlan, outcome: int) -> int:
    """Index of the draft group planned for ``outcome`` (group 0, the prefix group, when none was).

    Branch ``i >= 1`` of a plan with ``m = num_verify`` was planned for outcome ``m - i + 1``.
    """
    index = plan.num_verify - outcome + 1
    return index if 1 <= index < len(plan.drafts) and outcome >= 2 else 0


@hookimpl
def register_schedules(register):
    """Register the ``kbranch`` schedule (option ``k``, default 2)."""
    register("kbranch", KBranchSchedule)
