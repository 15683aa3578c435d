"""Readable text tables of a benchmark summary (the terminal report, also used by ``scripts/bench_docs.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

METHOD_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # header, summary key, format
    ("method", "method", "{}"),
    ("resp", "responses", "{:d}"),
    ("tokens", "mean_tokens", "{:.1f}"),
    ("wall s", "mean_wall_s", "{:.3f}"),
    ("NFE", "mean_nfe", "{:.1f}"),
    ("tok/s", "throughput_tok_s", "{:.1f}"),
    ("tok/NFE", "tokens_per_nfe", "{:.3f}"),
    ("ms/NFE", "time_per_nfe_ms", "{:.2f}"),
    ("non-model", "non_model_share", "{:.1%}"),
    ("rows max", "rows_per_call_max", "{:d}"),
    ("accept len", "acceptance.mean_acceptance_length", "{:.2f}"),
    ("accept rate", "acceptance.acceptance_rate", "{:.1%}"),
    ("acc %", "accuracy", "{:.1f}"),
)

COMPARISON_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("throughput ratio", "throughput_ratio", "{:.3f}"),
    ("wall diff s", "wall_diff_s", "{:+.4f}"),
    ("tok/NFE ratio", "tokens_per_nfe_ratio", "{:.3f}"),
    ("time/NFE ratio", "time_per_nfe_ratio", "{:.3f}"),
    ("acc diff pts", "accuracy_diff_points", "{:+.2f}"),
)


def lookup(row: Mapping[str, Any], dotted: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"`` (``None`` when a part is missing)."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def fmt(value: Any, pattern: str = "{}") -> str:
    """Format a value, ``-`` for missing ones."""
    if value is None:
        return "-"
    try:
        return pattern.format(value)
    except (ValueError, TypeError):
        return str(value)


#: Shown after a point estimate that has no interval (a closed-loop run's throughput from a single run).
ONE_RUN = "(1 run)"


def fmt_interval(entry: Mapping[str, Any] | None, pattern: str) -> str:
    """``1.052 [1.031, 1.074]`` for an estimate dict; ``1.052 (1 run)`` for one without an interval."""
    if not entry or entry.get("estimate") is None:
        return "-"
    if entry.get("low") is None and entry.get("high") is None:
        return f"{fmt(entry['estimate'], pattern)} {ONE_RUN}"
    return f"{fmt(entry['estimate'], pattern)} [{fmt(entry.get('low'), pattern)}, {fmt(entry.get('high'), pattern)}]"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A left-aligned first column and right-aligned others, separated by two spaces."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))]).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def method_table(summary: Mapping[str, Any]) -> str:
    """The per-method table."""
    return text_table(*method_rows(summary))


#: Appended to the throughput ratio of a flagged comparison (a method that is not exact, or whose output
#: differed from the baseline's): its speed-up is not the same output faster.
FLAG = " !"


def comparison_table(summary: Mapping[str, Any]) -> str:
    """The paired comparisons against the baseline, with intervals (a flagged one's ratio marked ``!``)."""
    rows = []
    for c in summary["comparisons"]:
        cells = [fmt_interval(c.get(k), pattern) for _, k, pattern in COMPARISON_COLUMNS]
        if c.get("flagged"):
            cells[0] += FLAG
        rows.append([f"{c['method']} vs {c['baseline']}", *cells])
    return text_table(["comparison", *(h for h, _, _ in COMPARISON_COLUMNS)], rows)


def flag_notes(summary: Mapping[str, Any]) -> list[str]:
    """One line per flagged comparison: why its speed-up is not free, and where its output first differs.

    Then one line per method whose batched output differs from its own at the lowest concurrency.
    """
    notes = []
    for c in summary["comparisons"]:
        if not c.get("flagged"):
            continue
        why = {False: "is not exact", None: "does not say it is exact"}.get(c.get("exact"), "is declared exact")
        line = f"! {c['method']} {why}"
        same = c.get("same_as_baseline")
        if same:
            line += f"; {same['same']}/{same['of']} responses equal {c['baseline']}'s"
            line += _divergence(same)
        notes.append(line + ": its speed-up is not the baseline's output faster")
    for m in summary.get("methods", []):
        same = m.get("same_as_unbatched")
        if same and same["same"] < same["of"]:
            notes.append(
                f"! {m['method']}: only {same['same']}/{same['of']} responses equal {same['baseline']}'s"
                f"{_divergence(same)}: batching changed the output (the same seeds must give the same tokens)"
            )
    return notes


def _divergence(same: Mapping[str, Any]) -> str:
    first = same.get("first_divergence")
    if not first:
        return ""
    return f" (first divergence: prompt {first['prompt_index']}, repeat {first['repeat']}, token {first['token']})"


#: The per-(method, concurrency) table: header, summary key, format (times in milliseconds).
CONCURRENCY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("x c1", "throughput_vs_lowest", "{:.2f}"),
    ("tok/NFE", "tokens_per_nfe", "{:.3f}"),
    ("TTFT p50", "ttft_s.p50", "ms"),
    ("p90", "ttft_s.p90", "ms"),
    ("p99", "ttft_s.p99", "ms"),
    ("ITL p50", "itl_s.p50", "ms"),
    ("p90", "itl_s.p90", "ms"),
    ("mean width", "mean_width", "{:.2f}"),
)


def concurrency_rows(summary: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the latency table: per method (and concurrency) total tok/s and latency percentiles."""
    lowest = min((m.get("concurrency", 1) for m in summary["methods"]), default=1)
    headers = ["method", "conc", "total tok/s", *(h for h, _, _ in CONCURRENCY_COLUMNS)]
    headers[3] = f"x c{lowest}"
    rows = []
    for m in summary["methods"]:
        cells = [m["method"], str(m.get("concurrency", 1)), fmt_interval(m.get("throughput_ci"), "{:.1f}")]
        for _, key, pattern in CONCURRENCY_COLUMNS:
            value = lookup(m, key)
            cells.append(
                fmt(None if value is None else 1000 * value, "{:.1f}") if pattern == "ms" else fmt(value, pattern)
            )
        rows.append(cells)
    return headers, rows


def concurrency_table(summary: Mapping[str, Any]) -> str:
    """The latency table (:func:`concurrency_rows`)."""
    return text_table(*concurrency_rows(summary))


def concurrency_legend(summary: Mapping[str, Any]) -> list[str]:
    """What the latency table means, and how throughput at concurrency > 1 was estimated."""
    lines = [
        "per request, as the consumer saw it: TTFT from the request's admission (its slot filled) to its first "
        "tokens, ITL the time between pieces per token (ms); mean width: per call as planned (ar: 1; 0: an AR call "
        "an automatic width fell back to); x cN: total tok/s over the same method's at the lowest concurrency",
        "conc 1: one request at a time; total tok/s = all tokens / all decoder time, intervals over prompts",
    ]
    if any(m.get("concurrency", 1) > 1 for m in summary["methods"]):
        unit = (summary.get("bootstrap") or {}).get("closed_loop_unit")
        how = (
            "with intervals from a paired bootstrap over repeats"
            if unit == "repeat"
            else f"marked {ONE_RUN}: a point estimate from one run, without an interval, since the run's responses "
            "share model calls and a bootstrap over prompts would not be valid (--repeats > 1 gives an interval "
            "over repeats)"
        )
        lines.append(
            "conc > 1: N requests in flight (closed loop); total tok/s = all output tokens / the run's wall time, "
            f"{how}; wall s = mean request latency; ms/NFE and non-model are not per request (-)"
        )
    return lines


def format_report(summary: Mapping[str, Any], title: str = "") -> str:
    """The terminal report: a header line, the method table and the comparison table."""
    boot = summary.get("bootstrap", {})
    head = f"{title}{summary['prompts']} prompts x {summary.get('repeats', 1)} response(s) per method"
    if summary.get("incomplete_prompts"):
        head += f" ({summary['incomplete_prompts']} incomplete prompt(s) left out)"
    parts = [head, "", method_table(summary), "", legend(summary), *exactness_legend(summary)]
    if any(m.get("ttft_s", {}).get("p50") is not None for m in summary["methods"]):
        parts += ["", concurrency_table(summary), *concurrency_legend(summary)]
    if summary["comparisons"]:
        batched = any(c.get("concurrency", 1) > 1 for c in summary["comparisons"])
        at = "; each at its own concurrency, where throughput follows the latency table's note" if batched else ""
        parts += [
            "",
            f"paired {boot.get('confidence', 0.95):.0%} bootstrap intervals over prompts "
            f"({boot.get('resamples', 0):,} resamples); baseline: {summary['baseline']} (--baseline sets it){at}",
            comparison_table(summary),
        ]
    notes = flag_notes(summary)
    if notes:
        parts += ["" if not summary["comparisons"] else None, *notes]
    return "\n".join(p for p in parts if p is not None)


def legend(summary: Mapping[str, Any]) -> str:
    """What the less obvious columns of the method table mean, and how many responses ``acc %`` is over."""
    methods = summary.get("methods") or [{}]
    graded, responses = methods[0].get("graded", 0), methods[0].get("responses", 0)
    if not graded:
        accuracy = "acc %: - (the task has no grader)"
    elif graded < responses:
        accuracy = f"acc %: graded responses that pass ({graded} of {responses} per method graded, the rest speed-only)"
    else:
        accuracy = "acc %: responses that pass the task's grader"
    if graded and all(m.get("graded") and not m.get("accuracy") for m in methods):
        accuracy += (
            "\nacc % is 0.0 for every method: no graded response passed (expected of a tiny model such as the "
            "bundled 4M-parameter ones, which rarely write a working function); the speed columns stand regardless"
        )
    return (
        "non-model: decoder time outside model calls; rows max: the widest call; accept len: tokens per verified "
        f"draft\n{accuracy}\n(every column: docs/user-guide/cli.md, 'Reading the report')"
    )


def exactness_legend(summary: Mapping[str, Any]) -> list[str]:
    """What the ``exact`` and ``same as`` columns mean (nothing when the table has neither)."""
    methods = summary.get("methods") or []
    lines = []
    if any("exact" in m for m in methods):
        lines.append("exact: reproduces the verifier's output (NO: lossy, ?: not declared, so not assumed exact)")
    if any(m.get("same_as_baseline") for m in methods):
        lines.append("same as: responses equal to the baseline's token for token (compared where nothing samples)")
    if any(m.get("same_as_unbatched") for m in methods):
        lines.append("same as c1: responses equal token for token to the same method's at the lowest concurrency")
    return lines


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (first column left-aligned, the others right-aligned)."""
    align = [":---", *("---:" for _ in headers[1:])]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def method_rows(summary: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells of the per-method table.

    After :data:`METHOD_COLUMNS`: ``exact`` (``yes``, ``NO``, or ``?`` for records that do not say) and,
    where the responses were compared token for token (greedy), ``same as <baseline>`` (``12/12``).
    """
    methods = summary["methods"]
    rows = [[fmt(lookup(m, key), pattern) for _, key, pattern in METHOD_COLUMNS] for m in methods]
    headers = [h for h, _, _ in METHOD_COLUMNS]
    if any("exact" in m for m in methods):
        headers.append("exact")
        for row, m in zip(rows, methods, strict=True):
            row.append({True: "yes", False: "NO"}.get(m.get("exact"), "?"))
    compared = [m.get("same_as_baseline") for m in methods]
    if any(compared):
        base = next(c for c in compared if c)["baseline"].split("@c")[0]  # each at its own concurrency
        headers.append(f"same as {base}")
        for row, same in zip(rows, compared, strict=True):
            row.append(f"{same['same']}/{same['of']}" if same else "-")
    unbatched = [m.get("same_as_unbatched") for m in methods]
    if any(unbatched):
        lowest = min(m.get("concurrency", 1) for m in methods)
        headers.append(f"same as c{lowest}")
        for row, same in zip(rows, unbatched, strict=True):
            mark = FLAG if same and same["same"] < same["of"] else ""
            row.append(f"{same['same']}/{same['of']}{mark}" if same else "-")
    return headers, rows
