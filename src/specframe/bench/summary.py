"""Aggregate statistics per method and paired comparisons against a baseline (paper, section 4 and E.5).

Per method, over the prompts that every method completed (all repeats):

* mean generated tokens, wall time and NFE per response (wall time as the consumer saw it, admission to last
  piece, as at every concurrency; the decoder's own for records without it);
* aggregate throughput = total tokens / total wall time = (tokens / NFE) / (time / NFE);
* tokens per NFE, time per NFE, model and non-model time and the non-model share of wall time;
* accuracy (share of graded responses that are correct) where the task has a grader;
* vLLM-style acceptance: drafts, draft tokens, accepted tokens, mean acceptance length (1 + accepted / drafts),
  acceptance rate and per-position acceptance.

Against the baseline, with 95% paired percentile bootstrap intervals over prompts: throughput ratio, wall-time
difference of means, tokens/NFE ratio, time/NFE ratio, NFE ratio and accuracy difference in points.

Each method also says whether it is exact (every response's decoder reproduced the verifier's output) and,
where neither it nor the baseline samples (greedy decoding), how many responses equal the baseline's token for
token, with the first divergence. A comparison is ``flagged`` when the method is not exact or a response
differs: its speed-up is not the same output faster.

**Concurrency.** A method runs at one concurrency (:class:`~specframe.bench.settings.Method`); it is compared
with the baseline *at the same concurrency*. Every method also gets per-request latency percentiles as the
consumer saw them (:mod:`specframe.bench.closed_loop`): time to first token (p50/p90/p99), inter-token latency
(p50/p90, one value per token) and latency, its mean planned width per call (``mean_width``), and its
throughput over the same method's at the lowest concurrency (``throughput_vs_lowest``). At
concurrency 1 the speed statistics are those above. At N > 1 the responses of a closed-loop run share model
calls, so they are not independent draws and a bootstrap over prompts would be wrong for anything timed:

* throughput is total tokens / total wall time of the method's closed-loop runs (one per repeat, one per
  shard), and its interval (and the throughput ratio's) is a paired bootstrap over *repeats* when there are
  several, else none: a point estimate from one run (``throughput_unit`` says which);
* ``mean_wall_s`` is the mean request latency (admission to last piece), and the per-call time columns and
  the wall-time and time/NFE comparisons are left out (``None``): a call's time is shared;
* tokens/NFE, NFE and accuracy, properties of each response, keep their bootstrap over prompts;
* ``same_as_unbatched`` counts the responses equal token for token to the same method's at the lowest
  concurrency run (the same seeds give the same tokens, sampling included): batching must not change output,
  and a comparison involving a method whose output changed is flagged.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specframe.bench.records import record_method
from specframe.bench.settings import Method
from specframe.bench.stats import DEFAULT_RESAMPLES, PairedBootstrap
from specframe.metrics import acceptance_rate, mean_acceptance_length

# Per-prompt quantities summed over repeats, taken from each record.
QUANTITIES = (
    "responses",
    "tokens",
    "wall",
    "model",
    "nfe",
    "graded",
    "correct",
    "drafts",
    "draft_tokens",
    "accepted",
)

# Comparison statistics: name -> (kind, function of (method sums, baseline sums)).
COMPARISONS: dict[str, tuple[str, Any]] = {
    "throughput_ratio": ("ratio", lambda m, b: (m["tokens"] / m["wall"]) / (b["tokens"] / b["wall"])),
    "wall_diff_s": ("difference", lambda m, b: m["wall"] / m["responses"] - b["wall"] / b["responses"]),
    "tokens_per_nfe_ratio": ("ratio", lambda m, b: (m["tokens"] / m["nfe"]) / (b["tokens"] / b["nfe"])),
    "time_per_nfe_ratio": ("ratio", lambda m, b: (m["wall"] / m["nfe"]) / (b["wall"] / b["nfe"])),
    "nfe_ratio": ("ratio", lambda m, b: (m["nfe"] / m["responses"]) / (b["nfe"] / b["responses"])),
    "accuracy_diff_points": (
        "difference",
        lambda m, b: 100 * (m["correct"] / m["graded"] - b["correct"] / b["graded"]),
    ),
}


def record_quantities(record: Mapping[str, Any]) -> dict[str, float]:
    """The per-response values of :data:`QUANTITIES` for one record."""
    metrics = record["metrics"]
    acceptance = metrics.get("acceptance", {})
    correct = record.get("correct")
    # What the consumer saw (admission to last piece) where the run recorded it, at every concurrency; the
    # decoder's own wall (records made without a consumer clock) otherwise.
    wall = record.get("latency_s")
    return {
        "responses": 1.0,
        "tokens": float(metrics["generated_tokens"]),
        "wall": float(metrics["wall_s"] if wall is None else wall),
        "model": float(metrics["model_s"]),
        "nfe": float(metrics["nfe"]),
        "graded": 0.0 if correct is None else 1.0,
        "correct": 1.0 if correct else 0.0,
        "drafts": float(acceptance.get("num_drafts", 0)),
        "draft_tokens": float(acceptance.get("draft_tokens", 0)),
        "accepted": float(acceptance.get("accepted_tokens", 0)),
    }


def complete_prompts(records: Sequence[Mapping[str, Any]], methods: Sequence[Method], repeats: int) -> list[int]:
    """Prompt indices for which every method has all ``repeats`` responses."""
    seen: dict[int, set[tuple[Method, int]]] = defaultdict(set)
    for record in records:
        seen[int(record["prompt_index"])].add((record_method(record), int(record["repeat"])))
    needed = {(m, r) for m in methods for r in range(repeats)}
    return sorted(p for p, have in seen.items() if needed <= have)


def pair_baseline(method: Method, baseline: str, methods: Sequence[Method]) -> Method | None:
    """The baseline method ``method`` is compared with (``None`` for the baseline's own variants).

    ``baseline`` is a method label (``linear/w8``) or a schedule name (``linear``); for a schedule name a
    method is paired with the baseline at its own width when that exists, otherwise with the baseline's first.
    The baseline is always taken at ``method``'s concurrency.
    """
    exact = Method.parse(baseline)
    candidates = [
        m
        for m in methods
        if m.schedule == exact.schedule and exact.width in (None, m.width) and m.concurrency == method.concurrency
    ]
    if not candidates or method.schedule == exact.schedule:
        return None
    same_width = [m for m in candidates if m.width == method.width]
    return (same_width or candidates)[0]


def unbatched_reference(method: Method, methods: Sequence[Method]) -> Method | None:
    """The same schedule and width at the lowest concurrency run (``None`` for that one itself)."""
    lowest = min((m.concurrency for m in methods if m.at(1) == method.at(1)), default=method.concurrency)
    return None if lowest == method.concurrency else method.at(lowest)


def summarize(
    records: Sequence[Mapping[str, Any]],
    methods: Sequence[Method],
    *,
    baseline: str,
    repeats: int,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Per-method statistics and paired comparisons, JSON-friendly.

    Args:
        records: Response records (see :mod:`specframe.bench.records`).
        methods: The compared methods, in report order.
        baseline: Baseline method label or schedule name.
        repeats: Responses per prompt and method in a complete prompt.
        resamples: Bootstrap resamples (20,000 in the paper).
        seed: Bootstrap seed.
        confidence: Interval coverage.

    Returns:
        A dict with the keys ``prompts``, ``incomplete_prompts``, ``responses_per_method``, ``baseline``,
        ``bootstrap``, ``methods`` and ``comparisons``; ``methods`` and ``comparisons`` are lists of flat dicts.
    """
    prompts = complete_prompts(records, methods, repeats)
    all_prompts = {int(r["prompt_index"]) for r in records}
    position = {p: i for i, p in enumerate(prompts)}
    table = {f"{m.label}:{q}": np.zeros(len(prompts)) for m in methods for q in QUANTITIES}
    positions: dict[Method, list[np.ndarray]] = defaultdict(list)
    rows_max: dict[Method, int] = defaultdict(int)
    chosen: dict[Method, dict[str, Counter]] = defaultdict(lambda: {"widths": Counter(), "schedules": Counter()})
    timings: dict[Method, dict[str, list[float]]] = defaultdict(lambda: {"ttft": [], "itl": [], "latency": []})
    loops: dict[Method, dict[str, tuple[int, float, float]]] = defaultdict(dict)  # id -> (repeat, tokens, wall)
    wanted = set(methods)
    for record in records:
        method, row = record_method(record), position.get(int(record["prompt_index"]))
        if row is None or method not in wanted or int(record["repeat"]) >= repeats:
            continue
        for name, value in record_quantities(record).items():
            table[f"{method.label}:{name}"][row] += value
        _collect_timing(timings[method], record)
        loop = record.get("loop")
        if method.concurrency > 1 and loop:
            loops[method][str(loop["id"])] = (
                int(record["repeat"]),
                float(loop["output_tokens"]),
                float(loop["wall_s"]),
            )
        counts = record.get("acceptance_positions") or {}
        positions[method].append(np.array([counts.get("reached", []), counts.get("accepted", [])], dtype=float))
        rows_max[method] = max(rows_max[method], int(record["metrics"].get("rows_per_call_max", 0)))
        for name, histogram in chosen[method].items():
            histogram.update(record["metrics"].get(name) or {})
    batched = any(m.concurrency > 1 for m in methods)
    summary: dict[str, Any] = {
        "prompts": len(prompts),
        "incomplete_prompts": len(all_prompts) - len(prompts),
        "responses_per_method": len(prompts) * repeats,
        "baseline": baseline,
        "bootstrap": {"resamples": resamples, "confidence": confidence, "seed": seed, "unit": "prompt"},
        "methods": [],
        "comparisons": [],
    }
    if batched:  # how throughput at concurrency > 1 is estimated (see the module docstring)
        summary["bootstrap"]["closed_loop_unit"] = "repeat" if repeats > 1 else None
    if not prompts:
        return summary
    boot = PairedBootstrap(table, resamples=resamples, seed=seed, confidence=confidence)
    totals = boot.totals()
    runs = _RunTotals(loops, methods, repeats, resamples=resamples, seed=seed, confidence=confidence)
    outputs = _outputs(records, wanted, set(prompts), repeats)
    agreement = {m: _agreement(m, pair_baseline(m, baseline, methods), outputs) for m in methods}
    unbatched = {
        m: _agreement(m, unbatched_reference(m, methods), outputs, sampled_too=True) if m.concurrency > 1 else None
        for m in methods
    }
    for method in methods:
        sums = {q: totals[f"{method.label}:{q}"] for q in QUANTITIES}
        stats = _method_stats(method, sums, _position_rates(positions[method]), rows_max[method])
        stats["exact"] = _exact(outputs, method)
        stats["same_as_baseline"] = agreement[method]
        stats["widths"] = dict(sorted(chosen[method]["widths"].items(), key=lambda item: int(item[0])))
        stats["schedules"] = dict(chosen[method]["schedules"].most_common())
        stats["mean_width"] = _mean_width(chosen[method]["widths"])
        stats.update(_latency_stats(timings[method]))
        stats["mean_latency_s"] = float(np.mean(timings[method]["latency"])) if timings[method]["latency"] else None
        if method.concurrency == 1:
            rate = boot.estimate(lambda s, m=method: s[f"{m.label}:tokens"] / s[f"{m.label}:wall"])
            stats["throughput_ci"], stats["throughput_unit"] = _ci(rate), "prompt"
        else:
            stats.update(_batched_stats(method, stats, runs))
            stats["same_as_unbatched"] = unbatched[method]
        summary["methods"].append(stats)
    rates = {m: stats["throughput_tok_s"] for m, stats in zip(methods, summary["methods"], strict=True)}
    for method, stats in zip(methods, summary["methods"], strict=True):
        reference = unbatched_reference(method, methods) or method
        stats["throughput_vs_lowest"] = _div(rates[method], rates.get(reference)) if rates[method] else None
    for method in methods:
        base = pair_baseline(method, baseline, methods)
        if base is None:
            continue
        same = agreement[method]
        changed = [u for u in (unbatched[method], unbatched[base]) if u and u["same"] < u["of"]]
        entry: dict[str, Any] = {
            "method": method.label,
            "baseline": base.label,
            "concurrency": method.concurrency,
            "exact": _exact(outputs, method),
            "same_as_baseline": same,
            "flagged": _exact(outputs, method) is not True or bool(same and same["same"] < same["of"]) or bool(changed),
        }
        for name, (_, function) in COMPARISONS.items():
            graded = totals[f"{method.label}:graded"] and totals[f"{base.label}:graded"]
            if name == "accuracy_diff_points" and not graded:
                entry[name] = None
            elif method.concurrency > 1 and name in PER_CALL_TIMED:
                entry[name] = None  # a closed-loop run's responses share calls: their times are not their own
            elif method.concurrency > 1 and name == "throughput_ratio":
                entry[name] = runs.ratio(method, base)
            else:
                entry[name] = _ci(boot.estimate(_paired(function, method.label, base.label)))
        entry["throughput_unit"] = "prompt" if method.concurrency == 1 else runs.unit
        summary["comparisons"].append(entry)
    return summary


#: Comparisons of per-response times, left out at concurrency > 1 (see the module docstring).
PER_CALL_TIMED = frozenset({"wall_diff_s", "time_per_nfe_ratio"})
#: Latency percentiles reported per method: name -> (record field, percentiles).
LATENCY_PERCENTILES: dict[str, tuple[str, tuple[int, ...]]] = {
    "ttft_s": ("ttft", (50, 90, 99)),
    "itl_s": ("itl", (50, 90)),
    "latency_s": ("latency", (50, 90)),
}


def _collect_timing(into: dict[str, list[float]], record: Mapping[str, Any]) -> None:
    """Add a record's consumer timings (records made before they existed have none)."""
    if record.get("ttft_s") is not None:
        into["ttft"].append(float(record["ttft_s"]))
    if record.get("latency_s") is not None:
        into["latency"].append(float(record["latency_s"]))
    into["itl"].extend(float(v) for v in record.get("itl_s") or ())


def _latency_stats(values: Mapping[str, list[float]]) -> dict[str, Any]:
    """``{"ttft_s": {"p50", "p90", "p99"}, "itl_s": {"p50", "p90"}, "latency_s": {...}}``; ``None`` without data."""
    out: dict[str, Any] = {}
    for name, (key, levels) in LATENCY_PERCENTILES.items():
        data = values.get(key) or []
        points = np.percentile(np.asarray(data, dtype=float), levels) if data else [None] * len(levels)
        out[name] = {f"p{level}": None if v is None else float(v) for level, v in zip(levels, points, strict=True)}
    return out


def _mean_width(widths: Mapping[str, int]) -> float | None:
    """Mean width over the calls planned (``0`` for a plain AR call); ``None`` when records have no choices."""
    calls = sum(widths.values())
    return sum(int(w) * n for w, n in widths.items()) / calls if calls else None


class _RunTotals:
    """Total tokens and wall time of each method's closed-loop runs, per repeat, and their bootstrap over repeats."""

    def __init__(
        self,
        loops: Mapping[Method, Mapping[str, tuple[int, float, float]]],
        methods: Sequence[Method],
        repeats: int,
        **bootstrap: Any,
    ) -> None:
        self.per_repeat = {
            m: np.zeros((2, repeats)) for m in methods if m.concurrency > 1
        }  # row 0 tokens, row 1 wall seconds
        for method, runs in loops.items():
            for repeat, tokens, wall in runs.values():
                self.per_repeat[method][:, repeat] += (tokens, wall)
        self.unit = "repeat" if repeats > 1 else None
        self.boot = None
        if self.unit and self.per_repeat:
            columns = {
                f"{m.label}:{q}": v[i] for m, v in self.per_repeat.items() for i, q in enumerate(("tokens", "wall"))
            }
            self.boot = PairedBootstrap(columns, **bootstrap)

    def runs(self, method: Method) -> int:
        """Repeats with at least one closed-loop run recorded."""
        return int((self.per_repeat[method][1] > 0).sum())

    def rate(self, method: Method) -> dict[str, float | None]:
        """Total tok/s with its interval over repeats (``low``/``high`` ``None`` from one run)."""
        tokens, wall = self.per_repeat[method].sum(axis=1)
        if self.boot is None or not wall:
            return {"estimate": _div(tokens, wall), "low": None, "high": None}
        return _ci(self.boot.estimate(lambda s, m=method: s[f"{m.label}:tokens"] / s[f"{m.label}:wall"]))

    def ratio(self, method: Method, base: Method) -> dict[str, float | None]:
        """Throughput of ``method`` / throughput of ``base``, with its paired interval over repeats."""
        mine, theirs = self.rate(method)["estimate"], self.rate(base)["estimate"]
        point = mine / theirs if mine is not None and theirs else None
        if self.boot is None or point is None:
            return {"estimate": point, "low": None, "high": None}
        a, b = method.label, base.label
        return _ci(
            self.boot.estimate(lambda s: (s[f"{a}:tokens"] / s[f"{a}:wall"]) / (s[f"{b}:tokens"] / s[f"{b}:wall"]))
        )


def _batched_stats(method: Method, stats: Mapping[str, Any], runs: _RunTotals) -> dict[str, Any]:
    """The statistics that mean something else at concurrency > 1 (see the module docstring)."""
    rate = runs.rate(method)
    return {
        "throughput_tok_s": rate["estimate"],
        "throughput_ci": rate,
        "throughput_unit": runs.unit,
        "closed_loop_runs": runs.runs(method),
        "mean_wall_s": stats.get("mean_latency_s"),
        "mean_model_s": None,
        "mean_non_model_s": None,
        "time_per_nfe_ms": None,
        "non_model_share": None,
    }


def _outputs(
    records: Sequence[Mapping[str, Any]], methods: set[Method], prompts: set[int], repeats: int
) -> dict[Method, dict[tuple[int, int], Mapping[str, Any]]]:
    """Each method's records of the complete prompts, by (prompt index, repeat)."""
    out: dict[Method, dict[tuple[int, int], Mapping[str, Any]]] = defaultdict(dict)
    for record in records:
        method, key = record_method(record), (int(record["prompt_index"]), int(record["repeat"]))
        if method in methods and key[0] in prompts and key[1] < repeats:
            out[method][key] = record
    return out


def _exact(outputs: Mapping[Method, Mapping[Any, Mapping[str, Any]]], method: Method) -> bool | None:
    """True when every response's decoder was exact, False when one was not, None when a record does not say."""
    said = [r.get("exact") for r in outputs.get(method, {}).values()]
    if any(s is False for s in said):
        return False
    return True if said and all(s is True for s in said) else None


def record_sampled(record: Mapping[str, Any]) -> bool:
    """Whether the record's rule samples (records without the flag: whenever the temperature is not 0)."""
    stochastic = record.get("stochastic")
    return bool(stochastic) if stochastic is not None else record.get("temperature") != 0


def _agreement(
    method: Method,
    base: Method | None,
    outputs: Mapping[Method, Mapping[tuple[int, int], Mapping[str, Any]]],
    *,
    sampled_too: bool = False,
) -> dict[str, Any] | None:
    """How many of ``method``'s responses equal ``base``'s token for token, and where the first one differs.

    ``None`` without a baseline or when either samples (then equal seeds need not give equal tokens), unless
    ``sampled_too``: the same method at another concurrency, whose seeded responses must be the same.
    """
    if base is None:
        return None
    mine, theirs = outputs.get(method, {}), outputs.get(base, {})
    keys = sorted(set(mine) & set(theirs))
    both = [(mine[k], theirs[k]) for k in keys]
    if not keys or any((record_sampled(r) and not sampled_too) or "output_ids" not in r for pair in both for r in pair):
        return None
    same, first = 0, None
    for key in keys:
        a, b = list(mine[key]["output_ids"]), list(theirs[key]["output_ids"])
        if a == b:
            same += 1
        elif first is None:
            token = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            first = {"prompt_index": key[0], "repeat": key[1], "token": token}
    return {"baseline": base.label, "same": same, "of": len(keys), "first_divergence": first}


def _paired(function: Any, method: str, base: str) -> Any:
    """A statistic of the bootstrap totals from a ``(method sums, baseline sums)`` function."""

    def statistic(sums: Mapping[str, Any]) -> Any:
        return function({q: sums[f"{method}:{q}"] for q in QUANTITIES}, {q: sums[f"{base}:{q}"] for q in QUANTITIES})

    return statistic


def _method_stats(method: Method, s: Mapping[str, float], per_position: list[float], rows_max: int) -> dict[str, Any]:
    n, wall, nfe = s["responses"], s["wall"], s["nfe"]
    non_model = max(wall - s["model"], 0.0)
    return {
        "method": method.label,
        "schedule": method.schedule,
        "width": method.width,
        "concurrency": method.concurrency,
        "responses": int(n),
        "mean_tokens": s["tokens"] / n,
        "mean_wall_s": wall / n,
        "mean_nfe": nfe / n,
        "mean_model_s": s["model"] / n,
        "mean_non_model_s": non_model / n,
        "throughput_tok_s": _div(s["tokens"], wall),
        "tokens_per_nfe": _div(s["tokens"], nfe),
        "time_per_nfe_ms": _div(1000 * wall, nfe),
        "non_model_share": _div(non_model, wall),
        "rows_per_call_max": rows_max,
        "accuracy": _div(100 * s["correct"], s["graded"]) if s["graded"] else None,
        "graded": int(s["graded"]),
        "acceptance": {
            "num_drafts": int(s["drafts"]),
            "draft_tokens": int(s["draft_tokens"]),
            "accepted_tokens": int(s["accepted"]),
            "mean_acceptance_length": mean_acceptance_length(s["accepted"], s["drafts"]) if s["drafts"] else None,
            "acceptance_rate": acceptance_rate(s["accepted"], s["draft_tokens"]) if s["draft_tokens"] else None,
            "per_position_acceptance": per_position,
        },
    }


def _position_rates(counts: list[np.ndarray]) -> list[float]:
    """Per-rank acceptance: accepted / reached, summed over responses (vLLM's per-position acceptance)."""
    longest = max((c.shape[1] for c in counts), default=0)
    if longest == 0:
        return []
    total = np.zeros((2, longest))
    for c in counts:
        total[:, : c.shape[1]] += c
    return [float(a / r) if r else 0.0 for r, a in zip(total[0], total[1], strict=True)]


def _div(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _ci(estimate: Any) -> dict[str, float | None]:
    return {k: (None if v is None or not math.isfinite(v) else v) for k, v in estimate.to_dict().items()}
