"""Aggregate statistics per method and paired comparisons against a baseline (paper, section 4 and E.5).

Per method, over the prompts that every method completed (all repeats):

* mean generated tokens, decoder wall time and NFE per response;
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
    return {
        "responses": 1.0,
        "tokens": float(metrics["generated_tokens"]),
        "wall": float(metrics["wall_s"]),
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
    """
    exact = Method.parse(baseline)
    candidates = [m for m in methods if m.schedule == exact.schedule and exact.width in (None, m.width)]
    if not candidates or method.schedule == exact.schedule:
        return None
    same_width = [m for m in candidates if m.width == method.width]
    return (same_width or candidates)[0]


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
    wanted = set(methods)
    for record in records:
        method, row = record_method(record), position.get(int(record["prompt_index"]))
        if row is None or method not in wanted or int(record["repeat"]) >= repeats:
            continue
        for name, value in record_quantities(record).items():
            table[f"{method.label}:{name}"][row] += value
        counts = record.get("acceptance_positions") or {}
        positions[method].append(np.array([counts.get("reached", []), counts.get("accepted", [])], dtype=float))
        rows_max[method] = max(rows_max[method], int(record["metrics"].get("rows_per_call_max", 0)))
        for name, histogram in chosen[method].items():
            histogram.update(record["metrics"].get(name) or {})
    summary: dict[str, Any] = {
        "prompts": len(prompts),
        "incomplete_prompts": len(all_prompts) - len(prompts),
        "responses_per_method": len(prompts) * repeats,
        "baseline": baseline,
        "bootstrap": {"resamples": resamples, "confidence": confidence, "seed": seed, "unit": "prompt"},
        "methods": [],
        "comparisons": [],
    }
    if not prompts:
        return summary
    boot = PairedBootstrap(table, resamples=resamples, seed=seed, confidence=confidence)
    totals = boot.totals()
    outputs = _outputs(records, wanted, set(prompts), repeats)
    agreement = {m: _agreement(m, pair_baseline(m, baseline, methods), outputs) for m in methods}
    for method in methods:
        sums = {q: totals[f"{method.label}:{q}"] for q in QUANTITIES}
        stats = _method_stats(method, sums, _position_rates(positions[method]), rows_max[method])
        stats["exact"] = _exact(outputs, method)
        stats["same_as_baseline"] = agreement[method]
        stats["widths"] = dict(sorted(chosen[method]["widths"].items(), key=lambda item: int(item[0])))
        stats["schedules"] = dict(chosen[method]["schedules"].most_common())
        stats["throughput_ci"] = _ci(boot.estimate(lambda s, m=method: s[f"{m.label}:tokens"] / s[f"{m.label}:wall"]))
        summary["methods"].append(stats)
    for method in methods:
        base = pair_baseline(method, baseline, methods)
        if base is None:
            continue
        same = agreement[method]
        entry: dict[str, Any] = {
            "method": method.label,
            "baseline": base.label,
            "exact": _exact(outputs, method),
            "same_as_baseline": same,
            "flagged": _exact(outputs, method) is not True or bool(same and same["same"] < same["of"]),
        }
        for name, (_, function) in COMPARISONS.items():
            graded = totals[f"{method.label}:graded"] and totals[f"{base.label}:graded"]
            if name == "accuracy_diff_points" and not graded:
                entry[name] = None
                continue
            entry[name] = _ci(boot.estimate(_paired(function, method.label, base.label)))
        summary["comparisons"].append(entry)
    return summary


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


def _sampled(record: Mapping[str, Any]) -> bool:
    """Whether the record's rule samples (records without the flag: whenever the temperature is not 0)."""
    stochastic = record.get("stochastic")
    return bool(stochastic) if stochastic is not None else record.get("temperature") != 0


def _agreement(
    method: Method, base: Method | None, outputs: Mapping[Method, Mapping[tuple[int, int], Mapping[str, Any]]]
) -> dict[str, Any] | None:
    """How many of ``method``'s responses equal ``base``'s token for token, and where the first one differs.

    ``None`` without a baseline or when either samples (then equal seeds need not give equal tokens).
    """
    if base is None:
        return None
    mine, theirs = outputs.get(method, {}), outputs.get(base, {})
    keys = sorted(set(mine) & set(theirs))
    both = [(mine[k], theirs[k]) for k in keys]
    if not keys or any(_sampled(r) or "output_ids" not in r for pair in both for r in pair):
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
