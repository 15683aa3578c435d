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
estimates never rise with the offset beyond 2: a farther draft is not more likely to be right.
"""

from __future__ import annotations

from collections.abc import Sequence

SOURCES = ("prefix", "branch")


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
        self.prior = default_prior(size)
        self._recent = {s: ([0.0] * (size + 1), [0.0] * (size + 1)) for s in SOURCES}
        self._pooled = {s: ([0.0] * (size + 1), [0.0] * (size + 1)) for s in SOURCES}

    def start_request(self) -> None:
        """Begin a request: the pooled prefix estimate so far becomes the prior, recent counts are cleared."""
        self.prior = self._blend(*self._pooled["prefix"], default_prior(self.size))
        self._recent = {s: ([0.0] * (self.size + 1), [0.0] * (self.size + 1)) for s in SOURCES}

    def observe(self, chain: Sequence[tuple[str, int]], accepted: int) -> None:
        """Record one verification.

        Args:
            chain: ``(source, offset)`` of the chain's tokens, in rank order.
            accepted: How many leading chain tokens were accepted.
        """
        if not chain:
            return
        for accepted_counts, checked_counts in self._recent.values():
            for d in range(self.size + 1):
                accepted_counts[d] *= self.decay
                checked_counts[d] *= self.decay
        for rank, (source, offset) in enumerate(chain):
            bucket = min(max(offset, 1), self.size)
            hit = rank < accepted
            for table in (self._recent, self._pooled):
                table[source][1][bucket] += 1.0
                if hit:
                    table[source][0][bucket] += 1.0
            if not hit:
                break

    def rates(self) -> dict[str, list[float]]:
        """``q_d`` for offsets ``0 .. size`` (index 0 unused) per source, blended with the priors."""
        prefix = self._blend(*self._recent["prefix"], self.prior)
        branch = self._blend(*self._recent["branch"], prefix)
        return {"prefix": prefix, "branch": branch}

    def _blend(self, accepted: list[float], checked: list[float], prior: list[float]) -> list[float]:
        w = self.weight
        out = [(accepted[d] + w * prior[d]) / (checked[d] + w) for d in range(self.size + 1)]
        for d in range(3, self.size + 1):  # offset 1 (Linear-SS only) and 2 are estimated freely
            out[d] = min(out[d], out[d - 1])
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


class CallTimes:
    """Seconds per call each candidate was seen to take, to correct the cost model's predictions.

    The cost model is measured once, on synthetic calls; the decoder's real calls of a candidate also pay
    for its layout, its acceptance and whatever else runs on the machine now. Each candidate's observed
    seconds per call (an exponential average) replaces its prediction once it has been seen a few times;
    candidates not seen yet are scaled by how far the seen ones were off, on average.

    Args:
        decay: Weight kept by the old average at each observation.
        trust: Observations after which a candidate's own average counts as much as the prediction.
    """

    def __init__(self, *, decay: float = 0.9, trust: float = 3.0) -> None:
        self.decay = decay
        self.trust = trust
        self._seconds: dict[str, float] = {}
        self._counts: dict[str, float] = {}
        self._ratios: dict[str, float] = {}

    def observe(self, label: str, predicted: float | None, seconds: float) -> None:
        """One call of ``label`` took ``seconds`` (predicted: ``predicted``, if known)."""
        old = self._seconds.get(label)
        self._seconds[label] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds
        self._counts[label] = self._counts.get(label, 0.0) + 1.0
        if predicted:
            self._ratios[label] = self._seconds[label] / predicted

    def seen(self, label: str) -> bool:
        """Whether a call of ``label`` has been timed."""
        return label in self._counts

    def correct(self, label: str, predicted: float) -> float:
        """The seconds per call to expect of ``label``, given the cost model's ``predicted``."""
        ratios = sorted(self._ratios.values())
        scale = min(max(ratios[len(ratios) // 2], 0.5), 3.0) if ratios else 1.0
        guess = predicted * scale
        seen = self._counts.get(label, 0.0)
        if not seen:
            return guess
        weight = seen / (seen + self.trust)
        return weight * self._seconds[label] + (1 - weight) * guess
