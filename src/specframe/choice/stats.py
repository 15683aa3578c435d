"""Online acceptance statistics: how often a draft token is accepted, by where it was drafted from.

A draft token at offset ``d`` was proposed ``d`` positions after the last token its drafter saw. Packed-SS
drafts its window from the verified prefix (offsets 1..W; what is left after ``a`` tokens were added has
offsets ``a + 1 .. W``): those are *prefix* drafts. A Quadratic-SS or k-branch branch, conditioned on accepted
chain tokens, skips the verifier's still unknown token (offsets 2..W + 1): those are *branch* drafts, and
their acceptance can differ from prefix drafts at the same offset.

The statistic is the conditional acceptance ``q_d``: among checked draft tokens at offset ``d`` whose earlier
chain tokens were all accepted, the share accepted. Counts decay with every verification (recent drafts
weigh most, so the estimate follows the text being generated) and are blended with a prior: for prefix
drafts, the pooled counts of this decoder's earlier requests (:func:`default_prior` before the first);
for branch drafts, the prefix estimate (until branches have been observed, they are assumed as good). The
estimates never rise with the offset beyond 2: a farther draft is not more likely to be right. And where
no request has checked an offset beyond 2 yet, its neutral prior is lowered to :data:`FALLOFF` times the
estimate of the offset before it: what was drafted further from the context is accepted less often (in the
bundled models, a draft's second token is accepted far less often than its first), so a width whose
farthest drafts were never checked is not credited with them (the schedule tries such a width instead,
see :mod:`specframe.schedules.auto`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SOURCES = ("prefix", "branch")
#: Until it is observed, an offset beyond 2 is assumed this share as likely as the offset before it.
FALLOFF = 0.6


def default_prior(size: int) -> list[float]:
    """Acceptance by offset assumed before anything was observed: a coin flip, falling with the offset."""
    return [max(0.2, 0.5 - 0.03 * max(d - 1, 0)) for d in range(size + 1)]


class AcceptanceStats:
    """Decayed acceptance counts by draft source and offset, with priors.

    Args:
        size: Largest offset tracked (larger offsets share the last bucket).
        weight: Pseudo-observations a prior counts for.
        decay: Factor applied to the recent counts at each verification (0 < decay <= 1).
    """

    def __init__(self, size: int, *, weight: float = 3.0, decay: float = 0.97) -> None:
        self.size = size
        self.weight = weight
        self.decay = decay
        self.prior = self._blend([0.0] * (size + 1), [0.0] * (size + 1), default_prior(size), falloff=True)
        self._recent = {s: ([0.0] * (size + 1), [0.0] * (size + 1)) for s in SOURCES}
        self._scale = 1.0  # recent counts are stored divided by the decay so far (decayed lazily)
        self._pooled = {s: ([0.0] * (size + 1), [0.0] * (size + 1)) for s in SOURCES}

    def start_request(self) -> None:
        """Begin a request: the pooled prefix estimate so far becomes the prior, recent counts are cleared."""
        self.prior = self._blend(*self._pooled["prefix"], default_prior(self.size), falloff=True)
        self._recent = {s: ([0.0] * (self.size + 1), [0.0] * (self.size + 1)) for s in SOURCES}
        self._scale = 1.0

    def observe(self, chain: Sequence[tuple[str, int]], accepted: int) -> None:
        """Record one verification.

        Args:
            chain: ``(source, offset)`` of the chain's tokens, in rank order.
            accepted: How many leading chain tokens were accepted.
        """
        if not chain:
            return
        self._scale *= self.decay  # every recent count decays: one factor instead of a pass over them
        if self._scale < 1e-12:
            for counts in self._recent.values():
                for column in counts:
                    column[:] = [value * self._scale for value in column]
            self._scale = 1.0
        unit = 1.0 / self._scale
        for rank, (source, offset) in enumerate(chain):
            bucket = min(max(offset, 1), self.size)
            hit = rank < accepted
            recent, pooled = self._recent[source], self._pooled[source]
            recent[1][bucket] += unit
            pooled[1][bucket] += 1.0
            if hit:
                recent[0][bucket] += unit
                pooled[0][bucket] += 1.0
            else:
                break

    def _recent_counts(self, source: str) -> tuple[list[float], list[float]]:
        """The decayed recent (accepted, checked) counts of ``source`` by offset."""
        scale = self._scale
        return tuple([value * scale for value in column] for column in self._recent[source])

    def rates(self) -> dict[str, list[float]]:
        """``q_d`` for offsets ``0 .. size`` (index 0 unused) per source, blended with the priors."""
        prefix = self._blend(*self._recent_counts("prefix"), self.prior)
        branch = self._blend(*self._recent_counts("branch"), prefix)
        return {"prefix": prefix, "branch": branch}

    def lower_rates(self, z: float, mean: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
        """A lower confidence bound of each ``q_d``: the estimate less ``z`` of its standard deviations.

        The estimate is a Beta posterior's mean over the recent (decayed) counts plus the prior's
        pseudo-observations, so its deviation is ``sqrt(q (1 - q) / (n + 1))`` with ``n`` those counts together:
        wide early in a request and at offsets rarely checked, narrow where many verifications reached.
        Like the estimates, the bounds never rise with the offset beyond 2. ``mean``: :meth:`rates`, if the
        caller has it already.
        """
        mean = self.rates() if mean is None else mean
        out = {}
        for source in SOURCES:
            checked = self._recent_counts(source)[1]
            low: list[float] = []
            for d, q in enumerate(mean[source]):
                n = checked[d] + self.weight
                value = max(q - z * math.sqrt(q * (1.0 - q) / (n + 1.0)), 0.0)
                low.append(min(value, low[d - 1]) if d >= 3 else value)
            out[source] = low
        return out

    def checked(self, source: str, offset: int) -> float:
        """Draft tokens of ``source`` at ``offset`` checked so far, over every request (not decayed)."""
        return self._pooled[source][1][min(max(offset, 1), self.size)]

    def _blend(
        self, accepted: list[float], checked: list[float], prior: list[float], *, falloff: bool = False
    ) -> list[float]:
        """Counts blended with a prior; never rising beyond offset 2 (``falloff``: see the module)."""
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
            accepted, checked = self._pooled[source]
            out[f"{source}_acceptance_by_offset"] = [
                round(a / c, 4) if c else None for a, c in zip(accepted[1:], checked[1:], strict=True)
            ]
        return out


#: An observed call's ratio to its expectation is clipped to [1 / OUTLIER, OUTLIER] before it is averaged:
#: a call descheduled by another process's burst (several times its usual seconds) moves the load by a
#: bounded step instead of dominating it.
OUTLIER = 2.0


#: Timed calls from which a candidate's bias is learned; after them it is fixed (see :class:`CallTimes`).
LEARN_CALLS = 6
#: A learned bias counts only for what lies beyond this factor either way (``1.5`` counts as ``1.5 / 1.2``,
#: ``1.1`` as ``1``): a few learning calls on a shared machine meet load that is not the candidate's (short
#: calls lose relatively more to other processes than long ones), and acting on that steered choices away
#: from what the calibrated model, which already covers rows, context and the decoder's work per row, gets
#: right; a gross misprediction (a layout the table does not describe) is still corrected.
DEAD_BAND = 1.2


class CallTimes:
    """How far the observed seconds per call are from the cost model's predictions: overall and by candidate.

    The cost model is measured once, on synthetic calls; the decoder's real calls also pay for whatever
    else runs on the machine now (the same for every candidate) and for each candidate's own layout and
    bookkeeping. So the correction has two factors: the *load*, an exponential average of observed over
    predicted seconds, which follows the machine as it changes and scales every candidate alike (it never
    changes which candidate is best); and each candidate's *bias*, its own calls' ratio over the load, which
    does. The two cannot be told apart from one candidate's calls alone (a slower machine and a dearer
    layout look the same), so a candidate's bias is learned only from its first LEARN_CALLS timed calls,
    against the load that the other candidates' calls set (the first candidate ever timed is the reference,
    bias 1), and is then fixed; from then on its calls update the load. A candidate still learning is
    trusted in proportion to its calls; one not timed yet is predicted times the load. Only the part of a
    bias beyond :data:`DEAD_BAND` is acted on. Ratios, not seconds,
    are kept, so that the correction carries over as the prediction changes with the context length.

    Args:
        decay: Weight kept by the old load at each observation (it follows about ``1 / (1 - decay)`` calls).
        trust: Calls after which a learning candidate's bias counts as much as none (1.0).
    """

    def __init__(self, *, decay: float = 0.9, trust: float = 3.0) -> None:
        self.decay = decay
        self.trust = trust
        self.load = 1.0
        self._counts: dict[str, float] = {}
        self._bias: dict[str, float] = {}
        self._sums: dict[str, float] = {}
        self._seen_any = False
        #: Counts the changes of any candidate's bias (the load is left out: it scales every candidate
        #: alike), so that a chooser can tell whether a re-estimate could pick differently.
        self.revision = 0

    def observe(self, label: str, predicted: float | None, seconds: float, calls: int = 1) -> None:
        """``calls`` calls of ``label`` took ``seconds`` each on average (predicted: ``predicted``, if known).

        ``calls`` calls observed at once count as that many calls of the mean duration (the bias learns from
        as many of them as it still learns from, the load follows the rest), so that a run of calls known
        in advance can be timed as one span.
        """
        self._counts[label] = self._counts.get(label, 0.0) + calls
        if not predicted or calls < 1:
            return
        ratio = seconds / predicted
        if not self._seen_any:  # the first call sets the load, and its candidate is the reference
            self.load, self._seen_any = ratio, True
            self._bias[label], self._sums[label] = 1.0, float(LEARN_CALLS)
        expected = self.load * self._bias.get(label, 1.0)
        ratio = min(max(ratio, expected / OUTLIER), expected * OUTLIER)  # one stalled call moves little
        learned = self._sums.get(label, 0.0)
        if learned < LEARN_CALLS:  # still learning: a running mean of ratio / load; the load is left alone
            self.revision += 1
            learning = min(calls, LEARN_CALLS - learned)
            mean = self._bias.get(label, 1.0) * learned + learning * ratio / self.load
            self._sums[label] = learned + learning
            self._bias[label] = min(max(mean / (learned + learning), 1 / 3), 3.0)
            calls -= int(learning)
            if not calls:
                return
        kept = self.decay**calls
        self.load = kept * self.load + (1 - kept) * ratio / self._bias[label]

    def learning(self, label: str) -> bool:
        """Whether ``label``'s bias is still being learned (fewer than LEARN_CALLS timed calls of it)."""
        return self._sums.get(label, 0.0) < LEARN_CALLS

    def seen(self, label: str) -> bool:
        """Whether a call of ``label`` has been timed."""
        return label in self._counts

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


#: Calls' worth of predictions a candidate's realized-tokens factor is shrunk towards 1 with (see CallTokens).
TOKEN_PRIOR_CALLS = 32
#: A realized-tokens factor is kept within this factor either way.
TOKEN_CLIP = 1.25


class CallTokens:
    """How many tokens each candidate's calls added, against what the rate model predicted for them.

    The rate model's steady state assumes that acceptance at each offset is independent from call to call,
    which text need not honour (in the bundled model, Packed-SS at W = 3 was predicted about 1.47 tokens per
    call and added 1.39). Realized over predicted tokens, summed over a candidate's calls, scale its
    predicted tokens from then on. The ratio is shrunk towards its schedule's (all widths of the same
    schedule together, so that a width left for being over-predicted does not hand over to its untried
    neighbour at full credit), and that one towards 1, each by :data:`TOKEN_PRIOR_CALLS` calls' worth of
    predictions. The prediction a call is compared with is the one its candidate was chosen by, so the text
    both describe is the same; only calls whose previous call had the same candidate count (the first call
    after a switch verifies the previous candidate's draft).

    Args:
        prior_calls: Calls' worth of predictions each ratio is shrunk with.
    """

    def __init__(self, *, prior_calls: float = TOKEN_PRIOR_CALLS) -> None:
        self.prior_calls = prior_calls
        self._sums: dict[str, list[float]] = {}  # label or kind -> [predicted, realized, calls]

    def observe(self, label: str, predicted: float, realized: float) -> None:
        """A call of ``label`` (``kind/wW``) predicted to add ``predicted`` tokens added ``realized``."""
        for key in (label, _kind(label)):
            sums = self._sums.setdefault(key, [0.0, 0.0, 0])
            sums[0] += predicted
            sums[1] += realized
            sums[2] += 1

    def count(self, label: str) -> int:
        """Calls of ``label`` observed."""
        return int(self._sums.get(label, (0.0, 0.0, 0))[2])

    def factor(self, label: str) -> float:
        """Realized over predicted tokens of ``label``'s calls, shrunk to its schedule's, that one to 1."""
        pooled = self._shrunk(_kind(label), 1.0)
        return min(max(self._shrunk(label, pooled), 1 / TOKEN_CLIP), TOKEN_CLIP)

    def _shrunk(self, key: str, towards: float) -> float:
        sums = self._sums.get(key)
        if sums is None:
            return towards
        predicted, realized, calls = sums
        pseudo = self.prior_calls * predicted / calls
        return (realized + pseudo * towards) / (predicted + pseudo)


def _kind(label: str) -> str:
    return label.partition("/")[0]
