"""What the width chooser learns while it decodes: acceptance by draft offset, call times, call tokens.

A draft token's *offset* counts how many positions past the last position its drafter saw it was proposed.
*Prefix* drafts (Packed-SS's group, Linear-SS's drafting call) and *branch* drafts (Quadratic-SS's and
k-branch's groups) are counted apart. Per source and offset, the share of checked tokens that were accepted
is kept as decayed recent counts blended with a prior (what earlier requests pooled, or a neutral guess),
never rising beyond offset 2: a farther draft is not more likely to be right. Where no request has checked
an offset beyond 2 yet, its prior is lowered to :data:`FALLOFF` times the estimate of the offset before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SOURCES = ("prefix", "branch")
#: Until it is observed, an offset beyond 2 is assumed this share as likely as the offset before it.
FALLOFF = 0.6
#: An observed call's ratio to its expectation is clipped to within this factor of it before it is averaged
#: (a call another process stalled moves the load by a bounded step).
OUTLIER = 2.0
#: Timed calls from which a candidate's bias is learned; after them it is fixed (see :class:`CallTimes`).
LEARN_CALLS = 6
#: A learned bias counts only for what lies beyond this factor either way (1.5 counts as 1.5 / 1.2, 1.1 as 1).
DEAD_BAND = 1.2
#: Calls' worth of predictions a candidate's realized-tokens factor is shrunk towards 1 with (see CallTokens).
TOKEN_PRIOR_CALLS = 32
#: A realized-tokens factor is kept within this factor either way.
TOKEN_CLIP = 1.25


def default_prior(size: int) -> list[float]:
    """Acceptance by offset assumed before anything was observed: a coin flip, falling with the offset."""
    return [max(0.2, 0.5 - 0.03 * max(d - 1, 0)) for d in range(size + 1)]


def measured_prior(by_offset: Sequence[float], size: int) -> list[float]:
    """The prior of offsets ``0 .. size`` from a drafter's measured agreement at offsets 1, 2, ...

    Offsets beyond the measured ones fall by :data:`FALLOFF` per offset from the last one measured.
    """
    out = [0.5]  # offset 0 is never drafted
    for d in range(1, size + 1):
        out.append(float(by_offset[d - 1]) if d <= len(by_offset) else FALLOFF * out[-1])
    return out


#: Accepted and checked draft tokens by offset, per draft source.
PooledCounts = dict[str, tuple[list[float], list[float]]]


def _zeros(size: int) -> PooledCounts:
    return {s: ([0.0] * (size + 1), [0.0] * (size + 1)) for s in SOURCES}


class AcceptanceStats:
    """Decayed acceptance counts by draft source and offset, with priors.

    The *recent* counts are one request's; the *pooled* counts (never decayed) are what earlier requests
    checked, and become the prior of the next request. Requests that share learning share one pooled
    record (:meth:`pooled_record`): each request has an ``AcceptanceStats`` of its own built on it.

    Args:
        size: Largest offset tracked (larger offsets share the last bucket).
        weight: Pseudo-observations a prior counts for.
        decay: Factor applied to the recent counts at each verification (0 < decay <= 1).
        pooled: The pooled counts to read the prior from and add to (a fresh record by default).
        report: Pooled counts kept for reports only (:meth:`describe`, :meth:`checked`); ``pooled`` by default.
        base: The acceptance by offset ``0 .. size`` assumed before any request checked a draft:
            :func:`default_prior` unless given (:func:`measured_prior` of the drafter's measured agreement).
    """

    def __init__(
        self, size: int, *, weight: float = 3.0, decay: float = 0.97, pooled: PooledCounts | None = None,
        report: PooledCounts | None = None, base: Sequence[float] | None = None,
    ) -> None:  # fmt: skip
        self.size, self.weight, self.decay = size, weight, decay
        self.base = list(base) if base is not None else default_prior(size)
        if len(self.base) != size + 1:
            raise ValueError(f"a prior of offsets 0..{size} has {size + 1} values, got {len(self.base)}")
        self._pooled = self.pooled_record(size) if pooled is None else pooled
        self._report = self._pooled if report is None else report
        # Where each check is counted (never decayed): the pooled counts, and the report's when it is apart.
        self._totals = (self._pooled,) if self._report is self._pooled else (self._pooled, self._report)
        self.start_request()

    @staticmethod
    def pooled_record(size: int) -> PooledCounts:
        """Empty pooled counts for offsets up to ``size`` (to share between requests' statistics)."""
        return _zeros(size)

    def start_request(self) -> None:
        """Begin a request: the pooled prefix estimate so far becomes the prior, recent counts are cleared."""
        self.refresh_prior()
        self._recent, self._scale = _zeros(self.size), 1.0  # recent counts are stored divided by the decay so far

    def refresh_prior(self) -> None:
        """Make the pooled prefix estimate so far the prior (what requests learning together found since)."""
        self.prior = self._blend(*self._pooled["prefix"], self.base, falloff=True)

    def observe(self, chain: Sequence[tuple[str, int]], accepted: int) -> None:
        """Record one verification.

        Args:
            chain: ``(source, offset)`` of the chain's tokens, in rank order.
            accepted: How many leading chain tokens were accepted.
        """
        if not chain:
            return
        self.age()
        unit = 1.0 / self._scale
        for rank, (source, offset) in enumerate(chain):
            bucket = min(max(offset, 1), self.size)
            recent = self._recent[source]
            recent[1][bucket] += unit
            for counts in self._totals:
                counts[source][1][bucket] += 1.0
            if rank >= accepted:
                break
            recent[0][bucket] += unit
            for counts in self._totals:
                counts[source][0][bucket] += 1.0

    def age(self) -> None:
        """Decay the recent counts by one step (each verification does; so does a call that checked no draft).

        A request that turned to plain AR calls checks nothing, so without ageing the bad run that turned it
        would stay its estimate until a probe outweighed it; aged per call, it fades back towards the prior
        (what the other requests found) at the pace it would have faded while drafting.
        """
        self._scale *= self.decay  # every recent count decays: one factor instead of a pass over them
        if self._scale < 1e-12:
            for counts in self._recent.values():
                for column in counts:
                    column[:] = [value * self._scale for value in column]
            self._scale = 1.0

    def _recent_counts(self, source: str) -> tuple[list[float], list[float]]:
        return tuple([value * self._scale for value in column] for column in self._recent[source])

    def rates(self) -> dict[str, list[float]]:
        """``q_d`` for offsets ``0 .. size`` (index 0 unused) per source, blended with the priors."""
        prefix = self._blend(*self._recent_counts("prefix"), self.prior)
        return {"prefix": prefix, "branch": self._blend(*self._recent_counts("branch"), prefix)}

    def lower_rates(self, z: float, mean: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
        """A lower confidence bound of each ``q_d``: the estimate less ``z`` standard deviations.

        The deviation is a Beta posterior's, ``sqrt(q (1 - q) / (n + 1))`` with ``n`` the recent counts plus the
        prior's weight; like the estimates, the bounds never rise beyond offset 2.
        """
        mean = self.rates() if mean is None else mean
        out = {}
        for source in SOURCES:
            checked = self._recent_counts(source)[1]
            low: list[float] = []
            for d, q in enumerate(mean[source]):
                value = max(q - z * math.sqrt(q * (1.0 - q) / (checked[d] + self.weight + 1.0)), 0.0)
                low.append(min(value, low[d - 1]) if d >= 3 else value)
            out[source] = low
        return out

    def checked(self, source: str, offset: int) -> float:
        """Draft tokens of ``source`` at ``offset`` checked so far, over every request pooled (not decayed)."""
        return self._pooled[source][1][min(max(offset, 1), self.size)]

    def _blend(self, accepted, checked, prior, *, falloff: bool = False) -> list[float]:
        w = self.weight
        out = [(accepted[d] + w * prior[d]) / (checked[d] + w) for d in range(3)]
        for d in range(3, self.size + 1):  # offset 1 (Linear-SS only) and 2 are estimated freely
            guess = min(prior[d], FALLOFF * out[d - 1]) if falloff else prior[d]
            out.append(min((accepted[d] + w * guess) / (checked[d] + w), out[d - 1]))
        return out

    def describe(self) -> dict[str, object]:
        """Pooled acceptance by source and offset (JSON-friendly)."""
        out: dict[str, object] = {}
        for source in SOURCES:
            accepted, checked = self._report[source]
            out[f"{source}_acceptance_by_offset"] = [
                round(a / c, 4) if c else None for a, c in zip(accepted[1:], checked[1:], strict=True)
            ]
        return out


class CallTimes:
    """How far observed seconds per call are from the cost model's predictions: overall and by candidate.

    Two factors: the *load*, an exponential average of observed over predicted seconds, which follows the
    machine and scales every candidate alike; and each candidate's *bias*, its own calls' ratio over the
    load, learned from its first :data:`LEARN_CALLS` timed calls against the load the other candidates set
    (the first candidate timed is the reference) and then fixed, so that a burst of load while one candidate
    runs raises the load, not its bias. Only the part of a bias beyond :data:`DEAD_BAND` is acted on. Ratios,
    not seconds, are kept, so the correction carries over as the prediction changes with the context.

    Args:
        decay: Weight kept by the old load at each observation (it follows about ``1 / (1 - decay)`` calls).
        trust: Calls after which a learning candidate's bias counts as much as none (1.0).
    """

    def __init__(self, *, decay: float = 0.9, trust: float = 3.0) -> None:
        self.decay, self.trust, self.load = decay, trust, 1.0
        self._counts: dict[str, int] = {}
        self._bias: dict[str, float] = {}
        self._sums: dict[str, int] = {}  # calls the bias was learned from
        #: Counts the changes of any candidate's bias (not of the load, which scales all alike).
        self.revision = 0

    def observe(self, label: str | None, predicted: float | None, seconds: float) -> None:
        """A call of ``label`` took ``seconds`` (predicted: ``predicted``).

        ``label`` None: a forward shared with other requests, which moves only the load.
        """
        if label is not None:
            self._counts[label] = self._counts.get(label, 0) + 1
        if not predicted:
            return
        ratio = seconds / predicted
        if not self._bias and label is not None:  # the first call sets the load, its candidate is the reference
            self.load = ratio
            self._bias[label], self._sums[label] = 1.0, LEARN_CALLS
        bias = self._bias.get(label, 1.0)
        expected = self.load * bias
        ratio = min(max(ratio, expected / OUTLIER), expected * OUTLIER)  # one stalled call moves little
        learned = self._sums.get(label, 0) if label is not None else LEARN_CALLS
        if learned < LEARN_CALLS:  # still learning: a running mean of ratio / load; the load is left alone
            self.revision += 1
            self._sums[label] = learned + 1
            self._bias[label] = min(max((bias * learned + ratio / self.load) / (learned + 1), 1 / 3), 3.0)
        else:
            self.load = self.decay * self.load + (1 - self.decay) * ratio / bias

    def count(self, label: str) -> int:
        """How many calls of ``label`` have been timed."""
        return int(self._counts.get(label, 0))

    def correct(self, label: str, predicted: float) -> float:
        """The seconds per call to expect of ``label``, given the cost model's ``predicted``."""
        load = min(max(self.load, 0.5), 3.0)
        bias = self._bias.get(label)
        if bias is None:
            return predicted * load
        learned = self._sums[label]
        weight = 1.0 if learned >= LEARN_CALLS else learned / (learned + self.trust)
        counted = bias / DEAD_BAND if bias > DEAD_BAND else bias * DEAD_BAND if bias < 1 / DEAD_BAND else 1.0
        return predicted * load * (weight * counted + (1 - weight))


class CallTokens:
    """How many tokens each candidate's calls added, against what the rate model predicted for them.

    The rate model assumes acceptance independent from call to call, which text need not honour. Realized
    over predicted tokens, summed over a candidate's calls, scale its predicted tokens from then on, shrunk
    towards its schedule's ratio (all widths together, so a width left for being over-predicted does not hand
    over to its untried neighbour at full credit), and that one towards 1, each by ``prior_calls`` calls'
    worth of predictions, and clipped to :data:`TOKEN_CLIP`.
    """

    def __init__(self, *, prior_calls: float = TOKEN_PRIOR_CALLS) -> None:
        self.prior_calls = prior_calls
        self._sums: dict[str, list[float]] = {}  # label or schedule -> [predicted, realized, calls]

    def observe(self, label: str, predicted: float, realized: float) -> None:
        """A call of ``label`` (``name/wW``) predicted to add ``predicted`` tokens added ``realized``."""
        for key in (label, label.partition("/")[0]):
            sums = self._sums.setdefault(key, [0.0, 0.0, 0])
            sums[0] += predicted
            sums[1] += realized
            sums[2] += 1

    def count(self, label: str) -> int:
        """Calls of ``label`` observed."""
        return int(self._sums.get(label, (0.0, 0.0, 0))[2])

    def factor(self, label: str) -> float:
        """Realized over predicted tokens of ``label``'s calls, shrunk to its schedule's, that one to 1."""
        pooled = self._shrunk(label.partition("/")[0], 1.0)
        return min(max(self._shrunk(label, pooled), 1 / TOKEN_CLIP), TOKEN_CLIP)

    def _shrunk(self, key: str, towards: float) -> float:
        sums = self._sums.get(key)
        if sums is None:
            return towards
        predicted, realized, calls = sums
        pseudo = self.prior_calls * predicted / calls
        return (realized + pseudo * towards) / (predicted + pseudo)
