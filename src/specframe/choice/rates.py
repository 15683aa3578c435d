"""Expected tokens per second of each candidate (schedule, width), from acceptance rates and call costs.

A candidate's throughput is its steady state's tokens per call over its seconds per call. The steady state
is a small Markov chain over the draft a call verifies, described by the draft tokens' offsets from their
context (see :mod:`specframe.choice.stats`):

* ``packed/wW``: the window is drafted from the prefix (offsets 1..W); after ``a`` tokens are added, the
  ``W - a`` left over (offsets ``a + 1 .. W``) are the next call's chain;
* ``quadratic/wW``: every call verifies a fresh branch (offsets 2..W + 1);
* ``kbranch/wW``: a fresh branch when the outcome is one of the ``k - 1`` longest, else Packed-SS's leftover;
* ``linear/wW``: two calls per iteration, the verified draft has offsets 1..W;
* ``ar``: one token per call.

Prefix drafts (Packed-SS's group) and branch drafts (Quadratic-SS's and k-branch's) have their own rates.
A chain with offsets ``d_1..d_kappa`` has ``h`` or more tokens accepted with probability
``q_{d_1} ... q_{d_h}``; the call adds ``h + 1`` tokens (``h`` when every verified rank held an accepted draft
and there is no bonus). Rows per call come from the family's layout through ``rows(kind, W, kappa)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

#: Kinds of candidate a chooser can pick.
KINDS = ("ar", "packed", "kbranch", "quadratic", "linear")


@dataclass(frozen=True)
class Candidate:
    """One (schedule, width) a call can be planned with.

    Attributes:
        kind: One of :data:`KINDS`.
        width: Speculative width (0 for ``ar``).
    """

    kind: str
    width: int

    @cached_property
    def label(self) -> str:
        """``packed/w4``, or ``ar`` (computed once: the choice asks for it several times a call)."""
        return "ar" if self.kind == "ar" else f"{self.kind}/w{self.width}"


def outcomes(offsets: Sequence[int], q: Sequence[float], num_verify: int) -> list[tuple[int, float]]:
    """``(tokens added, probability)`` of verifying a chain with ``offsets`` (``num_verify`` ranks scored)."""
    out = []
    survive = 1.0
    last = len(q) - 1
    for h, offset in enumerate(offsets):
        accept_next = q[offset if offset < last else last]
        p = survive * (1.0 - accept_next)
        if p > 0.0:
            out.append((h + 1 if h < num_verify else h, p))
        survive *= accept_next
    if survive > 0.0:
        h = len(offsets)
        out.append((h + 1 if h < num_verify else h, survive))
    return out


def throughput(
    candidate: Candidate,
    q: Mapping[str, Sequence[float]],
    seconds: Callable[[int], float],
    rows: Callable[[str, int, int], int],
    *,
    free_bonus: bool,
    k: int = 2,
) -> float:
    """Expected tokens per second of ``candidate`` in its steady state (see :func:`steady_state`)."""
    tokens, spent = steady_state(candidate, q, seconds, rows, free_bonus=free_bonus, k=k)
    return tokens / spent


def steady_state(
    candidate: Candidate,
    q: Mapping[str, Sequence[float]],
    seconds: Callable[[int], float],
    rows: Callable[[str, int, int], int],
    *,
    free_bonus: bool,
    k: int = 2,
) -> tuple[float, float]:
    """Expected tokens and seconds per call of ``candidate`` in its steady state.

    Args:
        candidate: The candidate.
        q: Conditional acceptance by offset (index 0 unused) of ``"prefix"`` and ``"branch"`` drafts.
        seconds: Seconds of one call of a given number of rows.
        rows: ``rows(kind, width, kappa)``: rows of a call of that kind verifying a chain of ``kappa``.
        free_bonus: Whether the family scores one extra position after a fully drafted window.
        k: Draft groups of ``kbranch``.
    """
    kind, width = candidate.kind, candidate.width
    if kind == "ar" or width == 0:
        return 1.0, seconds(rows("ar", 0, 0))
    fresh = tuple(range(2, width + 2))
    full_verify = width + 1 if free_bonus else width
    if kind == "linear":
        chain = tuple(range(1, width + 1))
        tokens = sum(a * p for a, p in outcomes(chain, q["prefix"], full_verify))
        return tokens / 2, (seconds(rows("linear", width, 0)) + seconds(rows("linear", width, width))) / 2
    if kind == "quadratic":
        tokens = sum(a * p for a, p in outcomes(fresh, q["branch"], full_verify))
        return tokens, seconds(rows("quadratic", width, width))
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
            target = width if a in branches else min(a, width) - 1
            transitions[state][target] += p
        costs[state] = seconds(rows(kind, width, len(chain)))
    pi = stationary(transitions)
    tokens = sum(p * g for p, g in zip(pi, gains, strict=True))
    spent = sum(p * c for p, c in zip(pi, costs, strict=True))
    return tokens, spent


def stationary(transitions: list[list[float]]) -> list[float]:
    """The long-run share of each state of a row-stochastic matrix, starting from the last state.

    With one recurrent class this is the stationary distribution; otherwise (certain acceptance can split
    the chain) it is the average distribution over many steps from the last state, a fresh draft.
    """
    size = len(transitions)
    if size == 1:
        return [1.0]
    if size <= SMALL:
        pi = _solve_small(transitions)
        if pi is not None:
            return pi
    matrix = torch.tensor(transitions, dtype=torch.float64).T - torch.eye(size, dtype=torch.float64)
    matrix[-1] = 1.0
    rhs = torch.zeros(size, dtype=torch.float64)
    rhs[-1] = 1.0
    try:
        pi = torch.linalg.solve(matrix, rhs)
        singular = not bool(torch.isfinite(pi).all())
    except RuntimeError:
        singular = True
    if singular:  # several recurrent classes: average the distributions of 256 steps from a fresh draft
        step = torch.tensor(transitions, dtype=torch.float64)
        current = torch.zeros(size, dtype=torch.float64)
        current[-1] = 1.0
        pi = torch.zeros(size, dtype=torch.float64)
        for _ in range(256):
            current = current @ step
            pi += current
    pi = pi.clamp(min=0.0)
    return (pi / pi.sum()).tolist()


#: Chains up to this many states are solved in Python (a torch call costs more than the arithmetic).
SMALL = 10


def _solve_small(transitions: list[list[float]]) -> list[float] | None:
    """Stationary distribution by Gaussian elimination with partial pivoting; ``None`` when singular."""
    n = len(transitions)
    # (P^T - I) pi = 0, with the last equation replaced by sum(pi) = 1.
    a = [[transitions[j][i] - (1.0 if i == j else 0.0) for j in range(n)] + [0.0] for i in range(n - 1)]
    a.append([1.0] * n + [1.0])
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        head = a[col]
        inv = 1.0 / head[col]
        for r in range(col + 1, n):
            factor = a[r][col] * inv
            if factor:
                row = a[r]
                for c in range(col, n + 1):
                    row[c] -= factor * head[c]
    pi = [0.0] * n
    for r in range(n - 1, -1, -1):
        pi[r] = (a[r][n] - sum(a[r][c] * pi[c] for c in range(r + 1, n))) / a[r][r]
    pi = [max(p, 0.0) for p in pi]
    total = sum(pi)
    return [p / total for p in pi] if total > 0 else None


def best(
    candidates: Sequence[Candidate],
    q: Mapping[str, Sequence[float]],
    seconds: Callable[[int], float],
    rows: Callable[[str, int, int], int],
    *,
    free_bonus: bool,
    k: int = 2,
    correct: Callable[[str, float], float] | None = None,
    scale: Callable[[str, float], float] | None = None,
) -> tuple[Candidate, dict[str, float]]:
    """The candidate with the highest expected tokens per second, and every candidate's rate by label.

    ``correct(label, predicted seconds per call)``, when given, replaces a prediction with what calls of
    that candidate were seen to take; ``scale(label, predicted tokens per call)`` likewise replaces the
    predicted tokens. Of candidates whose rates tie, the one of fewer rows per call (the narrower) wins.
    """
    rates = {}
    falling: dict[str, int] = {}
    previous: dict[str, float] = {}
    for c in sorted(candidates, key=lambda c: (c.kind, c.width)):
        if falling.get(c.kind, 0) >= 2:  # throughput is unimodal in the width: two drops in a row end the scan
            continue
        tokens, spent = steady_state(c, q, seconds, rows, free_bonus=free_bonus, k=k)
        if scale is not None:
            tokens = scale(c.label, tokens)
        rates[c.label] = tokens / (correct(c.label, spent) if correct else spent)
        falling[c.kind] = falling.get(c.kind, 0) + 1 if rates[c.label] < previous.get(c.kind, 0.0) else 0
        previous[c.kind] = rates[c.label]
    candidates = [c for c in candidates if c.label in rates]
    chosen = max(candidates, key=lambda c: (rates[c.label], -c.width))
    return chosen, rates
