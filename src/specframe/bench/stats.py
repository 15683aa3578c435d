"""Paired percentile bootstrap over prompts (paper, appendix E.5).

Every statistic the benchmark reports is a function of per-method totals (tokens, wall time, NFE, correct
answers, ...) summed over prompts. A resample draws ``n`` prompt indices with replacement; the same draw is
used for every method and every quantity, and all repeated responses of a drawn prompt come with it. So a
resample is fully described by how often it drew each prompt, and the resampled totals of all quantities are
one matrix product ``counts @ per_prompt_totals``, computed in chunks::

    boot = PairedBootstrap({"tokens/packed": t_p, "wall/packed": w_p, "tokens/linear": t_l, "wall/linear": w_l})
    ratio = boot.estimate(lambda s: (s["tokens/packed"] / s["wall/packed"]) / (s["tokens/linear"] / s["wall/linear"]))
    print(ratio.estimate, ratio.low, ratio.high)

The interval is the percentile interval of the statistic recomputed on every resample; resamples where the
statistic is undefined (a zero denominator) are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_RESAMPLES = 20_000
DEFAULT_CONFIDENCE = 0.95
_CHUNK_CELLS = 4_000_000  # indices drawn per chunk: bounds memory at a few tens of MB


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap percentile interval.

    Attributes:
        estimate: The statistic on the observed prompts.
        low: Lower interval bound.
        high: Upper interval bound.
    """

    estimate: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        """``{"estimate", "low", "high"}`` (JSON-friendly; NaN for undefined values)."""
        return {"estimate": self.estimate, "low": self.low, "high": self.high}

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies inside the interval (bounds included)."""
        return self.low <= value <= self.high


def resample_counts(n: int, resamples: int, *, seed: int = 0) -> Iterator[np.ndarray]:
    """Per-resample draw counts of each of ``n`` prompts, in chunks.

    Each resample draws ``n`` indices uniformly with replacement; row ``b`` of a chunk counts how often each
    index was drawn in resample ``b``.

    Args:
        n: Number of prompts (>= 1).
        resamples: Total number of resamples.
        seed: Seed of the generator (the same seed gives the same resamples).

    Yields:
        ``[chunk, n]`` integer arrays whose rows each sum to ``n``.
    """
    if n < 1:
        raise ValueError("the bootstrap needs at least one prompt")
    rng = np.random.default_rng(seed)
    chunk = max(1, min(resamples, _CHUNK_CELLS // n))
    done = 0
    while done < resamples:
        size = min(chunk, resamples - done)
        indices = rng.integers(0, n, size=(size, n))
        flat = (indices + (np.arange(size) * n)[:, None]).ravel()
        yield np.bincount(flat, minlength=size * n).reshape(size, n)
        done += size


def bootstrap_sums(columns: np.ndarray, resamples: int = DEFAULT_RESAMPLES, *, seed: int = 0) -> np.ndarray:
    """Resampled column totals of a ``[prompts, quantities]`` matrix.

    Args:
        columns: Per-prompt totals, one column per quantity (all repeats of a prompt already summed).
        resamples: Number of resamples.
        seed: Generator seed.

    Returns:
        ``[resamples, quantities]``: the column sums of each resample (same prompt draw for all columns).
    """
    columns = np.asarray(columns, dtype=np.float64)
    if columns.ndim != 2:
        raise ValueError(f"columns must be a [prompts, quantities] matrix, got shape {columns.shape}")
    out = np.empty((resamples, columns.shape[1]))
    start = 0
    for counts in resample_counts(columns.shape[0], resamples, seed=seed):
        out[start : start + len(counts)] = counts @ columns
        start += len(counts)
    return out


def percentile_interval(draws: np.ndarray, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """The central percentile interval of finite ``draws`` (NaN bounds when none is finite)."""
    draws = np.asarray(draws, dtype=np.float64)
    finite = draws[np.isfinite(draws)]
    if finite.size == 0:
        return float("nan"), float("nan")
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


class PairedBootstrap:
    """Resampled totals of named per-prompt quantities, all from the same prompt draws.

    Args:
        quantities: Name -> per-prompt totals (all arrays of the same length ``n``).
        resamples: Number of resamples (the paper uses 20,000).
        seed: Generator seed.
        confidence: Interval coverage.
    """

    def __init__(
        self,
        quantities: Mapping[str, Any],
        *,
        resamples: int = DEFAULT_RESAMPLES,
        seed: int = 0,
        confidence: float = DEFAULT_CONFIDENCE,
    ) -> None:
        if not quantities:
            raise ValueError("PairedBootstrap needs at least one quantity")
        self.names = list(quantities)
        matrix = np.column_stack([np.asarray(quantities[name], dtype=np.float64) for name in self.names])
        self.prompts = matrix.shape[0]
        self.resamples = resamples
        self.seed = seed
        self.confidence = confidence
        self._point = matrix.sum(axis=0)
        self._draws = bootstrap_sums(matrix, resamples, seed=seed)

    def totals(self) -> dict[str, float]:
        """The observed totals of every quantity."""
        return {name: float(value) for name, value in zip(self.names, self._point, strict=True)}

    def draws(self, name: str) -> np.ndarray:
        """The resampled totals of one quantity (``[resamples]``)."""
        return self._draws[:, self.names.index(name)]

    def estimate(self, statistic: Callable[[Mapping[str, Any]], Any]) -> Estimate:
        """Evaluate ``statistic`` on the observed totals and on every resample.

        Args:
            statistic: Maps ``{name: total}`` to a value; it is called once with floats (the observed data)
                and once with ``[resamples]`` arrays, so write it with arithmetic that works on both.

        Returns:
            The observed value and its percentile interval.
        """
        with np.errstate(divide="ignore", invalid="ignore"):
            point = float(statistic({n: np.float64(v) for n, v in zip(self.names, self._point, strict=True)}))
            draws = np.asarray(statistic({n: self._draws[:, i] for i, n in enumerate(self.names)}), dtype=float)
        low, high = percentile_interval(draws, self.confidence)
        return Estimate(point, low, high)
