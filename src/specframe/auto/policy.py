"""The width chooser's policy: which candidate (schedule, width) plans the next call. No clocks, no model.

:class:`WidthPolicy` is fed numbers only: ``choose(context)`` before a call, ``observe_call`` with the call's
rows and seconds (the decoder times every forward) and ``observe_verification`` with what its verification
accepted. It estimates every candidate's tokens per second from acceptance statistics
(:mod:`specframe.auto.stats`), the steady-state chains (:mod:`specframe.auto.rates`) and the cost model
(:mod:`specframe.auto.costs`), and keeps the best, with hysteresis, pessimism towards drafting and probes.

Batching (the concurrency-aware choice): when the call was a forward shared with other requests
(``batch_rows`` given), a candidate's rows are costed as what they add to the other requests' rows,
``t(B + R) - t(B)``, so that wide drafts give way to narrow ones and plain AR calls as the batch fills up.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specframe.auto.costs import CostModel
from specframe.auto.rates import AR, Candidate, Rates, best, full_acceptance, steady_state
from specframe.auto.stats import LEARN_CALLS, AcceptanceStats, CallTimes, CallTokens, PooledCounts, measured_prior

#: Calls between two re-estimations of plain AR calls and the widths next to the current pick.
REFRESH_CALLS = 16
#: Draft verifications (the request's own and those of requests learning with it) after which the pick is
#: re-estimated before REFRESH_CALLS calls: a pick made on the prior must not outlive the evidence against it
#: (with 8 requests in flight, their first 16 calls all drafted on the first request's pick).
REFRESH_VERIFIED = 4
#: Calls between two re-estimations of every candidate.
FULL_SCAN_CALLS = 64
#: How far from the pick's width a re-estimation between full scans looks (a plain AR call counts as width 1).
NEIGHBOURHOOD = 1
#: Plain AR calls in a row after which a drafting call probes whether drafting pays again.
PROBE_AFTER = 16
#: Each probe after which AR calls still win doubles the wait before the next one, up to this many calls.
PROBE_AFTER_MAX = 128
#: Calls a probe (or a trial of a plausible candidate) lasts: the drafting call and the one verifying it.
PROBE_CALLS = 2
#: A candidate whose estimate is within this share of the pick's, timed fewer than TIMED calls or with its
#: farthest offset checked fewer than EXPLORED times, is tried: its estimate rests on a guess.
PLAUSIBLE = 0.85
TIMED = LEARN_CALLS
EXPLORED = 4
#: Hysteresis: the pick is replaced only by a candidate that beats it by more than this share.
SWITCH_MARGIN = 0.03
#: Switches are judged with the acceptance this many standard deviations below its estimate.
CONFIDENCE_Z = 0.5
#: Chains whose predicted tokens per call are corrected by what their calls added (CallTokens).
SCALED_KINDS = frozenset({"packed", "kbranch", "quadratic"})
#: Positions the context may move before a pick that nothing else moved is re-estimated.
CONTEXT_STEP = 64
#: The draft offsets whose checks decide a candidate's estimate, by chain (see ``_unexplored``).
FARTHEST = {"packed": ("prefix",), "linear": ("prefix",), "quadratic": ("branch",), "kbranch": ("prefix", "branch")}


@dataclass
class Learning:
    """What the requests of one width chooser learn together, held by its template :class:`WidthPolicy`.

    Each request chooses with a policy of its own (:meth:`WidthPolicy.for_request`); they share this record.
    Sharing is allowed only where the widths cannot change a request's output (greedy, left to right, exact
    rule): then what other requests taught changes how fast a request decodes, never what it decodes. Where the
    widths do change the output (sampling, any-order verification, a lossy rule) the policy is
    ``deterministic`` and every request learns alone, so its output is a function of its own prompt, settings
    and seed.

    Attributes:
        pooled: Acceptance by draft offset over the requests so far (the next request's prior).
        tokens: Realized over predicted tokens per candidate.
        times: Observed over predicted call seconds (``None`` where calls are not timed).
        rates: The latest throughput estimate of each candidate, by label (for reports; a request scans anew).
        verified: Verifications that checked a draft.
        batch_rows: Other requests' rows in the last forward a request shared (``None``: it ran alone).
        ar_streak: Plain AR calls chosen in a row since the last drafting call, over the requests (the probes'
            clock: many short requests still probe whether drafting pays again).
        probe_after: Plain AR calls in a row after which drafting is probed again.
    """

    pooled: PooledCounts
    tokens: CallTokens
    times: CallTimes | None
    rates: dict[str, float] = field(default_factory=dict)
    verified: int = 0
    batch_rows: int | None = None
    ar_streak: int = 0
    probe_after: int = PROBE_AFTER


class WidthPolicy:
    """Chooses among ``candidates`` by expected tokens per second.

    Args:
        candidates: What a call can be planned with (``AR`` for a plain AR call).
        rows: ``rows(candidate, kappa)``: the rows of a steady-state call of ``candidate`` verifying ``kappa``
            drafts (the model family's layout).
        size: Largest draft offset tracked.
        free_bonus: Whether the family scores one extra position after a fully drafted window.
        k: Draft groups of ``kbranch`` candidates.
        acceptance: The drafter's measured agreement at offsets 1, 2, ... (the model's
            ``drafter_acceptance``): the prior before any request checked a draft; ``None``: a neutral guess.
    """

    def __init__(
        self, candidates: Sequence[Candidate], rows: Callable[[Candidate, int], int], *, size: int,
        free_bonus: bool, k: int = 2, acceptance: Sequence[float] | None = None,
    ) -> None:  # fmt: skip
        self.candidates = list(dict.fromkeys(candidates))
        self.base_prior = None if acceptance is None else measured_prior(acceptance, size)
        self.drafting = [c for c in self.candidates if c.kind != "ar"]
        self.rows, self.size, self.free_bonus, self.k = rows, size, free_bonus, k
        self.cost: CostModel | None = None
        self.deterministic = False
        self._report = AcceptanceStats.pooled_record(size)  # acceptance of every request, for reports only
        self.reset()

    def bind(self, cost: CostModel, *, deterministic: bool) -> None:
        """Choose by ``cost``; a measured one is corrected by observed call times.

        ``deterministic``: nothing is timed, batches are ignored, every request starts from nothing learned.
        """
        self.cost, self.deterministic = cost, deterministic
        self.reset()

    def reset(self) -> None:
        """Forget everything learned (what this policy's requests share, and the current request's state)."""
        timed = self.cost is not None and not self.deterministic and self.cost.source not in ("given", "nominal")
        self.learning = Learning(AcceptanceStats.pooled_record(self.size), CallTokens(), CallTimes() if timed else None)
        self._begin()

    def for_request(self) -> WidthPolicy:
        """The policy of one request: its own choice state, and this policy's learning (see :class:`Learning`).

        A ``deterministic`` policy shares nothing that a choice reads: its request starts from nothing learned.
        """
        policy = copy.copy(self)
        policy.start_request()
        return policy

    def start_request(self) -> None:
        """A new request: the last pick carries over, re-estimated against its neighbours at the first call."""
        if self.deterministic:
            self.reset()
        else:
            self._begin()

    def _begin(self) -> None:
        """The state of one request, on what the shared learning holds."""
        learning = self.learning
        report = self._report if self.deterministic else None  # shared learning reports itself
        self.stats = AcceptanceStats(self.size, pooled=learning.pooled, report=report, base=self.base_prior)
        self.tokens, self.times = learning.tokens, learning.times
        #: The latest throughput estimate (tokens per second) of each candidate, by label.
        self.rates: dict[str, float] = {}
        # A request's pick is its own, from a full scan of what every request learned: carried over, a pick
        # made on other text held requests at plain AR calls (measured on SmolLM2: width auto planned 0.4
        # instead of 0.9 drafts per call). The probes' clock is shared (Learning.ar_streak).
        self.chosen: Candidate | None = None
        self.current: Candidate | None = None
        # Other requests' rows in the last shared forward: a new request starts from the last any request saw
        # (it shares its first forwards with them), so that its first choices already weigh the batch.
        self.batch_rows: int | None = learning.batch_rows
        self._probe, self._probe_left, self._judge_probe = AR, 0, False
        self._estimated = (-1, -1, 0, 0)  # (learned, timing revision, batch, context) at the last estimate
        self._estimates = 0
        self._untried: tuple[int, Candidate] | None = None  # (estimates, pick) when no trial was worth it
        self._predicted_tokens: dict[str, float] = {}
        self._expect: float | None = None
        self._last_label: str | None = None
        self._since_refresh = REFRESH_CALLS
        self._since_scan = 0 if self.chosen is not None else FULL_SCAN_CALLS

    # -- what happened ---------------------------------------------------------------------------------
    def observe_call(self, rows: int, seconds: float, context: int, batch_rows: int | None = None) -> None:
        """A steady-state call of the current pick took ``seconds`` of forward time for ``rows`` rows.

        ``batch_rows``: the rows of the whole forward when it was shared with other requests (``None``: alone).
        """
        if self.deterministic or self.cost is None:
            return
        shared = batch_rows is not None and batch_rows > rows
        self.batch_rows = self.learning.batch_rows = batch_rows - rows if shared else None
        if self.times is not None and self.current is not None:
            label = None if shared else self.current.label  # a shared forward tells the load only
            self.times.observe(label, self.cost.model_seconds(batch_rows if shared else rows, context), seconds)

    def observe_verification(self, chain: Sequence[tuple[str, int]], accepted: int, added: int) -> None:
        """The call verified drafts at these ``(source, offset)``: ``accepted`` held, ``added`` tokens in all.

        ``chain`` is empty for a call that checked no draft.
        """
        if chain:
            self.stats.observe(chain, min(accepted, len(chain)))
            self.learning.verified += 1
        else:
            self.stats.age()
        if self._expect is not None:
            self.tokens.observe(self.current.label, self._expect, added)
        self._since_refresh += 1
        self._since_scan += 1

    # -- choosing --------------------------------------------------------------------------------------
    def choose(self, context: int) -> Candidate:
        """The candidate for the next call, ``context`` positions into the request."""
        if self._probe_left:
            self._probe_left -= 1
            if not self._probe_left:
                self._since_refresh = REFRESH_CALLS  # re-estimate with what the probe found
            pick = self._probe
        else:
            pick = self._pick(context)
        repeated = pick.label == self._last_label and pick.kind in SCALED_KINDS
        self._expect = self._predicted_tokens.get(pick.label) if repeated else None
        self._last_label = pick.label
        self.current = pick
        return pick

    def _pick(self, context: int) -> Candidate:
        refreshed = self._since_refresh >= REFRESH_CALLS or self.chosen is None
        learning = self.learning
        chosen = self._estimate(context)
        if self._judge_probe:  # the estimate right after a probe of drafting from AR calls
            self._judge_probe = False
            failed = chosen.kind == "ar"
            learning.probe_after = min(2 * learning.probe_after, PROBE_AFTER_MAX) if failed else PROBE_AFTER
        if refreshed and (self._estimates, chosen) != self._untried:
            trial = self._worth_trying(chosen)
            if trial is not None:
                return self._start_probe(trial)
            if self.times is None or self.times.count(chosen.label):
                self._untried = (self._estimates, chosen)
        if chosen.kind != "ar":
            learning.ar_streak = 0
            return chosen
        learning.ar_streak += 1
        if learning.ar_streak < learning.probe_after or not self.drafting:
            return chosen
        if self.batch_rows and not self._drafting_can_pay(context):
            # In this batch no draft pays even if all of it is accepted: as a failed probe, look again later.
            learning.ar_streak, learning.probe_after = 0, min(2 * learning.probe_after, PROBE_AFTER_MAX)
            return chosen
        learning.ar_streak, self._judge_probe = 0, True
        # Probe conservatively: the narrowest drafting candidate of the best-rated schedule.
        top = max(self.drafting, key=lambda c: self.rates.get(c.label, 0.0))
        return self._start_probe(min((c for c in self.drafting if c.kind == top.kind), key=lambda c: c.width))

    def _drafting_can_pay(self, context: int) -> bool:
        """Whether some drafting candidate, every draft token accepted, would beat plain AR calls in this batch.

        Sharing a forward with other requests, a request's extra rows cost what they add to the whole batch's
        call; where that is more per token than an AR call's row even at full acceptance, a probe of drafting
        can only lose. Linear-SS's drafting call, which adds no token, is priced with its verification.
        """
        cost, batch = self.cost, self.batch_rows

        def seconds(rows: int) -> float:
            return cost.seconds(rows, context, batch)

        ar_rate = 1.0 / seconds(self.rows(AR, 0))
        for c in self.drafting:
            tokens, spent = full_acceptance(c, seconds, self.rows)
            if tokens / spent > ar_rate:
                return True
        return False

    def _start_probe(self, candidate: Candidate) -> Candidate:
        self._probe, self._probe_left = candidate, PROBE_CALLS - 1
        return candidate

    def _worth_trying(self, chosen: Candidate) -> Candidate | None:
        """The most promising candidate near the pick whose estimate is plausible and rests on a guess."""
        times = self.times
        if times is not None and not times.count(chosen.label):
            return None  # time the pick itself first
        floor = PLAUSIBLE * self.rates.get(chosen.label, 0.0)
        near = [
            c
            for c in self.candidates
            if c != chosen
            and _near(c, chosen)
            and self.rates.get(c.label, 0.0) >= floor
            and ((times is not None and times.count(c.label) < TIMED) or self._unexplored(c))
        ]
        return max(near, key=lambda c: self.rates[c.label]) if near else None

    def _unexplored(self, c: Candidate) -> bool:
        """Whether ``c``'s farthest draft offset was checked fewer than EXPLORED times."""
        return any(self.stats.checked(s, c.width + (s == "branch")) < EXPLORED for s in FARTHEST.get(c.kind, ()))

    def _estimate(self, context: int) -> Candidate:
        """The best candidate: re-estimated every REFRESH_CALLS calls (near the pick), all every FULL_SCAN_CALLS."""
        fresh_evidence = self.learning.verified - self._estimated[0] >= REFRESH_VERIFIED
        if self.chosen is not None and self._since_refresh < REFRESH_CALLS and not fresh_evidence:
            return self.chosen
        revision = self.times.revision if self.times is not None else 0
        batch = self.batch_rows.bit_length() if self.batch_rows else 0  # other requests' rows, by powers of 2
        learned = self.learning.verified
        if self.chosen is not None and (learned, revision, batch) == self._estimated[:3]:
            # Nothing learned and the batch about as wide since the last estimate; only the context moved.
            if self._since_scan < FULL_SCAN_CALLS or abs(context - self._estimated[3]) < CONTEXT_STEP:
                self._since_refresh = 0
                return self.chosen
        moved = learned != self._estimated[0]
        self._estimated = (learned, revision, batch, context)
        self._estimates += 1
        candidates = self.candidates
        if self.chosen is not None and self._since_scan < FULL_SCAN_CALLS:
            candidates = [c for c in candidates if _near(c, self.chosen)]
        else:
            self._since_scan = 0
        if moved and not self.deterministic:
            self.stats.refresh_prior()  # what the requests in flight with this one learned meanwhile
        q = self.stats.rates()
        known: dict[int, float] = {}  # a scan asks for the same few row counts many times

        def seconds(rows: int) -> float:
            if rows not in known:
                known[rows] = self.cost.seconds(rows, context, self.batch_rows)
            return known[rows]

        chosen, rates = best(
            candidates, q, seconds, self.rows, free_bonus=self.free_bonus, k=self.k,
            correct=self.times.correct if self.times is not None else None, scale=self._scale,
        )  # fmt: skip
        low = self._pessimist(q, seconds)
        current = self.chosen
        if current is not None and chosen != current and current.label in rates:
            if self._switch_gain(current, chosen, low) <= 1 + SWITCH_MARGIN:
                chosen = current
        # Drafting must not be pessimistically worse than plain AR calls once a draft was verified (before,
        # the estimate is the prior's, and drafting is how it learns).
        if chosen.kind != "ar" and "ar" in rates and learned:
            if self._switch_gain(chosen, AR, low) > 1 + SWITCH_MARGIN:
                chosen = AR
        self.chosen = chosen
        self.rates.update(rates)
        self.learning.rates.update(rates)
        self._since_refresh = 0
        return chosen

    def _switch_gain(self, current: Candidate, chosen: Candidate, low: Callable) -> float:
        """How many times the current pick's pessimistic rate switching to ``chosen`` gives.

        A switch from AR calls to drafting pays for one call that verifies nothing: over the REFRESH_CALLS calls
        until the next estimate it adds 1 token instead of ``T``: credited ``1 - (T - 1) / (REFRESH_CALLS T)``.
        """
        tokens, rate = low(chosen)
        gain = rate / low(current)[1]
        if current.kind == "ar" and chosen.kind != "ar":
            gain *= 1 - (tokens - 1) / (REFRESH_CALLS * tokens)
        return gain

    def _pessimist(self, q: Rates, seconds: Callable[[int], float]) -> Callable:
        """``(tokens, rate)`` of a candidate with the acceptance CONFIDENCE_Z deviations below ``q``."""
        memo: dict[Candidate, tuple[float, float]] = {}
        bounds: list[Rates] = []

        def rate(c: Candidate) -> tuple[float, float]:
            if c not in memo:
                if not bounds:
                    bounds.append(self.stats.lower_rates(CONFIDENCE_Z, q))
                tokens, spent = steady_state(c, bounds[0], seconds, self.rows, free_bonus=self.free_bonus, k=self.k)
                tokens *= self.tokens.factor(c.label)
                spent = self.times.correct(c.label, spent) if self.times is not None else spent
                memo[c] = (tokens, tokens / spent)
            return memo[c]

        return rate

    def _scale(self, label: str, predicted: float) -> float:
        self._predicted_tokens[label] = predicted
        return predicted * self.tokens.factor(label)


def _near(candidate: Candidate, pick: Candidate) -> bool:
    """Whether ``candidate`` is re-estimated around ``pick``: AR, or a width near the pick's."""
    return candidate.kind == "ar" or abs(candidate.width - max(pick.width, 1)) <= NEIGHBOURHOOD
