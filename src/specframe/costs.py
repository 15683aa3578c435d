"""What a model call costs on this machine: a short calibration, fitted and cached on disk.

A call that evaluates R new rows costs about ``tau + delta * R`` seconds of model time (tau: the fixed cost
of a forward, reading the weights and launching kernels; delta: the cost per row once compute-bound), plus
the decoder's own work per call (planning, layout, acceptance: ``host_s``). Each row also attends to every
cached position, so a call costs more late in a long generation. :func:`calibrate` times forwards of a few
row counts against a cached prefix of :data:`CONTEXT` positions and against one of :data:`LONG_CONTEXT`, in
interleaved rounds (each round visits the (context, rows) pairs in a shuffled order, so a burst of load from
other processes hits all of them alike), keeps the fastest of each (what the machine does while other
processes leave it alone: the decoder scales the whole model by the load it observes, see
:class:`specframe.choice.stats.CallTimes`, so the table should describe the machine, not the load of the
moment it was measured), and fits tau and delta by least squares on the short context's values. The
values form two tables, one per context: :meth:`CostModel.seconds` interpolates in the rows within each
(beyond them it extrapolates with delta) and linearly in the context between them.

Cost models are cached per model identity, device, dtype, thread count, compilation and torch version,
under ``$SPECFRAME_CACHE_DIR`` (default: ``$XDG_CACHE_HOME/specframe`` or ``~/.cache/specframe``), so the
next process reuses them instead of calibrating again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from specframe.errors import ConfigError
from specframe.models.base import ModelBackend, ModelCall
from specframe.paths import cache_dir

#: Row counts a calibration times (clipped to what the model's context allows): the counts the narrow
#: candidates use (Packed-SS at W has 2 (W + 1) rows in the bundled family, Quadratic-SS at W = 1 six), so
#: that their costs are measured, not interpolated between 8 and 16, then a few wider ones.
ROW_COUNTS = (1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 24, 32, 64)
#: Cached prefix the calibration's rows attend to (the table's context).
CONTEXT = 64
#: The longer cached prefix the same row counts are also timed against, to measure the context term gamma
#: (a typical request's prompt plus a few hundred generated tokens).
LONG_CONTEXT = 320
#: Which quantile of each (context, rows) pair's timings the tables keep: the fastest. The median of a
#: calibration taken while other processes run is inflated by their bursts, and unevenly (short calls lose
#: relatively more to a descheduling than long ones), which flattens the table and favours wide drafts; so
#: does a lower quartile, less, with the ten or so rounds that time every narrow row count (a table of
#: quartiles taken at load 1 put a 10-row call at 1.59x a 1-row call; the fastest of 8 at load 3.6 said
#: 1.66-1.80x, and the bench measured 1.77x). The fastest timings describe the machine, the decoder's
#: observed load scales them, and the staleness check (:func:`shape_drift`) compares fastest with fastest.
QUANTILE = 0.0
#: A calibration's warm-up (one call of every timed pair) longer than this many seconds is not counted in its
#: time budget: on the compiled path the first call compiles the graph (tens of seconds on a small CPU), and
#: counting it left time for a single round, one sample per row count.
WARMUP_S = 1.0
#: Bump when the calibration procedure changes, so that old cache files are not reused.
VERSION = 3
#: A cached cost model is measured again when a quick check (:func:`shape_drift`) finds the cost of a call
#: of :data:`CHECK_ROWS` rows relative to a 1-row call off from the table's by more than this factor either
#: way: a uniform change (other processes, a slower clock) is the observed load's to absorb, but one that
#: changes the table's shape changes which width is best. Only gross drift is caught: at load 4 on the
#: 2-core CPU machine, checks right after a calibration read 1.07-1.20x its ratio (and one 2.05x), so a
#: tighter bound would measure again in every process; a table ruined by a burst during its calibration
#: (a 2-row call timed at 2.3x a 1-row call) is caught.
STALE_SHAPE = 1.25
#: The wider call of the staleness check (a Packed-SS call at W = 4 in the bundled family).
CHECK_ROWS = 10
#: Interleaved rounds of the staleness check (each one call of 1 row and one of CHECK_ROWS rows).
CHECK_ROUNDS = 8


@dataclass(frozen=True)
class CostModel:
    """Seconds per call as a function of the rows it evaluates.

    Attributes:
        tau: Fitted fixed model seconds per call.
        delta: Fitted model seconds per row.
        table: ``(rows, seconds)`` (the fastest of each) measured by the calibration, by increasing rows (may
            be empty: then ``tau + delta * rows`` is used everywhere).
        host_s: Decoder seconds per call outside the model (planning, layout, acceptance).
        context: Cached positions ``table`` (and tau, delta) were measured with.
        long_table: ``(rows, seconds)`` over ``long_context`` cached positions (may be empty: then the
            cost does not depend on the context).
        long_context: Cached positions ``long_table`` was measured with.
        key: What the model was calibrated for (model identity, device, dtype, threads, ...).
        calibration_s: How long the calibration took (0 for a synthetic or reused model).
        source: ``"calibrated"``, ``"cache"`` or ``"given"``.
        host_row_s: Decoder seconds per call per row, on top of ``host_s`` (a wide call lays out, reads and
            checks more than a plain AR call).
    """

    tau: float
    delta: float
    table: tuple[tuple[int, float], ...] = ()
    host_s: float = 0.0
    context: int = 0
    long_table: tuple[tuple[int, float], ...] = ()
    long_context: int = 0
    key: Mapping[str, Any] = field(default_factory=dict)
    calibration_s: float = 0.0
    source: str = "given"
    host_row_s: float = 0.0

    def seconds(self, rows: int, context: int | None = None) -> float:
        """Predicted seconds of one call of ``rows`` new rows, the decoder's own work included.

        Args:
            rows: New rows the call evaluates.
            context: Cached positions the rows attend to (``None``: the calibration's own context).
        """
        return self.model_seconds(rows, context) + self.host_s + self.host_row_s * rows

    def model_seconds(self, rows: int, context: int | None = None) -> float:
        """Predicted model seconds of a forward of ``rows`` new rows over ``context`` cached positions.

        Linear in the context through the two tables' values at ``rows`` (extrapolated beyond them, never
        below the short context's value).
        """
        short = _interpolate(self.table, rows, self.tau, self.delta)
        if context is None or not self.long_table or self.long_context <= self.context:
            return short
        long = _interpolate(self.long_table, rows, self.tau, self.delta)
        share = (context - self.context) / (self.long_context - self.context)
        return max(short + (long - short) * share, min(short, long))

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (as cached on disk and recorded by the bench)."""
        data = asdict(self)
        data["table"] = [list(entry) for entry in self.table]
        data["long_table"] = [list(entry) for entry in self.long_table]
        data["key"] = dict(self.key)
        return data

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> CostModel:
        """A cost model from :meth:`to_dict` output or a plain ``{"tau": ..., "delta": ...}`` mapping.

        Raises:
            ConfigError: If ``tau`` or ``delta`` is missing or not a finite number >= 0, or a key is unknown.
        """
        known = {"tau", "delta", "table", "host_s", "context", "long_table", "long_context", "key"}
        known |= {"calibration_s", "source", "host_row_s"}
        unknown = sorted(set(data) - known)
        if unknown:
            valid = ", ".join(sorted(known))
            raise ConfigError(f"cost model: unknown key(s) {', '.join(unknown)}; valid keys: {valid}")
        values = dict(data)
        for name in ("tau", "delta", "host_s", "host_row_s", "context", "long_context"):
            value = values.get(name, 0.0)
            if name in ("tau", "delta") and name not in values:
                raise ConfigError(f"cost model needs {name!r} (seconds), e.g. {{'tau': 0.007, 'delta': 0.0002}}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ConfigError(f"cost model {name} must be a number >= 0 and finite (seconds), got {value!r}")
        if values["tau"] + values["delta"] <= 0:
            raise ConfigError("cost model: tau + delta must be positive (a call cannot be free)")
        values["table"] = tuple((int(r), float(s)) for r, s in values.get("table", ()))
        values["long_table"] = tuple((int(r), float(s)) for r, s in values.get("long_table", ()))
        values["context"] = int(values.get("context", 0))
        values["long_context"] = int(values.get("long_context", 0))
        values.setdefault("source", "given")
        return cls(**values)

    def describe(self) -> str:
        """A few lines for people: the fit, the table, and what it was measured for."""
        lines = [
            f"cost per call = {1e3 * self.tau:.3f} ms + {1e3 * self.delta:.4f} ms x rows (model)"
            f" + {1e3 * self.host_s:.3f} ms + {1e3 * self.host_row_s:.4f} ms x rows (decoder)",
            f"cached positions attended to: {self.context} (table)"
            + (f", {self.long_context} (long table)" if self.long_table else ""),
            f"source: {self.source}" + (f", calibrated in {self.calibration_s:.2f} s" if self.calibration_s else ""),
        ]
        if self.table:
            longs = dict(self.long_table)
            lines.append("rows  model ms  fit ms" + (f"  at {self.long_context} positions" if longs else ""))
            lines += [
                f"{r:4d}  {1e3 * s:8.3f}  {1e3 * (self.tau + self.delta * r):6.3f}"
                + (f"  {1e3 * longs[r]:8.3f}" if r in longs else "")
                for r, s in self.table
            ]
        for name, value in self.key.items():
            lines.append(f"{name}: {value}")
        return "\n".join(lines)


def fit(table: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``tau, delta`` (both clipped at 0) of ``seconds = tau + delta * rows``."""
    if len(table) == 1:
        return table[0][1], 0.0
    xs = [float(r) for r, _ in table]
    ys = [s for _, s in table]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    delta = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var, 0.0) if var else 0.0
    return max(my - delta * mx, 0.0), delta


def model_key(model: ModelBackend) -> dict[str, Any]:
    """What a cost model depends on: the model's identity, device, dtype, threads, compilation, torch."""
    described = model.describe()
    network = getattr(model, "network", None)
    parameters = list(network.parameters()) if isinstance(network, torch.nn.Module) else []
    count = sum(p.numel() for p in parameters)
    sample = float(parameters[0].detach().flatten()[:64].double().sum()) if parameters else 0.0
    return {
        "model": described.get("name", model.name),
        "family": model.family,
        "parameters": count,
        "weights_sample": round(sample, 9),
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "path": str(getattr(model, "path", "eager")),  # eager or compiled forwards
        "torch": torch.__version__,
        "version": VERSION,
    }


def cache_path(key: Mapping[str, Any]) -> Path:
    """The cache file of a cost-model key."""
    digest = hashlib.sha256(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / "costs" / f"{digest}.json"


def load_cached(key: Mapping[str, Any]) -> CostModel | None:
    """The cached cost model for ``key``, or ``None`` (also for an unreadable or mismatching file)."""
    path = cache_path(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = CostModel.from_mapping(data)
    except (OSError, ValueError, ConfigError, TypeError):
        return None
    if dict(model.key) != dict(key):
        return None
    return replace(model, calibration_s=0.0, source="cache")


def save(cost: CostModel) -> Path | None:
    """Write ``cost`` to its cache file; returns the path, or ``None`` if the cache is not writable.

    An unwritable cache is no error (the cost model in hand still serves this process), but it is told once
    per process and folder with a :class:`UserWarning`: without a cache every process calibrates again.
    """
    path = cache_path(cost.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cost.to_dict(), indent=2), encoding="utf-8")
        tmp.replace(path)
    except OSError as error:
        if path.parent not in _UNWRITABLE:
            _UNWRITABLE.add(path.parent)
            warnings.warn(
                f"the cost model could not be cached in {path.parent} ({error.strerror or error}); every process "
                "will calibrate again (about 2 s). Make that folder writable, or set SPECFRAME_CACHE_DIR to one "
                "that is",
                stacklevel=2,
            )
        return None
    return path


#: Cache folders :func:`save` could not write to (each is warned about once per process).
_UNWRITABLE: set[Path] = set()


def calibrate(
    model: ModelBackend,
    *,
    budget_s: float = 1.8,
    limit_s: float = 2.2,
    rows: Sequence[int] = ROW_COUNTS,
    host_s: Callable[[], float | tuple[float, float]] | None = None,
    min_rounds: int = 3,
    max_rounds: int = 25,
) -> CostModel:
    """Time forwards of ``rows`` new rows against a short and a long cached prefix and fit the cost model.

    Args:
        model: The model to time.
        budget_s: Seconds to aim for, warm-up included: rounds continue until then or ``max_rounds``. A
            warm-up slower than :data:`WARMUP_S` (the compiled path compiles its graph in it) is not counted:
            the budgets then start after it, so that a compiled model gets as many rounds as an eager one.
        limit_s: Seconds after which no new round starts even below ``min_rounds`` (one round always runs).
        rows: Row counts to time.
        host_s: Measures the decoder's seconds per call outside the model (called once, timed separately):
            a number, or ``(seconds per call, seconds per row)``.
        min_rounds: Rounds to run even past the budget.
        max_rounds: Rounds to stop at within the budget.
    """
    started = time.perf_counter()
    context = min(CONTEXT, max(model.max_positions // 4, 1))
    counts = sorted({r for r in rows if context + r <= model.max_positions + 1})
    if not counts:
        raise ConfigError(f"model {model.name!r} has too small a context ({model.max_positions + 1}) to calibrate")
    # The long prefix, where the model's context leaves room for it (else gamma is not measured: 0).
    long_context = min(LONG_CONTEXT, model.max_positions + 1 - max(counts))
    contexts = (context, long_context) if long_context >= 2 * context else (context,)
    generator = torch.Generator().manual_seed(0)
    ordinary = [t for t in range(model.vocab_size) if t != model.mask_token_id] or [0]

    def tokens(n: int) -> torch.Tensor:
        picks = torch.randint(len(ordinary), (n,), generator=generator)
        return torch.tensor([ordinary[i] for i in picks.tolist()], dtype=torch.long, device=model.device)

    with torch.inference_mode():
        caches = {c: _prefilled(model, c, tokens(c), max(counts)) for c in contexts}
        inputs = {
            (c, r): (
                tokens(r),
                torch.arange(c, c + r, device=model.device),
                torch.ones(r, r, dtype=torch.bool, device=model.device).tril(),
                torch.arange(r, device=model.device),
            )
            for c in contexts
            for r in counts
        }

        def timed(pair: tuple[int, int]) -> float:
            ids, pos, attention, output = inputs[pair]
            _sync(model)
            start = time.perf_counter()
            model.forward(caches[pair[0]], ModelCall(ids, pos, attention, output))
            _sync(model)
            return time.perf_counter() - start

        order = list(inputs)
        for pair in order:  # warm-up: first calls allocate and pick kernels (and compile, on the compiled path)
            timed(pair)
        warmup_s = time.perf_counter() - started
        budget_started = started + warmup_s if warmup_s > WARMUP_S else started
        samples: dict[tuple[int, int], list[float]] = {pair: [] for pair in order}
        shuffle = random.Random(0)
        for round_index in range(max_rounds):
            elapsed = time.perf_counter() - budget_started
            if round_index and (elapsed > limit_s or (round_index >= min_rounds and elapsed > budget_s)):
                break
            shuffle.shuffle(order)
            for pair in order:
                samples[pair].append(timed(pair))
    fastest = {pair: _quantile(values, QUANTILE) for pair, values in samples.items()}
    table = tuple(_monotone([(r, fastest[context, r]) for r in counts]))
    tau, delta = fit(table)
    long_table: tuple[tuple[int, float], ...] = ()
    if len(contexts) == 2:  # a longer prefix never makes a call cheaper (a dip is noise)
        longer = _monotone([(r, fastest[long_context, r]) for r, _ in table])
        long_table = tuple((r, max(long, short)) for (r, long), (_, short) in zip(longer, table, strict=True))
    host = host_s() if host_s is not None else 0.0
    host, host_row = host if isinstance(host, tuple) else (host, 0.0)
    return CostModel(
        tau,
        delta,
        table,
        host_s=host,
        host_row_s=host_row,
        context=context,
        long_table=long_table,
        long_context=long_context if long_table else 0,
        key=model_key(model),
        calibration_s=time.perf_counter() - started,
        source="calibrated",
    )


def _prefilled(model: ModelBackend, context: int, ids: torch.Tensor, room: int) -> Any:
    """A cache holding ``context`` committed positions of ``ids``, with room for ``room`` more rows."""
    cache = model.new_cache(context + room + 1)
    causal = torch.ones(context, context, dtype=torch.bool, device=model.device).tril()
    positions = torch.arange(context, device=model.device)
    model.forward(cache, ModelCall(ids, positions, causal, positions[-1:]))
    cache.commit(list(range(context)), list(range(context)))
    return cache


def cost_model_for(
    model: ModelBackend,
    *,
    refresh: bool = False,
    host_s: Callable[[], float | tuple[float, float]] | None = None,
    announce: bool = True,
) -> CostModel:
    """The cached cost model of ``model``, calibrating (and caching) it first if there is none or it is stale.

    A cached model is stale when :func:`shape_drift` finds its table's shape off by more than
    :data:`STALE_SHAPE` (a check of a few tens of milliseconds, once per process and cache file). Unless
    ``announce`` is False, a calibration is announced with one line on stderr (:func:`announce_calibration`):
    the first run on a machine would otherwise pause for seconds without a word.
    """
    key = model_key(model)
    digest = cache_path(key).name
    if not refresh:
        cached = load_cached(key)
        if cached is not None:
            if digest in _CHECKED:  # checked (or measured) once by this process already
                return cached
            _CHECKED.add(digest)
            drift = shape_drift(model, cached)
            if drift is None or 1 / STALE_SHAPE <= drift <= STALE_SHAPE:
                return cached
            reason = "its cached measurement no longer fits this machine"
        else:
            reason = "not measured on this machine yet"
    else:
        reason = "asked to measure again"
    if announce:
        announce_calibration(model, reason)
    cost = calibrate(model, host_s=host_s)
    save(cost)
    _CHECKED.add(digest)
    return cost


def announce_calibration(model: ModelBackend, reason: str) -> None:
    """Say on stderr, in one line, that a calibration starts: what, why, how long, where it is cached.

    Args:
        model: The model being calibrated.
        reason: Why (no cached cost model, a stale one, a refresh).
    """
    print(
        f"specframe: measuring what a model call of {model.name or type(model).__name__!r} costs on this machine "
        f'({reason}), which width/schedule "auto" chooses by; this takes a few seconds, once: the result is '
        f"cached in {cache_dir() / 'costs'} (`specframe calibrate` does it ahead of time)",
        file=sys.stderr,
        flush=True,
    )


#: Cache files this process has checked for staleness or calibrated (each is checked once per process).
_CHECKED: set[str] = set()


def shape_drift(model: ModelBackend, cost: CostModel) -> float | None:
    """How far the cost of a wide call relative to a 1-row call now is from ``cost``'s table (1.0: as cached).

    Times :data:`CHECK_ROUNDS` interleaved pairs of forwards, 1 row and the table's largest row count up to
    :data:`CHECK_ROWS`, against the table's context, and compares the ratio of their fastest with the
    table's; a ratio outside :data:`STALE_SHAPE` is measured once more, and the one nearer 1 is returned (one
    check that a burst of load distorted does not throw a good table away). ``None`` when the table cannot
    be checked (no 1-row entry or no wider one up to CHECK_ROWS, no context).
    """
    rows = [r for r, _ in cost.table if 1 < r <= CHECK_ROWS]
    if not cost.table or cost.table[0][0] != 1 or not rows or cost.context < 1:
        return None
    if cost.context + rows[-1] > model.max_positions + 1:
        return None
    table = dict(cost.table)
    expected = table[rows[-1]] / table[1]
    drift = measure_ratio(model, cost.context, rows[-1], CHECK_ROUNDS) / expected
    if not 1 / STALE_SHAPE <= drift <= STALE_SHAPE:
        again = measure_ratio(model, cost.context, rows[-1], CHECK_ROUNDS) / expected
        drift = min(drift, again, key=lambda d: abs(math.log(d)))
    return drift


def measure_ratio(model: ModelBackend, context: int, rows: int, rounds: int) -> float:
    """The fastest forward of ``rows`` new rows over the fastest of 1 row, over ``context`` cached positions.

    The fastest, as the calibration keeps: timings cannot be faster than the machine, so a burst of load
    that falls on one of the two row counts moves the ratio little.
    """
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(model.vocab_size, (context + rows,), generator=generator)
    ids = ids.masked_fill(ids == model.mask_token_id, 0).to(model.device)
    samples: dict[int, list[float]] = {1: [], rows: []}
    with torch.inference_mode():
        cache = _prefilled(model, context, ids[:context], rows)
        inputs = {
            r: (
                ids[context : context + r],
                torch.arange(context, context + r, device=model.device),
                torch.ones(r, r, dtype=torch.bool, device=model.device).tril(),
                torch.arange(r, device=model.device),
            )
            for r in samples
        }
        for round_index in range(rounds + 1):  # the first round warms up
            for r in samples if round_index % 2 else reversed(list(samples)):
                _sync(model)
                start = time.perf_counter()
                model.forward(cache, ModelCall(*inputs[r]))
                _sync(model)
                if round_index:
                    samples[r].append(time.perf_counter() - start)
    return min(samples[rows]) / min(samples[1])


def _quantile(values: Sequence[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank from below: the minimum of up to 4 values at 0.25)."""
    ordered = sorted(values)
    return ordered[int(share * (len(ordered) - 1))]


def _interpolate(table: Sequence[tuple[int, float]], rows: int, tau: float, delta: float) -> float:
    """Seconds at ``rows`` from a ``(rows, seconds)`` table: linear between entries, ``delta`` beyond the last."""
    if not table:
        return tau + delta * rows
    if rows <= table[0][0]:
        return table[0][1]
    for (r0, s0), (r1, s1) in zip(table, table[1:], strict=False):
        if rows <= r1:
            return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
    last_rows, last_s = table[-1]
    return last_s + delta * (rows - last_rows)


def _monotone(table: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Timings made non-decreasing in rows by pooling adjacent violators (more rows never cost less).

    A dip or a spike is timing noise: pooling averages it with its neighbours, where carrying the highest
    value so far forward let one slow sample of a narrow count raise every wider count (a loaded calibration
    put rows 6 to 12 all at the 6-row sample's time).
    """
    blocks: list[list] = []  # [sum of seconds, count, rows]
    for rows, seconds in table:
        blocks.append([seconds, 1, [rows]])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count, pooled = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
            blocks[-1][2] += pooled
    return [(rows, total / count) for total, count, pooled in blocks for rows in pooled]


def _sync(model: ModelBackend) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
