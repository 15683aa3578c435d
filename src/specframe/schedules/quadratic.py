"""Quadratic-SS: one call per iteration with a proposal branch for every possible acceptance boundary.

For each outcome ``a`` (the verifier ends up adding ``a`` tokens: ``a - 1`` accepted drafts and a correction,
or a full accept plus a bonus), one draft group conditions on the first ``a - 1`` chain tokens and proposes
the window that would follow. Whichever outcome occurs, the next draft is ready; input size grows with W^2.
Under sampling, only the selected branch is sampled (appendix E.4).
"""

from __future__ import annotations

from specframe.acceptance.base import Verdict
from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult, DraftGroup
from specframe.schedules.base import Schedule, store_group, verification_window, verify_planned_chain, window_plan
from specframe.state import DecodeState


class QuadraticSchedule(Schedule):
    """Verify the chain and draft every branch's next window in one call."""

    name = "quadratic"
    exact = True
    rate_model = "quadratic"  # width "auto" chooses its width (specframe.auto.rates)

    def plan(self, state: DecodeState) -> CallPlan:
        """One draft group per possible outcome ``a = 1 .. m``."""
        window = verification_window(state)
        kappa = len(window.chain)
        groups = []
        for outcome in range(1, window.num_verify + 1):
            resolved = window.order[:outcome]
            targets = tuple(state.window(after=resolved))
            groups.append(DraftGroup(context=min(outcome - 1, kappa), targets=targets))
        return window_plan(state, window, tuple(groups))

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict:
        """Verify, then sample the draft from the branch that matches the outcome."""
        verdict = verify_planned_chain(state, plan, result)
        outcome = verdict.accepted + (1 if verdict.token is not None else 0)
        store_group(state, plan, result, outcome - 1)
        return verdict


@hookimpl
def register_schedules(register):
    """Register the ``quadratic`` schedule."""
    register("quadratic", QuadraticSchedule)
