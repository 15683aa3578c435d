"""What a model call costs on this machine: ``t(R)`` of a call of R rows, calibrated once and cached on disk.

A call that evaluates R new rows costs about ``tau + delta * R`` seconds of model time (plus, where a cost
model is given, the decoder's own work per call, ``host_s`` and ``host_row_s``; a calibration times forwards
only, and runs no decoder); each row also attends to every cached position, so a call
costs more late in a long generation. :func:`calibrate` times forwards of a few row counts against a cached
prefix of :data:`CONTEXT` positions and one of :data:`LONG_CONTEXT`, in interleaved rounds (a shuffled order
per round), each call between two 1-row calls over the short prefix: the call's time over theirs is a ratio
that a burst of load lasting a few calls leaves alone, as it slows both sides. A count's value is the median
of its ratios times the fastest 1-row call: the shape ``t(R) / t(1)`` is what the choice depends on (the
chooser scales the whole model by the load it observes), and a per-count fastest timing, which swings by
itself with every lucky or unlucky sample, got that shape wrong on a shared machine. The values
form two tables, interpolated in the rows and linearly in the context. Cost models are cached per model
identity, device, dtype, threads, compilation and torch version under ``$SPECFRAME_CACHE_DIR/costs``.
Measurements behind the constants are on the Performance page of the docs.
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

#: Row counts a calibration times (clipped to the model's context): every count narrow candidates use, then
#: a few wider ones.
ROW_COUNTS = (1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 24, 32, 64)
#: Cached prefix the calibration's rows attend to (the table's context).
CONTEXT = 64
#: The longer cached prefix the same row counts are also timed against (the context term).
LONG_CONTEXT = 320
#: A warm-up (one call of every timed pair) longer than this is not counted in the time budget (a compile).
WARMUP_S = 1.0
#: Bump when the calibration procedure changes, so that old cache files are not reused. 4: calls of several
#: rows are timed with their drafting rows on the adapter. 5: a count's value is the median of its ratios to
#: the adjacent 1-row calls (times the fastest 1-row call), no longer its own fastest timing. 6: the key names
#: the build of specframe's kernels (a new build can change every call's cost: threads, fused layers). 7: the
#: key names the projections' weight formats (a model quantized at load, ``--quant q8_0``, has the parameters
#: of its float checkpoint and shared its table).
VERSION = 7
#: A cached table is measured again when a 10-row call over a 1-row call (the median of paired ratios, as in
#: :func:`calibrate`) is off from the table's ratio by more than this factor either way, twice (a uniform
#: slowdown is the observed load's to absorb).
STALE_SHAPE = 1.25
#: The wider call of the staleness check, and its interleaved rounds.
CHECK_ROWS = 10
CHECK_ROUNDS = 8


@dataclass(frozen=True)
class CostModel:
    """Seconds per call as a function of the rows it evaluates.

    Attributes:
        tau: Fitted fixed model seconds per call.
        delta: Fitted model seconds per row.
        table: ``(rows, seconds)`` measured by the calibration, by increasing rows (empty: the fit everywhere).
        host_s: Decoder seconds per call outside the model (planning, layout, acceptance), where given.
        context: Cached positions ``table`` was measured with.
        long_table: ``(rows, seconds)`` over ``long_context`` cached positions (empty: no context term).
        long_context: Cached positions ``long_table`` was measured with.
        key: What the model was calibrated for (model identity, device, dtype, threads, ...).
        calibration_s: How long the calibration took (0 for a synthetic or reused model).
        source: ``"calibrated"``, ``"cache"``, ``"nominal"`` or ``"given"``.
        host_row_s: Decoder seconds per call per row, on top of ``host_s``.
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

    def seconds(self, rows: int, context: int | None = None, batch_rows: int | None = None) -> float:
        """Predicted seconds of ``rows`` new rows of one request, the decoder's own work included.

        Args:
            rows: The request's new rows.
            context: Cached positions the rows attend to (``None``: the calibration's own context).
            batch_rows: Rows of other requests in the same forward (``None`` or 0: decoding alone). Their
                forward is paid anyway, so the rows cost the marginal ``t(B + R) - t(B)``.
        """
        model = self.model_seconds(rows, context)
        if batch_rows:
            model = self.model_seconds(batch_rows + rows, context) - self.model_seconds(batch_rows, context)
        return max(model, 1e-9) + self.host_s + self.host_row_s * rows

    def model_seconds(self, rows: int, context: int | None = None) -> float:
        """Predicted model seconds of a forward of ``rows`` new rows over ``context`` cached positions."""
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
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"cost model: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}"
            )
        values = dict(data)
        for name in ("tau", "delta", "host_s", "host_row_s", "context", "long_context"):
            value = values.get(name, 0.0)
            if name in ("tau", "delta") and name not in values:
                raise ConfigError(f"cost model needs {name!r} (seconds), e.g. {{'tau': 0.007, 'delta': 0.0002}}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ConfigError(f"cost model {name} must be a number >= 0 and finite (seconds), got {value!r}")
        if values["tau"] + values["delta"] <= 0:
            raise ConfigError("cost model: tau + delta must be positive (a call cannot be free)")
        for name in ("table", "long_table"):
            values[name] = tuple((int(r), float(s)) for r, s in values.get(name, ()))
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
        lines += [f"{name}: {value}" for name, value in self.key.items()]
        return "\n".join(lines)


#: The cost model the choice uses where the widths change the output and no ``cost`` is given: fixed numbers,
#: not this machine's timings, so the same request gives the same output on every machine. A call of R rows
#: costs ``1 + R / 32`` units (a 32-row call costs two 1-row calls); only ratios matter to the choice.
NOMINAL_COST = CostModel(tau=1.0, delta=1 / 32, source="nominal")


def fit(table: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``tau, delta`` (both clipped at 0) of ``seconds = tau + delta * rows``."""
    if len(table) == 1:
        return table[0][1], 0.0
    xs, ys = [float(r) for r, _ in table], [s for _, s in table]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    delta = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var, 0.0) if var else 0.0
    return max(my - delta * mx, 0.0), delta


def model_key(model: ModelBackend) -> dict[str, Any]:
    """What a cost model depends on: the model's identity, device, dtype, threads, compilation, torch."""
    network = getattr(model, "network", None)
    parameters = list(network.parameters()) if isinstance(network, torch.nn.Module) else []
    kernels = _kernel_report(model)
    return {
        "model": model.describe().get("name", model.name),
        "family": model.family,
        "parameters": sum(p.numel() for p in parameters),
        "weights_sample": round(float(parameters[0].detach().flatten()[:64].double().sum()), 9) if parameters else 0.0,
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "path": str(getattr(model, "path", "eager")),  # eager or compiled forwards
        "torch": torch.__version__,
        "kernels": kernels.get("build"),
        "formats": kernels.get("weights"),
        "version": VERSION,
    }


def _kernel_report(model: ModelBackend) -> dict[str, Any]:
    """``model``'s ``kernel_report`` (the kernels' build, the weights' formats), or ``{}`` where it has none."""
    report = getattr(model, "kernel_report", None)
    return report() if callable(report) else {}


def cache_path(key: Mapping[str, Any]) -> Path:
    """The cache file of a cost-model key."""
    digest = hashlib.sha256(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / "costs" / f"{digest}.json"


def load_cached(key: Mapping[str, Any]) -> CostModel | None:
    """The cached cost model for ``key``, or ``None`` (also for an unreadable or mismatching file)."""
    try:
        model = CostModel.from_mapping(json.loads(cache_path(key).read_text(encoding="utf-8")))
    except (OSError, ValueError, ConfigError, TypeError):
        return None
    return replace(model, calibration_s=0.0, source="cache") if dict(model.key) == dict(key) else None


#: Cache folders :func:`save` could not write to (each is warned about once per process).
_UNWRITABLE: set[Path] = set()


def save(cost: CostModel) -> Path | None:
    """Write ``cost`` to its cache file; returns the path, or ``None`` if the cache is not writable.

    An unwritable cache is no error, but it is told once per process and folder with a ``UserWarning``.
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


def _forward(
    model: ModelBackend, cache: Any, ids: torch.Tensor, start: int, output: torch.Tensor, drafting: bool = False
) -> None:
    """One causal forward of ``ids`` at positions ``start...`` (the one place this module calls the model).

    ``drafting``: a timed call of several rows marks all but its first as drafting rows where the model has an
    adapter, as a speculative call does (a one-row call is an AR call, which runs no adapter).
    """
    rows = ids.shape[0]
    positions = torch.arange(start, start + rows, device=model.device)
    attention = torch.ones(rows, rows, dtype=torch.bool, device=model.device).tril()
    adapter = None
    if drafting and rows > 1 and getattr(model, "has_adapter", False):
        adapter = torch.arange(rows, device=model.device) > 0
    model.forward(cache, ModelCall(ids, positions, attention, output, adapter_rows=adapter))


def _prefilled(model: ModelBackend, context: int, ids: torch.Tensor, room: int) -> Any:
    """A cache holding ``context`` committed positions of ``ids``, with room for ``room`` more rows."""
    cache = model.new_cache(context + room + 1)
    _forward(model, cache, ids, 0, torch.tensor([context - 1], device=model.device))
    cache.commit(list(range(context)), list(range(context)))
    return cache


def _timed(model: ModelBackend, cache: Any, ids: torch.Tensor, start: int) -> float:
    output = torch.arange(ids.shape[0], device=model.device)
    _sync(model)
    began = time.perf_counter()
    _forward(model, cache, ids, start, output, drafting=True)
    _sync(model)
    return time.perf_counter() - began


def calibrate(
    model: ModelBackend,
    *,
    budget_s: float = 1.8,
    limit_s: float = 2.2,
    rows: Sequence[int] = ROW_COUNTS,
    min_rounds: int = 3,
    max_rounds: int = 25,
) -> CostModel:
    """Time forwards of ``rows`` new rows against a short and a long cached prefix and fit the cost model.

    Each round times every (prefix, rows) pair once, in a shuffled order, each call between two 1-row calls
    over the short prefix (see :func:`_paired_ratios`); a pair's value is the fastest 1-row call times the
    median of its ratios.

    Args:
        model: The model to time.
        budget_s: Seconds to aim for, warm-up included unless it is slower than :data:`WARMUP_S`.
        limit_s: Seconds after which no new round starts even below ``min_rounds`` (one round always runs).
        rows: Row counts to time.
        min_rounds: Rounds to run even past the budget.
        max_rounds: Rounds to stop at within the budget.
    """
    started = time.perf_counter()
    context = min(CONTEXT, max(model.max_positions // 4, 1))
    counts = sorted({r for r in rows if context + r <= model.max_positions + 1})
    if not counts:
        raise ConfigError(f"model {model.name!r} has too small a context ({model.max_positions + 1}) to calibrate")
    long_context = min(LONG_CONTEXT, model.max_positions + 1 - max(counts))
    contexts = (context, long_context) if long_context >= 2 * context else (context,)
    generator = torch.Generator().manual_seed(0)
    ordinary = [t for t in range(model.vocab_size) if t != model.mask_token_id] or [0]

    def tokens(n: int) -> torch.Tensor:
        picks = torch.randint(len(ordinary), (n,), generator=generator).tolist()
        return torch.tensor([ordinary[i] for i in picks], dtype=torch.long, device=model.device)

    with torch.inference_mode():
        caches = {c: _prefilled(model, c, tokens(c), max(counts)) for c in contexts}
        inputs = {(c, r): tokens(r) for c in contexts for r in counts}
        # The reference every timed call sits between: a 1-row (AR) call over the short prefix.
        one = inputs[context, 1] if (context, 1) in inputs else tokens(1)

        def reference() -> float:
            return _timed(model, caches[context], one, context)

        def call(c: int, r: int) -> Callable[[], float]:
            return lambda: _timed(model, caches[c], inputs[c, r], c)

        order = [pair for pair in inputs if pair != (context, 1)]  # the reference's own ratio is 1
        reference()  # warm-up: first calls allocate and pick kernels (and compile, on the compiled path)
        for c, r in order:
            call(c, r)()
        warmup_s = time.perf_counter() - started
        budget_started = started + warmup_s if warmup_s > WARMUP_S else started
        ratios: dict[tuple[int, int], list[float]] = {pair: [] for pair in order}
        ones: list[float] = []
        shuffle = random.Random(0)
        for round_index in range(max_rounds):
            elapsed = time.perf_counter() - budget_started
            if round_index and (elapsed > limit_s or (round_index >= min_rounds and elapsed > budget_s)):
                break
            shuffle.shuffle(order)
            timings, round_ratios = _paired_ratios(reference, [call(c, r) for c, r in order])
            ones += timings
            for pair, ratio in zip(order, round_ratios, strict=True):
                ratios[pair].append(ratio)
    # The scale: the fastest of the many reference calls (one more per round than timed calls), the machine
    # without interference, as before. It multiplies every value alike, so it leaves the shape alone; a median
    # or low quantile would only add the load of the moment, which the chooser observes by itself.
    t1 = min(ones)

    def value(c: int, r: int) -> float:
        return t1 if (c, r) == (context, 1) else t1 * statistics.median(ratios[c, r])

    table = tuple(_monotone([(r, value(context, r)) for r in counts]))
    tau, delta = fit(table)
    long_table: tuple[tuple[int, float], ...] = ()
    if len(contexts) == 2:  # a longer prefix never makes a call cheaper (a dip is noise)
        longer = _monotone([(r, value(long_context, r)) for r in counts])
        long_table = tuple((r, max(long, short)) for (r, long), (_, short) in zip(longer, table, strict=True))
    return CostModel(
        tau,
        delta,
        table,
        context=context,
        long_table=long_table,
        long_context=long_context if long_table else 0,
        key=model_key(model),
        calibration_s=time.perf_counter() - started,
        source="calibrated",
    )


#: Cache files this process has checked for staleness or calibrated (each is checked once per process).
_CHECKED: set[str] = set()


def cost_model_for(model: ModelBackend, *, refresh: bool = False, announce: bool = True) -> CostModel:
    """The cached cost model of ``model``, calibrating (and caching) it first if there is none or it is stale.

    A cached model is stale when :func:`shape_drift` finds its table's shape off by more than
    :data:`STALE_SHAPE` (checked once per process and cache file). Unless ``announce`` is False, a
    calibration is announced with one line on stderr.
    """
    key = model_key(model)
    digest = cache_path(key).name
    reason = "asked to measure again"
    if not refresh:
        cached = load_cached(key)
        reason = "not measured on this machine yet"
        if cached is not None:
            if digest in _CHECKED:
                return cached
            _CHECKED.add(digest)
            drift = shape_drift(model, cached)
            if drift is None or 1 / STALE_SHAPE <= drift <= STALE_SHAPE:
                return cached
            reason = "its cached measurement no longer fits this machine"
    if announce:
        announce_calibration(model, reason)
    cost = calibrate(model)
    save(cost)
    _CHECKED.add(digest)
    return cost


def announce_calibration(model: ModelBackend, reason: str) -> None:
    """Say on stderr, in one line, that a calibration starts: what, why, how long, where it is cached."""
    print(
        f"specframe: measuring what a model call of {model.name or type(model).__name__!r} costs on this machine "
        f'({reason}), which width/schedule "auto" chooses by; this takes a few seconds, once: the result is '
        f"cached in {cache_dir() / 'costs'} (`specframe calibrate` does it ahead of time)",
        file=sys.stderr,
        flush=True,
    )


def shape_drift(model: ModelBackend, cost: CostModel) -> float | None:
    """How far a wide call over a 1-row call now is from ``cost``'s table (1.0: as cached), or ``None``.

    A ratio outside :data:`STALE_SHAPE` is measured once more and the one nearer 1 returned (one check that
    a burst of load distorted does not throw a good table away). ``None``: the table cannot be checked.
    """
    rows = [r for r, _ in cost.table if 1 < r <= CHECK_ROWS]
    if not cost.table or cost.table[0][0] != 1 or not rows or cost.context < 1:
        return None
    if cost.context + rows[-1] > model.max_positions + 1:
        return None
    expected = dict(cost.table)[rows[-1]] / cost.table[0][1]
    drift = measure_ratio(model, cost.context, rows[-1], CHECK_ROUNDS) / expected
    if not 1 / STALE_SHAPE <= drift <= STALE_SHAPE:
        again = measure_ratio(model, cost.context, rows[-1], CHECK_ROUNDS) / expected
        drift = min(drift, again, key=lambda d: abs(math.log(d)))
    return drift


def measure_ratio(model: ModelBackend, context: int, rows: int, rounds: int) -> float:
    """The median ratio of a forward of ``rows`` new rows to the 1-row forwards beside it, as :func:`calibrate`.

    Args:
        model: The model to time.
        context: Cached positions both calls attend to.
        rows: New rows of the wide call.
        rounds: Wide calls timed, each between two 1-row calls (after one warm-up call of each).
    """
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(model.vocab_size, (context + rows,), generator=generator)
    ids = ids.masked_fill(ids == model.mask_token_id, 0).to(model.device)
    with torch.inference_mode():
        cache = _prefilled(model, context, ids[:context], rows)

        def call(r: int) -> Callable[[], float]:
            return lambda: _timed(model, cache, ids[context : context + r], context)

        one, wide = call(1), call(rows)
        one()  # warm-up
        wide()
        _, ratios = _paired_ratios(one, [wide] * rounds)
    return statistics.median(ratios)


def _paired_ratios(
    reference: Callable[[], float], calls: Sequence[Callable[[], float]]
) -> tuple[list[float], list[float]]:
    """Time ``reference, calls[0], reference, calls[1], ..., reference``: every call between two references.

    Returns:
        The reference's seconds (one more than ``calls``), and each call's seconds over the mean of the two
        reference timings beside it: a burst of load that lasts a few calls slows both sides of its ratio alike,
        and the median over rounds leaves out the few ratios that a burst starting or ending mid-way skews.
    """
    before = reference()
    timings, ratios = [before], []
    for timed in calls:
        seconds = timed()
        after = reference()
        ratios.append(seconds / max((before + after) / 2, 1e-12))
        timings.append(after)
        before = after
    return timings, ratios


def _interpolate(table: Sequence[tuple[int, float]], rows: int, tau: float, delta: float) -> float:
    """Seconds at ``rows`` from a ``(rows, seconds)`` table: linear between entries, ``delta`` beyond the last."""
    if not table:
        return tau + delta * rows
    if rows <= table[0][0]:
        return table[0][1]
    for (r0, s0), (r1, s1) in zip(table, table[1:], strict=False):
        if rows <= r1:
            return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
    return table[-1][1] + delta * (rows - table[-1][0])


def _monotone(table: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Timings made non-decreasing in rows by pooling adjacent violators (a dip or spike is noise)."""
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
