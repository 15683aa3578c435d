"""Expected tokens per second of each candidate (schedule, width), from acceptance rates and call costs.

A candidate's throughput is its steady state's tokens per call over its seconds per call. The steady state
is a small Markov chain over the draft a call verifies, described by the draft tokens' offsets from their
context (see :mod:`specframe.auto.stats`). A candidate's ``kind`` names its chain:

* ``packed``: the window is drafted from the prefix (offsets 1..W); after ``a`` tokens are added, the
  ``W - a`` left over (offsets ``a + 1 .. W``) are the next call's chain;
* ``quadratic``: every call verifies a fresh branch (offsets 2..W + 1);
* ``kbranch``: a fresh branch when the outcome is one of the ``k - 1`` longest, else Packed-SS's leftover;
* ``linear``: two calls per iteration, the verified draft has offsets 1..W;
* ``ar``: one token per call.

A chain with offsets ``d_1..d_kappa`` has ``h`` or more tokens accepted with probability
``q_{d_1} ... q_{d_h}``; the call adds ``h + 1`` tokens (``h`` when every verified rank held an accepted draft
and there is no bonus). Rows per call come from the family's layout through ``rows(candidate, kappa)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

#: The chains a candidate's ``kind`` can name.
KINDS = ("ar", "packed", "kbranch", "quadratic", "linear")

Rates = Mapping[str, Sequence[float]]


@dataclass(frozen=True)
class Candidate:
    """One (schedule, width) a call can be planned with.

    Attributes:
        kind: Its steady-state chain, one of :data:`KINDS`.
        width: Speculative width (0 for ``ar``).
        name: The name of the schedule that plans it (``""``: ``kind``), shown in its label.
    """

    kind: str
    width: int
    name: str = ""

    @cached_property
    def label(self) -> str:
        """``packed/w4``, or ``ar`` (computed once: the choice asks for it several times a call)."""
        return "ar" if self.kind == "ar" else f"{self.name or self.kind}/w{self.width}"


#: The plain AR call candidate.
AR = Candidate("ar", 0)


def outcomes(offsets: Sequence[int], q: Sequence[float], num_verify: int) -> list[tuple[int, float]]:
    """``(tokens added, probability)`` of verifying a chain with ``offsets`` (``num_verify`` ranks scored)."""
    out = []
    survive = 1.0
    last = len(q) - 1
    for h, offset in enumerate(offsets):
        accept_next = q[min(offset, last)]
        p = survive * (1.0 - accept_next)
        if p > 0.0:
            out.append((h + 1 if h < num_verify else h, p))
        survive *= accept_next
    if survive > 0.0:
        h = len(offsets)
        out.append((h + 1 if h < num_verify else h, survive))
    return out


def throughput(candidate: Candidate, q: Rates, seconds: Callable[[int], float], rows, *, free_bonus: bool, k=2):
    """Expected tokens per second of ``candidate`` in its steady state (see :func:`steady_state`)."""
    tokens, spent = steady_state(candidate, q, seconds, rows, free_bonus=free_bonus, k=k)
    return tokens / spent


def full_acceptance(
    candidate: Candidate, seconds: Callable[[int], float], rows: Callable[[Candidate, int], int]
) -> tuple[float, float]:
    """Tokens and seconds per call of ``candidate`` were every draft token accepted: the most it can do.

    Each drafting call then adds its ``W`` drafts and one verifier token; Linear-SS spends a drafting call
    that adds none on each verification, so its pair is averaged as in :func:`steady_state`.
    """
    kind, width = candidate.kind, candidate.width
    if kind == "ar" or width == 0:
        return 1.0, seconds(rows(candidate, 0))
    verify = seconds(rows(candidate, width))
    if kind == "linear":
        return (width + 1) / 2, (seconds(rows(candidate, 0)) + verify) / 2
    return float(width + 1), verify


def steady_state(
    candidate: Candidate,
    q: Rates,
    seconds: Callable[[int], float],
    rows: Callable[[Candidate, int], int],
    *,
    free_bonus: bool,
    k: int = 2,
) -> tuple[float, float]:
    """Expected tokens and seconds per call of ``candidate`` in its steady state.

    Args:
        candidate: The candidate.
        q: Conditional acceptance by offset (index 0 unused) of ``"prefix"`` and ``"branch"`` drafts.
        seconds: Seconds of one call of a given number of rows.
        rows: ``rows(candidate, kappa)``: rows of a call of ``candidate`` verifying a chain of ``kappa``.
        free_bonus: Whether the family scores one extra position after a fully drafted window.
        k: Draft groups of ``kbranch``.
    """
    kind, width = candidate.kind, candidate.width
    if kind == "ar" or width == 0:
        return 1.0, seconds(rows(candidate, 0))
    fresh = tuple(range(2, width + 2))
    full_verify = width + 1 if free_bonus else width
    if kind == "linear":
        tokens = sum(a * p for a, p in outcomes(range(1, width + 1), q["prefix"], full_verify))
        return tokens / 2, (seconds(rows(candidate, 0)) + seconds(rows(candidate, width))) / 2
    if kind == "quadratic":
        tokens = sum(a * p for a, p in outcomes(fresh, q["branch"], full_verify))
        return tokens, seconds(rows(candidate, width))
    # packed / kbranch: states 0..width-1 are "left over after a = state + 1", state `width` is a fresh branch.
    size = width + 1
    transitions = [[0.0] * size for _ in range(size)]
    gains = [0.0] * size
    costs = [0.0] * size
    for state in range(size):
        chain = fresh if state == width else tuple(range(state + 2, width + 1))
        m = full_verify if state == width else len(chain) + 1
        branches = range(max(2, m - k + 2), m + 1) if kind == "kbranch" else range(0)
        for a, p in outcomes(chain, q["branch" if state == width else "prefix"], m):
            gains[state] += a * p
            transitions[state][width if a in branches else min(a, width) - 1] += p
        costs[state] = seconds(rows(candidate, len(chain)))
    pi = stationary(transitions)
    return sum(p * g for p, g in zip(pi, gains, strict=True)), sum(p * c for p, c in zip(pi, costs, strict=True))


def stationary(transitions: list[list[float]]) -> list[float]:
    """The long-run share of each state of a row-stochastic matrix, starting from the last state.

    With one recurrent class this is the stationary distribution, solved by Gaussian elimination (the chains
    have at most 17 states: plain Python beats a tensor library's call overhead); otherwise (certain
    acceptance can split the chain) it is the average distribution over 256 steps from the last state.
    """
    n = len(transitions)
    # (P^T - I) pi = 0, with the last equation replaced by sum(pi) = 1.
    a = [[transitions[j][i] - (i == j) for j in range(n)] + [0.0] for i in range(n - 1)]
    a.append([1.0] * n + [1.0])
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return _averaged(transitions)
        a[col], a[pivot] = a[pivot], a[col]
        head = a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / head[col]
            if factor:
                row = a[r]
                for c in range(col, n + 1):
                    row[c] -= factor * head[c]
    pi = [0.0] * n
    for r in range(n - 1, -1, -1):
        pi[r] = max((a[r][n] - sum(a[r][c] * pi[c] for c in range(r + 1, n))) / a[r][r], 0.0)
    total = sum(pi)
    return [p / total for p in pi] if total > 0 else _averaged(transitions)


def _averaged(transitions: list[list[float]], steps_log2: int = 8) -> list[float]:
    """The average distribution over the first ``2 ** steps_log2`` steps from the last state.

    Summed by doubling (``S_2m = S_m + P^m S_m``), a handful of small matrix products: step by step in plain
    Python the 256 steps of a 17-state chain took about 9 ms, on every estimate that met a split chain.
    """
    import numpy as np

    p = np.asarray(transitions, dtype=np.float64)
    total, power = p.copy(), p.copy()  # sum of P^1 .. P^m, and P^m
    for _ in range(steps_log2):
        total, power = total + power @ total, power @ power
    row = total[-1]
    return (row / row.sum()).tolist()


def best(
    candidates: Sequence[Candidate],
    q: Rates,
    seconds: Callable[[int], float],
    rows: Callable[[Candidate, int], int],
    *,
    free_bonus: bool,
    k: int = 2,
    correct: Callable[[str, float], float] | None = None,
    scale: Callable[[str, float], float] | None = None,
) -> tuple[Candidate, dict[str, float]]:
    """The candidate with the highest expected tokens per second, and every candidate's rate by label.

    ``correct(label, predicted seconds per call)``, when given, replaces a prediction with what calls of
    that candidate were seen to take; ``scale(label, predicted tokens per call)`` likewise replaces the
    predicted tokens. Of candidates whose rates tie, the narrower wins. Throughput is unimodal in the width,
    so a schedule's widths are scanned upwards until two drops in a row.
    """
    rates: dict[str, float] = {}
    falling: dict[str, int] = {}
    previous: dict[str, float] = {}
    for c in sorted(candidates, key=lambda c: (c.label.partition("/")[0], c.width)):
        group = c.label.partition("/")[0]
        if falling.get(group, 0) >= 2:
            continue
        tokens, spent = steady_state(c, q, seconds, rows, free_bonus=free_bonus, k=k)
        if scale is not None:
            tokens = scale(c.label, tokens)
        rates[c.label] = tokens / (correct(c.label, spent) if correct else spent)
        falling[group] = falling.get(group, 0) + 1 if rates[c.label] < previous.get(group, 0.0) else 0
        previous[group] = rates[c.label]
    chosen = max((c for c in candidates if c.label in rates), key=lambda c: (rates[c.label], -c.width))
    return chosen, rates
