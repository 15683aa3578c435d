"""Width and schedule chosen per call by a cost model (``width: "auto"``, ``schedule: "auto"``).

Before each call, :class:`AutoSchedule` estimates every candidate's tokens per second: acceptance rates by
draft offset from this request's recent verifications (:mod:`specframe.choice.stats`), tokens per call from
them (:mod:`specframe.choice.rates`), and seconds per call from the machine's measured cost of a call of R
rows (:mod:`specframe.costs`), with R what the model family's layout needs for that candidate. It then plans
the call with the best candidate's schedule at that width. A width of 0 is a plain AR call that checks what
is stored and drafts nothing, so drafting stops where it does not pay.

Only plans change: verification, acceptance and the cache are the library's, and each candidate is a
lossless schedule, so the output is the AR model's (token for token under greedy decoding, in distribution
under rejection sampling). Where the widths do change the output (any-order verification, sampling with a
seed, a rule not declared exact), ``compose`` binds the schedule ``deterministic``: a fixed cost model, no
timing, and nothing carried over between requests, so that the choice, and with it the output, is a
function of the request alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from specframe.acceptance.base import DraftRef, Proposals, Verdict
from specframe.choice.rates import Candidate, best, steady_state
from specframe.choice.stats import LEARN_CALLS, AcceptanceStats, CallTimes, CallTokens
from specframe.costs import CostModel
from specframe.hookspecs import hookimpl
from specframe.plan import CallPlan, CallResult
from specframe.schedules.base import Schedule, store_drafts, verification_window, verify_planned_chain, window_plan
from specframe.schedules.kbranch import KBranchSchedule
from specframe.schedules.linear import LinearSchedule
from specframe.schedules.packed import PackedSchedule
from specframe.schedules.quadratic import QuadraticSchedule
from specframe.state import DecodeState

#: Largest width ``width: "auto"`` considers.
AUTO_MAX_WIDTH = 16
#: Calls between two re-estimations of the candidates' throughput (of the widths next to the current pick).
REFRESH_CALLS = 16
#: Calls between two re-estimations of every candidate.
FULL_SCAN_CALLS = 64
#: How far from the current pick's width a re-estimation between full scans looks (a plain AR call counts
#: as width 1 here: its neighbours are the narrowest drafting candidates, which a probe tries).
NEIGHBOURHOOD = 1
#: Plain AR calls in a row after which a drafting call probes whether drafting pays again (AR calls
#: check no drafts, so without probes the acceptance estimate would never change again).
PROBE_AFTER = 16
#: Each probe after which AR calls still win doubles the AR calls before the next one, up to this many
#: (a probe costs about one call; on text where drafts keep failing, probes then cost under 1% of the
#: calls). A probe after which drafting wins resets the wait to PROBE_AFTER. The wait carries over to the
#: decoder's next request.
PROBE_AFTER_MAX = 128
#: Calls a probe lasts: the drafting call and the call that verifies its draft.
PROBE_CALLS = 2
#: A candidate timed fewer than TIMED calls is tried (for PROBE_CALLS calls) when its estimate is within
#: this share of the best one's: the cost model is a prediction, and only timed calls correct it.
PLAUSIBLE = 0.85
#: Timed calls after which a candidate is not tried again for timing: those its bias is learned from
#: (see :class:`specframe.choice.stats.CallTimes`).
TIMED = LEARN_CALLS
#: A candidate whose farthest draft offset was checked fewer times than this (over every request) is tried
#: when plausible (see PLAUSIBLE), so that acceptance is measured, not guessed, where it decides the choice.
EXPLORED = 4
#: Hysteresis: the current pick is replaced only by a candidate whose estimate beats it by more than this
#: share (estimates of near-equal candidates wobble with every verification and every timed call, and each
#: switch costs: see ``_switch_gain``).
SWITCH_MARGIN = 0.03
#: A switch must also pay (by more than SWITCH_MARGIN) with the acceptance taken this many standard
#: deviations below its estimate (see :meth:`specframe.choice.stats.AcceptanceStats.lower_rates`), for both
#: the pick and the candidate, and a drafting pick gives way to plain AR calls when they beat it so rated
#: (once the decoder has verified a draft): a gain that rests on a few verifications, or on far offsets
#: rarely checked, is no gain yet. Plain AR calls add one token whatever the acceptance, so near ties go
#: to them and to narrower widths.
CONFIDENCE_Z = 0.5
#: Kinds whose predicted tokens per call are corrected by the tokens their calls added (CallTokens): a
#: plain AR call adds one token, and a Linear-SS iteration is two calls.
SCALED_KINDS = frozenset({"packed", "kbranch", "quadratic"})
#: Positions the context may grow (or shrink, from one request to the next) before the candidates are
#: re-estimated although nothing else moved: a call's cost grows with the positions its rows attend to,
#: wide calls a little faster than narrow ones (about 1% per 64 positions on the bundled model on a CPU).
CONTEXT_STEP = 64
#: What ``schedule: "auto"`` chooses among.
AUTO_KINDS = ("ar", "packed", "kbranch", "quadratic")


#: The plain AR call candidate.
AR = Candidate("ar", 0)


def auto_widths(maximum: int) -> tuple[int, ...]:
    """Widths ``width: "auto"`` considers up to ``maximum``: every width to 8, then 10, 12, 16."""
    return tuple(w for w in (*range(1, 9), 10, 12, 16) if w <= maximum) or (maximum,)


class DraftlessCall(Schedule):
    """A plain AR call that also checks a stored draft's first token, and drafts nothing (width 0)."""

    name = "ar"
    exact = True

    def plan(self, state: DecodeState) -> CallPlan:
        """Verify the one-position window (with the stored draft there, if any); no draft groups."""
        if not state.drafts:  # nothing stored: the window is the leftmost open position, as for plain AR
            position = state.leftmost_unresolved()
            return CallPlan(pending=state.pending, order=(position,), chain=(), num_verify=1, drafts=(), width=0)
        return window_plan(state, verification_window(state), (), width=0)

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict:
        """The verifier's verdict; drop the rest of the stored draft."""
        verdict = verify_planned_chain(state, plan, result)
        store_drafts(state, (), None)
        return verdict


class AutoSchedule(Schedule):
    """Plans each call with the candidate (schedule, width) of the highest expected tokens per second.

    Args:
        k: Draft groups of the ``kbranch`` candidates.
        kinds: Candidate schedules (``ar``, ``packed``, ``kbranch``, ``quadratic``, ``linear``).
        widths: Candidate widths (``None``: :func:`auto_widths` of the decoder's width).
        name: The name metrics and reports show (``auto``, or the schedule whose width is chosen).

    Raises:
        ValueError: For an unknown kind, an empty candidate set or a bad ``k``.
    """

    name = "auto"
    exact = True

    def __init__(
        self,
        k: int = 2,
        *,
        kinds: Sequence[str] = AUTO_KINDS,
        widths: Sequence[int] | None = None,
        name: str = "auto",
    ) -> None:
        self._schedules: dict[str, Schedule] = {
            "ar": DraftlessCall(),
            "packed": PackedSchedule(),
            "kbranch": KBranchSchedule(k),
            "quadratic": QuadraticSchedule(),
            "linear": LinearSchedule(),
        }
        unknown = sorted(set(kinds) - set(self._schedules))
        if unknown or not kinds:
            raise ValueError(f"unknown candidate schedule(s) {unknown}; choose among {sorted(self._schedules)}")
        self.k = k
        self.kinds = tuple(kinds)
        self.widths = tuple(widths) if widths is not None else None
        self.name = name
        self.cost: CostModel | None = None
        self._rows_of_plan: Callable[[CallPlan], int] | None = None
        self._rows: dict[tuple[str, int, int], int] = {}
        self._candidates: dict[int, tuple[list[Candidate], list[Candidate]]] = {}
        self._synthetic = None
        #: Whether every request starts from nothing learned and no call is timed (see :meth:`bind`).
        self.deterministic = False
        self._forget()
        self._times: CallTimes | None = None

    def _forget(self) -> None:
        """Drop everything learned: acceptance, the pick, the probes' wait and the tokens calls added."""
        self._stats: AcceptanceStats | None = None
        self._chosen: Candidate | None = None
        self._current: Candidate | None = None
        self._since_refresh = REFRESH_CALLS
        self._since_scan = FULL_SCAN_CALLS
        self._offsets: dict[int, tuple[str, int]] = {}
        self._ar_streak = 0
        self._probe: Candidate | None = None
        self._probe_left = 0
        self._probe_after = PROBE_AFTER
        self._judge_probe = False
        self._learned = 0  # verifications that checked a draft, so far
        self._estimated = -1  # ... as of the last estimate
        self._estimated_times = -1  # revision of the call times as of the last estimate
        self._estimated_context = 0  # the context the last estimate was made at
        self._estimates = 0  # estimates made (not counting those that found nothing new)
        self._untried: tuple[int, Candidate] | None = None  # (estimates, pick) when no trial was worth it
        # Plain AR calls to come whose choice is known already (see _plain_ar_calls): planned without the
        # choice's bookkeeping, so that a plain AR call costs what one of the `ar` schedule does.
        self._fast_ar = 0
        #: The latest throughput estimate (tokens per second) of each candidate, by label.
        self.rates: dict[str, float] = {}
        self._predicted: dict[str, float] = {}
        self._timed: tuple[str, float] | None = None  # the label and start of the calls being timed
        self._timed_calls = 1  # ... how many calls that span covers
        self._tokens = CallTokens()
        self._predicted_tokens: dict[str, float] = {}
        self._last_label: str | None = None
        self._expect: float | None = None

    def bind(self, cost: CostModel, rows: Callable[[CallPlan], int], *, deterministic: bool = False) -> None:
        """Give the schedule a cost model and the family's row count of a plan (``compose`` does).

        Args:
            cost: Seconds per call by rows.
            rows: The rows the family's layout needs for a plan.
            deterministic: Choose from inputs that the request alone determines: ``cost`` as given (no
                call is timed) and only this request's verifications (each request starts from nothing
                learned). ``compose`` sets it where the widths change the output (see
                :func:`specframe.exactness.width_changes_output`).
        """
        self.cost = cost
        self._rows_of_plan = rows
        self._rows.clear()
        self._candidates.clear()
        self.deterministic = deterministic
        self._forget()
        # A measured cost model is corrected by what calls are seen to take; a given one is taken as is
        # (so that tests, and users who state their costs, get choices that do not depend on timing).
        self._times = None if deterministic or cost.source == "given" else CallTimes()

    def describe(self) -> dict[str, object]:
        """Name, candidates, whether the choice is deterministic, and the pooled acceptance by offset."""
        out: dict[str, object] = {"name": self.name, "width": "auto" if self.widths is None else list(self.widths)}
        if self.deterministic:
            out["deterministic"] = True
        if self.name == "auto" or "kbranch" in self.kinds:
            out["candidates"] = list(self.kinds)
            out["k"] = self.k
        if self._stats is not None:
            out.update(self._stats.describe())
        return out

    def label(self) -> str:
        """The candidate that planned the last call (``packed/w4``, ``ar``, ...)."""
        return self._current.label if self._current else self.name

    # -- planning ----------------------------------------------------------------------------------------
    def plan(self, state: DecodeState) -> CallPlan:
        """Choose the candidate for this call, then plan it with that schedule at that width."""
        if self._fast_ar and not state.first_call:
            return self._plain_ar_call(state)
        if self.cost is None or self._rows_of_plan is None:
            raise RuntimeError("AutoSchedule needs bind(cost, rows) before use; compose() does this")
        now = time.perf_counter()
        if state.first_call:
            self._start_request(state)
        elif self._timed is not None and self._times is not None:  # the last call(s), planning to planning
            label, started = self._timed
            calls = self._timed_calls
            self._times.observe(label, self._predicted.get(label), (now - started) / calls, calls)
        keep = self._current is not None and self._current.kind == "linear" and state.drafts
        if not keep:  # Linear-SS's verification call keeps the width its drafting call had
            self._current = self._choose(state)
        # A call is timed from here (its choice made: a scan's cost is not the candidate's) to the next plan();
        # a prompt call is no sample of a steady-state call.
        label = self._current.label
        # Tokens are compared with the prediction only when this candidate also made the last call (the
        # first call after a switch verifies the previous candidate's draft).
        repeated = label == self._last_label and self._current.kind in SCALED_KINDS
        self._expect = self._predicted_tokens.get(label) if repeated else None
        self._last_label = label
        self._timed = None if state.first_call else (label, time.perf_counter())
        self._timed_calls = 1
        state.width = max(self._current.width, 1)
        return self._schedules[self._current.kind].plan(state)

    def _plain_ar_call(self, state: DecodeState) -> CallPlan:
        """The next call of a run of plain AR calls whose choice is already known (see ``_fast_ar``).

        It does what :meth:`plan` would do for it, without re-deciding: the run of AR calls grows by one, and
        the call is the plan of the ``ar`` schedule (width 0 in the metrics). The calls of such a run are
        timed together, from the planning of the AR call that chose them to the next choice (once the AR calls'
        bias is learned).
        """
        self._fast_ar -= 1
        times = self._times
        if self._timed is None:  # the call after a prompt call (which is no sample of a steady-state call)
            self._timed, self._timed_calls = ("ar", time.perf_counter()), 1
        elif times is not None and times.learning("ar"):
            # While the AR calls' bias is learned, each call is timed on its own: a span's mean would let one
            # call that another process stalled set the bias (a single call's ratio is clipped, a mean is not).
            label, started = self._timed
            now = time.perf_counter()
            times.observe(label, self._predicted.get(label), (now - started) / self._timed_calls, self._timed_calls)
            self._timed, self._timed_calls = ("ar", now), 1
        else:
            self._timed_calls += 1
        self._ar_streak += 1
        state.width = 1
        return self._schedules["ar"].plan(state)

    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict | None:
        """Let the planning schedule judge the result; learn from the verification and the new draft."""
        if not plan.chain and self._current.kind == "ar":  # a plain AR call: nothing to learn, nothing stored
            verdict = verify_planned_chain(state, plan, result)
            if state.drafts or state.scores:
                state.set_drafts({}, {})
            if self._offsets:
                self._offsets = {}
            self._since_refresh += 1
            self._since_scan += 1
            return verdict
        chain = [self._offsets.get(p) for p in plan.chain_positions]
        verdict = self._schedules[self._current.kind].update(state, plan, result)
        accepted = 0 if verdict is None else verdict.accepted
        known = []
        for entry in chain:
            if entry is None:
                break
            known.append(entry)
        if plan.num_verify and known:
            self._stats.observe(known, min(accepted, len(known)))
            self._learned += 1
        if self._expect is not None:
            self._tokens.observe(self._current.label, self._expect, accepted + (plan.num_verify > accepted))
        self._offsets = _draft_offsets(state, plan)
        self._since_refresh += 1
        self._since_scan += 1
        return verdict

    # -- choosing ----------------------------------------------------------------------------------------
    def _start_request(self, state: DecodeState) -> None:
        maximum = state.ctx.width
        if self.deterministic:  # nothing carries over from earlier requests
            self._forget()
        if self._stats is None:
            self._stats = AcceptanceStats(maximum + 1)
        self._stats.start_request()
        self._offsets = {}
        self._current = None
        self._fast_ar = 0
        self._last_label = None
        self._probe_left = 0
        self._judge_probe = False
        # The last request's pick carries over (so do the run of AR calls and the wait before a probe: short
        # requests still probe), re-estimated (with hysteresis) against its neighbours at the
        # first call; every candidate is scanned FULL_SCAN_CALLS calls later (or now, on a first request).
        self._since_refresh = REFRESH_CALLS
        self._since_scan = 0 if self._chosen is not None else FULL_SCAN_CALLS
        self._synthetic = replace(state.ctx, eos_token_ids=frozenset(), stop_sequences=(), stop_texts=())

    def candidates(self, maximum: int) -> list[Candidate]:
        """Every (schedule, width) this schedule considers for a decoder width of ``maximum``."""
        return list(self._candidate_lists(maximum)[0])

    def _candidate_lists(self, maximum: int) -> tuple[list[Candidate], list[Candidate]]:
        """Every candidate, and the drafting ones (memoised: the choice asks before every call)."""
        if maximum not in self._candidates:
            every = self._list_candidates(maximum)
            self._candidates[maximum] = (every, [c for c in every if c.kind != "ar"])
        return self._candidates[maximum]

    def _list_candidates(self, maximum: int) -> list[Candidate]:
        widths = self.widths or auto_widths(maximum)
        out = []
        for kind in self.kinds:
            if kind == "ar":
                out.append(Candidate("ar", 0))
            else:  # Packed-SS at W = 1 drafts only the position its own verifier fills: an AR call with extra rows
                smallest = 2 if kind in ("packed", "kbranch") and len(widths) > 1 else 1
                out.extend(Candidate(kind, w) for w in widths if smallest <= w <= maximum)
        return out

    def _choose(self, state: DecodeState) -> Candidate:
        """The best candidate, except for a probe: two drafting calls after a run of plain AR calls.

        The run is PROBE_AFTER calls, doubled after every probe that left AR calls the best (up to
        PROBE_AFTER_MAX), and reset when a probe makes drafting win.
        """
        if self._probe_left:
            self._probe_left -= 1
            if not self._probe_left:
                self._since_refresh = REFRESH_CALLS  # re-estimate with what the probe found
            return self._probe
        refreshed = self._since_refresh >= REFRESH_CALLS or self._chosen is None
        chosen = self._estimate(state)
        if self._judge_probe:  # the estimate right after a probe of drafting from AR calls
            self._judge_probe = False
            failed = chosen.kind == "ar"
            self._probe_after = min(2 * self._probe_after, PROBE_AFTER_MAX) if failed else PROBE_AFTER
        if refreshed and (self._estimates, chosen) != self._untried:  # else: asked already, nothing moved since
            trial = self._worth_trying(state, chosen)
            if trial is not None:
                return self._start_probe(trial)
            if self._times is None or self._times.seen(chosen.label):
                self._untried = (self._estimates, chosen)
        if chosen.kind != "ar":
            self._ar_streak = 0
            return chosen
        self._ar_streak += 1
        drafting = self._candidate_lists(state.ctx.width)[1]
        if self._ar_streak < self._probe_after or not drafting:
            self._fast_ar = self._plain_ar_calls(bool(drafting))
            return chosen
        self._ar_streak = 0
        self._judge_probe = True
        # Probe conservatively: the narrowest drafting candidate of the best schedule (its estimate is the
        # least extrapolated from what AR calls left unobserved, and its calls cost the least if it fails).
        top = max(drafting, key=lambda c: self.rates.get(c.label, 0.0))
        return self._start_probe(min((c for c in drafting if c.kind == top.kind), key=lambda c: c.width))

    def _plain_ar_calls(self, probes: bool) -> int:
        """How many of the next calls are plain AR calls whatever happens, after one chosen as such.

        Until the next re-estimation (REFRESH_CALLS calls after the last) and the next probe (once the run of
        AR calls reaches the wait), :meth:`_choose` picks plain AR calls again, and those calls change nothing
        it reads: they check no draft.
        """
        calls = REFRESH_CALLS - 1 - self._since_refresh
        if probes:
            calls = min(calls, self._probe_after - 1 - self._ar_streak)
        return max(calls, 0)

    def _start_probe(self, candidate: Candidate) -> Candidate:
        self._probe = candidate
        self._probe_left = PROBE_CALLS - 1
        return candidate

    def _worth_trying(self, state: DecodeState, chosen: Candidate) -> Candidate | None:
        """The most promising candidate near the pick that is worth a trial of PROBE_CALLS calls, if any.

        A candidate is worth trying when its estimate is within PLAUSIBLE of the pick's and it rests on a
        guess: it was timed fewer than TIMED calls (with a measured cost model: only timed calls correct
        the prediction), or its farthest drafts were checked fewer than EXPLORED times by any request
        (their acceptance is the prior's, lowered by the falloff; see :mod:`specframe.choice.stats`).
        """
        timing = self._times is not None
        if timing and not self._times.seen(chosen.label):
            return None  # time the pick itself first
        best_rate = self.rates.get(chosen.label, 0.0)
        near = [
            c
            for c in self._candidate_lists(state.ctx.width)[0]
            if c != chosen
            and _near(c, chosen)
            and self.rates.get(c.label, 0.0) >= PLAUSIBLE * best_rate
            and ((timing and self._times.count(c.label) < TIMED) or self._unexplored(c))
        ]
        return max(near, key=lambda c: self.rates[c.label]) if near else None

    def _unexplored(self, candidate: Candidate) -> bool:
        """Whether ``candidate``'s farthest draft offset was checked fewer than EXPLORED times."""
        kind, width = candidate.kind, candidate.width
        needs = {"packed": [("prefix", width)], "linear": [("prefix", width)], "quadratic": [("branch", width + 1)]}
        needs["kbranch"] = [("prefix", width), ("branch", width + 1)]
        return any(self._stats.checked(source, offset) < EXPLORED for source, offset in needs.get(kind, ()))

    def _estimate(self, state: DecodeState) -> Candidate:
        """The best candidate: re-estimated every REFRESH_CALLS calls, over all of them every FULL_SCAN_CALLS.

        Between full scans only widths within NEIGHBOURHOOD of the current pick's (and plain AR calls) are
        re-estimated: throughput changes smoothly with the width, and a scan of every width costs milliseconds.
        """
        if self._chosen is not None and self._since_refresh < REFRESH_CALLS:
            return self._chosen
        context = state.start + len(state.tokens)  # positions the next calls' rows attend to, about
        times = self._times.revision if self._times is not None else 0
        if self._chosen is not None and self._learned == self._estimated and times == self._estimated_times:
            # No verification checked a draft and no candidate's timing bias moved since the last estimate;
            # only the context did. A neighbourhood scan would find what that one found, and a full scan is
            # due only once the context has moved CONTEXT_STEP positions.
            if self._since_scan < FULL_SCAN_CALLS or abs(context - self._estimated_context) < CONTEXT_STEP:
                self._since_refresh = 0
                return self._chosen
        self._estimated, self._estimated_times, self._estimated_context = self._learned, times, context
        self._estimates += 1
        candidates = self._candidate_lists(state.ctx.width)[0]
        if self._chosen is not None and self._since_scan < FULL_SCAN_CALLS:
            candidates = [c for c in candidates if _near(c, self._chosen)]
        else:
            self._since_scan = 0
        q = self._stats.rates()

        known: dict[int, float] = {}  # a scan asks for the same few row counts many times

        def seconds(rows: int) -> float:
            if rows not in known:
                known[rows] = self.cost.seconds(rows, context)
            return known[rows]

        chosen, rates = best(
            candidates,
            q,
            seconds,
            self._row_count,
            free_bonus=state.ctx.traits.free_bonus,
            k=self.k,
            correct=self._correct,
            scale=self._scale,
        )
        low = self._pessimist(q, seconds, state.ctx.traits.free_bonus)
        current = self._chosen
        if current is not None and chosen != current and current.label in rates:
            if self._switch_gain(current, chosen, low) <= 1 + SWITCH_MARGIN:
                chosen = current
        # Drafting must not be pessimistically worse than plain AR calls, once there is evidence to doubt:
        # before this decoder verified any draft, its estimate is the prior, and drafting is how it learns.
        if chosen.kind != "ar" and "ar" in rates and self._learned:
            if self._switch_gain(chosen, AR, low) > 1 + SWITCH_MARGIN:
                chosen = AR
        self._chosen = chosen
        self.rates.update(rates)
        self._since_refresh = 0
        return self._chosen

    def _switch_gain(self, current: Candidate, chosen: Candidate, low: Callable) -> float:
        """How many times the current pick's tokens per second switching to ``chosen`` gives, pessimistically.

        Both are rated by ``low`` (see :meth:`_pessimist`). A switch from plain AR calls to drafting also pays
        for one call that verifies nothing (no draft is stored): over the REFRESH_CALLS calls until the next
        estimate, that call adds one token instead of the steady state's ``T``, so the switch is credited
        ``1 - (T - 1) / (REFRESH_CALLS * T)`` of the steady rate.
        """
        tokens, rate = low(chosen)
        gain = rate / low(current)[1]
        if current.kind == "ar" and chosen.kind != "ar":
            gain *= 1 - (tokens - 1) / (REFRESH_CALLS * tokens)
        return gain

    def _pessimist(self, q: dict[str, list[float]], seconds: Callable[[int], float], free_bonus: bool) -> Callable:
        """``(tokens, rate)`` of a candidate with the acceptance CONFIDENCE_Z deviations below its estimate.

        Its predicted tokens are corrected by what its calls added and its seconds by what they took, as in
        the estimate; memoised for one estimate (the bounds are computed from the estimate ``q`` on the first
        call).
        """
        memo: dict[Candidate, tuple[float, float]] = {}
        bounds: list[dict[str, list[float]]] = []

        def rate(candidate: Candidate) -> tuple[float, float]:
            if candidate not in memo:
                if not bounds:
                    bounds.append(self._stats.lower_rates(CONFIDENCE_Z, q))
                tokens, spent = steady_state(
                    candidate, bounds[0], seconds, self._row_count, free_bonus=free_bonus, k=self.k
                )
                tokens *= self._tokens.factor(candidate.label)
                corrected = self._times.correct(candidate.label, spent) if self._times is not None else spent
                memo[candidate] = (tokens, tokens / corrected)
            return memo[candidate]

        return rate

    def _scale(self, label: str, predicted: float) -> float:
        """Tokens per call of ``label``: the prediction, corrected by what its calls added (CallTokens)."""
        self._predicted_tokens[label] = predicted
        return predicted * self._tokens.factor(label)

    def _correct(self, label: str, predicted: float) -> float:
        """Seconds per call of ``label``: the prediction, corrected by observed calls for a measured model."""
        self._predicted[label] = predicted
        return self._times.correct(label, predicted) if self._times is not None else predicted

    def _row_count(self, kind: str, width: int, kappa: int) -> int:
        """Rows of a steady-state call of ``kind`` at ``width`` verifying ``kappa`` drafts (memoised)."""
        key = (kind, width, kappa)
        if key not in self._rows:
            self._rows[key] = self._rows_of_plan(self._synthetic_plan(kind, width, kappa))
        return self._rows[key]

    def _synthetic_plan(self, kind: str, width: int, kappa: int) -> CallPlan:
        """The plan ``kind`` makes mid-request: one pending token, ``kappa`` stored drafts after it."""
        ctx = self._synthetic
        state = DecodeState((0, 0), 4 * (ctx.width + 2), ctx)
        state.pending = ((1, 0),)  # the prompt's first token is cached
        state.calls = 1
        state.width = max(width, 1)
        if kappa:
            proposals = Proposals(torch.zeros(kappa, dtype=torch.long), torch.ones(kappa))
            window = state.window()[:kappa]
            state.set_drafts({p: DraftRef(proposals, i) for i, p in enumerate(window)}, {})
        return self._schedules[kind].plan(state)


def _near(candidate: Candidate, pick: Candidate) -> bool:
    """Whether ``candidate`` is re-estimated (and may be tried) around ``pick``: AR, or a width near the pick's."""
    return candidate.kind == "ar" or abs(candidate.width - max(pick.width, 1)) <= NEIGHBOURHOOD


def _draft_offsets(state: DecodeState, plan: CallPlan) -> dict[int, tuple[str, int]]:
    """Source (``prefix`` or ``branch``) and offset of each stored draft token, from its draft group.

    The offset counts from the last position the group's context showed; a group is a prefix group when it
    drafts from the position right after that one, a branch when it skips an unknown verifier token.
    """
    groups = []
    pending = [p for p, _ in plan.pending]
    for group in plan.drafts:
        if group.targets:
            seen = pending + list(plan.chain_positions[: group.context])
            groups.append((group.targets, max(seen) if seen else group.targets[0] - 1))
    offsets = {}
    for position, ref in state.drafts.items():
        for targets, end in groups:
            rows = len(ref.proposals.token_list)
            if rows == len(targets) and ref.row < rows and targets[ref.row] == position:
                source = "prefix" if targets[0] == end + 1 else "branch"
                offsets[position] = (source, position - end)
                break
    return offsets


def auto_schedule(k: int = 2) -> AutoSchedule:
    """Factory of ``schedule: "auto"``: ar, packed, kbranch (``k`` groups) and quadratic, and their widths.

    Raises:
        ValueError: If ``k`` is not an integer >= 1.
    """
    return AutoSchedule(k)


@hookimpl
def register_schedules(register):
    """Register ``auto``."""
    register("auto", auto_schedule)
