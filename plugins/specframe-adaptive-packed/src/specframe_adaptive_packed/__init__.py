# --8<-- [start:header]
"""Adaptive Packed-SS: a specframe schedule plugin (the worked example of the plugin tutorial).

Packed-SS verifies the stored draft and proposes the next one in the same model call. This schedule plans
the same calls, but chooses two things from the verification outcomes it has seen so far in the request:

* the draft width: about twice the longest recent accepted run, between ``min_width`` and the decoder's W,
  so calls stay small while drafts are short-lived;
* whether to draft at all: after ``patience`` checked drafts in a row without a single accepted token, it
  makes plain AR calls (no draft rows) and tries one drafting call again after ``cooldown`` of them.

Only the plans change. Verification, acceptance and the KV cache are specframe's, so the output is exactly
the AR model's: token for token under greedy decoding, in distribution under rejection sampling.
"""

from __future__ import annotations

from specframe import hookimpl
from specframe.acceptance.base import Verdict
from specframe.plan import CallPlan, CallResult, DraftGroup
from specframe.schedules.base import Schedule, store_group, verification_window, verify_planned_chain, window_plan
from specframe.state import DecodeState

#: How many recent checked drafts the draft width looks back on.
HISTORY = 4
# --8<-- [end:header]


# --8<-- [start:class]
class AdaptivePackedSchedule(Schedule):
    """Packed-SS with a draft width that follows recent acceptance, and a plain AR fallback.

    Args:
        min_width: Smallest draft width while drafting (the decoder's width W is the largest).
        patience: Checked drafts in a row without an accepted token before falling back to AR calls.
        cooldown: AR calls to make before drafting again.

    Raises:
        ValueError: If an option is not an integer >= 1 (specframe reports it as a ConfigError naming the
            schedule).
    """

    exact = True  # update returns the verdict of verify_planned_chain: every committed token has one

    name = "adaptive-packed"

    # It picks each call's draft width itself, up to the decoder's W; under width "auto" (the default, which
    # needs either a rate_model for specframe to choose widths by, or this) W is 8.
    auto_width = 8

    def __init__(self, min_width: int = 2, patience: int = 3, cooldown: int = 8) -> None:
        for option, value in (("min_width", min_width), ("patience", patience), ("cooldown", cooldown)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{option} must be an integer >= 1, got {value!r}")
        self.min_width = min_width
        self.patience = patience
        self.cooldown = cooldown

    def describe(self) -> dict[str, object]:
        """Name and options, as metrics and bench records show them."""
        return {"name": self.name, "min_width": self.min_width, "patience": self.patience, "cooldown": self.cooldown}

    # --8<-- [end:class]

    # --8<-- [start:drafting]
    def drafting(self, state: DecodeState) -> bool:
        """Whether the next call should draft.

        It should, unless each of the last ``patience`` checked drafts had no token accepted. Then a stored
        draft is checked without drafting more, and one drafting call is made again (a probe) once
        ``cooldown`` calls in a row have had no draft to check.
        """
        failures = 0
        idle = 0  # trailing verifications that had no draft to check
        for verification in reversed(state.verifications):
            if verification.drafted:
                if verification.accepted:
                    return True
                failures += 1
                if failures == self.patience:
                    return not state.drafts and idle >= self.cooldown
            elif failures == 0:
                idle += 1
                if idle >= self.cooldown and not state.drafts:
                    return True  # whether drafts failed before or not, it is time to draft
        return True  # fewer than `patience` drafts checked so far

    # --8<-- [end:drafting]

    # --8<-- [start:width]
    def draft_width(self, state: DecodeState) -> int:
        """Twice the longest accepted run (drafts + 1) of the last HISTORY checked drafts, within [min_width, W].

        A Packed-SS call proposes positions from the prefix it reads, and the same call's verifier fills the
        first of them, so a draft of ``2 * run`` positions leaves about ``run`` for the next call to check.
        Before any draft has been checked the width is W.
        """
        width = state.ctx.width
        if width <= self.min_width:
            return width
        runs = []
        for verification in reversed(state.verifications):
            if verification.drafted:
                runs.append(verification.accepted + 1)
                if len(runs) == HISTORY:
                    break
        if not runs:
            return width
        return min(width, max(self.min_width, 2 * max(runs)))

    # --8<-- [end:width]

    # --8<-- [start:plan]
    def plan(self, state: DecodeState) -> CallPlan:
        """Verify the stored draft and, when drafting, propose the first ``draft_width`` open positions."""
        window = verification_window(state)
        if not self.drafting(state):
            return window_plan(state, window)  # check what is stored, draft nothing: an AR call
        width = self.draft_width(state)
        if state.first_call:
            # The first call's verifier resolves rank 1 itself, so draft the positions after it.
            open_positions = state.window(after=window.order[:1])
        else:
            open_positions = window.window
        targets = tuple(open_positions[:width])
        return window_plan(state, window, (DraftGroup(context=0, targets=targets),), width=width)

    # --8<-- [end:plan]

    # --8<-- [start:update]
    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict:
        """Verify with the library's acceptance rule, keep the fresh proposals (or none); return the verdict."""
        verdict = verify_planned_chain(state, plan, result)
        if plan.drafts:
            store_group(state, plan, result)
        else:
            state.set_drafts({}, {})  # what is left of a rejected draft is not checked again
        return verdict  # specframe's ledger accepts it and keeps the cache

    # --8<-- [end:update]


# --8<-- [start:register]
@hookimpl
def register_schedules(register):
    """Register ``adaptive-packed`` for every model family."""
    register("adaptive-packed", AdaptivePackedSchedule)


# --8<-- [end:register]
