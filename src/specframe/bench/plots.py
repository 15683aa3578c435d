"""Figure-3-style plots: each metric as a ratio to (or difference from) the baseline with 95% interval bars.

One bar group per schedule, one bar per width inside the group; a dashed line marks "same as the baseline"
(1 for ratios, 0 for differences). Long schedule names (a plugin's, with options) are wrapped at their
``:`` and ``,`` and slanted so that they do not run into each other. A metric whose every comparison is
exactly "no difference" (typically the accuracy of lossless methods, or of responses none of which pass)
is left out: its panel would be a bare line. ``comparison.png`` lays the panels out in a grid of at most
:data:`GRID_COLUMNS` columns. A schedule with a flagged comparison (not exact, or output that differed from
the baseline's) is marked :data:`FLAGGED` on the axis and in the title. Rendered with matplotlib's Agg
backend (no display needed).

With more than one concurrency, ``throughput_vs_concurrency.png`` draws each method's total tokens/s against
its concurrency (one line per schedule and width, interval bars where there are intervals), and the bars of
the comparison panels are labelled with their concurrency (``W=4 c8``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specframe.bench.summary import COMPARISONS

PANELS: tuple[tuple[str, str], ...] = (
    ("throughput_ratio", "Throughput ratio"),
    ("tokens_per_nfe_ratio", "Tokens/NFE ratio"),
    ("time_per_nfe_ratio", "Time/NFE ratio"),
    ("wall_diff_s", "Wall-time difference (s)"),
    ("accuracy_diff_points", "Accuracy difference (points)"),
)

#: Marks a schedule whose comparison is flagged (see :func:`specframe.bench.summary.summarize`).
FLAGGED = "*"
#: What the mark means, added to the figures' titles when one is drawn.
FLAGGED_NOTE = f"{FLAGGED} not exact or output differs from the baseline's"


#: Columns of the panel grid of ``comparison.png``.
GRID_COLUMNS = 3
#: Characters per line of a wrapped schedule name under its bar group.
LABEL_WIDTH = 16


def tick_label(schedule: str, width: int = LABEL_WIDTH) -> str:
    """``schedule`` wrapped after its ``:`` and ``,`` into lines of about ``width`` characters."""
    parts, current = [], ""
    for piece in schedule.replace(":", ":\0").replace(",", ",\0").split("\0"):
        if current and len(current) + len(piece) > width:
            parts.append(current)
            current = ""
        current += piece
    parts.append(current)
    return "\n".join(parts)


def _flat(summary: Mapping[str, Any], key: str) -> bool:
    """Whether every comparison of ``key`` is exactly "same as the baseline" (a bare line if drawn)."""
    reference = 1.0 if COMPARISONS[key][0] == "ratio" else 0.0
    values = [
        value
        for _, bars in _groups(summary, key)
        for _, est in bars
        for value in (est["estimate"], est.get("low", reference), est.get("high", reference))
    ]
    return all(value == reference for value in values)


def _groups(summary: Mapping[str, Any], key: str) -> list[tuple[str, list[tuple[str, Mapping[str, Any]]]]]:
    """``[(schedule, [(bar label, estimate), ...]), ...]`` for one metric, in report order."""
    by_schedule: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    widths = {m["method"]: m.get("width") for m in summary["methods"]}
    levels = {m["method"]: m.get("concurrency", 1) for m in summary["methods"]}
    several = len(set(levels.values())) > 1
    schedules = {m["method"]: m["schedule"] for m in summary["methods"]}
    for comparison in summary["comparisons"]:
        estimate = comparison.get(key)
        if not estimate or estimate.get("estimate") is None:
            continue
        method = comparison["method"]
        width = widths.get(method)
        label = f"W={width}" if width is not None else method.split("@c")[0]
        if several:
            label += f" c{levels.get(method, 1)}"
        schedule = schedules.get(method, method) + (FLAGGED if _flagged(summary, schedules.get(method)) else "")
        by_schedule.setdefault(schedule, []).append((label, estimate))
    return list(by_schedule.items())


def _flagged(summary: Mapping[str, Any], schedule: str | None) -> bool:
    """Whether a comparison of one of ``schedule``'s methods is flagged."""
    methods = {m["method"] for m in summary["methods"] if m["schedule"] == schedule}
    return any(c.get("flagged") for c in summary["comparisons"] if c["method"] in methods)


def _draw(ax: Any, summary: Mapping[str, Any], key: str, title: str) -> bool:
    groups = _groups(summary, key)
    if not groups:
        return False
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    bar_labels = sorted({label for _, bars in groups for label, _ in bars})
    ticks, tick_labels, x = [], [], 0.0
    for schedule, bars in groups:
        start = x
        for label, est in bars:
            value, low, high = est["estimate"], est.get("low"), est.get("high")
            err = None
            if low is not None and high is not None:
                err = [[max(value - low, 0.0)], [max(high - value, 0.0)]]
            ax.bar(
                x,
                value,
                width=0.8,
                color=colours[bar_labels.index(label) % len(colours)],
                yerr=err,
                capsize=3,
                label=label,
            )
            x += 1
        ticks.append((start + x - 1) / 2)
        tick_labels.append(schedule)
        x += 0.6
    reference = 1.0 if COMPARISONS[key][0] == "ratio" else 0.0
    ax.axhline(reference, color="black", linestyle="--", linewidth=0.8)
    if reference == 1.0:
        ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
    ax.set_xticks(ticks)
    labels = [tick_label(name) for name in tick_labels]
    slanted = len(labels) > 2 or any(len(line) > 8 for label in labels for line in label.splitlines())
    if slanted:
        ax.set_xticklabels(labels, rotation=30, ha="right", rotation_mode="anchor", fontsize=8)
    else:
        ax.set_xticklabels(labels, fontsize=8)
    ax.set_title(title, fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    if len(unique) > 1:
        ax.legend(unique.values(), unique.keys(), fontsize=7)
    return True


def throughput_lines(summary: Mapping[str, Any]) -> dict[str, list[tuple[int, Mapping[str, Any]]]]:
    """``{schedule/width: [(concurrency, throughput estimate), ...]}`` in report order, concurrency ascending."""
    lines: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for m in summary["methods"]:
        estimate = m.get("throughput_ci") or {"estimate": m.get("throughput_tok_s")}
        if estimate.get("estimate") is None:
            continue
        name = m["method"].split("@c")[0]
        lines.setdefault(name, []).append((int(m.get("concurrency", 1)), estimate))
    return {name: sorted(points, key=lambda p: p[0]) for name, points in lines.items()}


def plot_throughput_vs_concurrency(summary: Mapping[str, Any], folder: str | Path, *, title: str = "") -> Path | None:
    """Write ``throughput_vs_concurrency.png`` (``None``, nothing written, with fewer than two concurrencies).

    Args:
        summary: Output of :func:`specframe.bench.summary.summarize`.
        folder: Output folder.
        title: Figure title (e.g. model and task).
    """
    lines = throughput_lines(summary)
    levels = sorted({c for points in lines.values() for c, _ in points})
    if len(levels) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    for name, points in lines.items():
        xs = [c for c, _ in points]
        ys = [e["estimate"] for _, e in points]
        lows = [e.get("low") for _, e in points]
        highs = [e.get("high") for _, e in points]
        err = None  # a point estimate from one closed-loop run has no bar
        if any(v is not None for v in lows + highs):
            below = [0.0 if lo is None else max(y - lo, 0.0) for y, lo in zip(ys, lows, strict=True)]
            above = [0.0 if hi is None else max(hi - y, 0.0) for y, hi in zip(ys, highs, strict=True)]
            err = [below, above]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels)
    ax.set_xticklabels([str(c) for c in levels])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("total tokens/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(f"{title}throughput vs concurrency\n(bars: 95% intervals where there are; one run: none)", fontsize=10)
    fig.tight_layout()
    path = Path(folder) / "throughput_vs_concurrency.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_comparisons(summary: Mapping[str, Any], folder: str | Path, *, title: str = "") -> list[Path]:
    """Write one PNG per metric (``plots/<metric>.png``), a combined ``comparison.png``, and the concurrency curve.

    The curve, ``throughput_vs_concurrency.png``, is drawn when more than one concurrency was run.

    Args:
        summary: Output of :func:`specframe.bench.summary.summarize`.
        folder: Output folder.
        title: Figure title (e.g. model and task).

    Returns:
        The files written (none when there is nothing to compare).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    written: list[Path] = []
    curve = plot_throughput_vs_concurrency(summary, folder, title=title)
    if curve is not None:
        written.append(curve)
    panels = [(k, t) for k, t in PANELS if _groups(summary, k) and not _flat(summary, k)]
    if not panels:
        return written
    (folder / "plots").mkdir(parents=True, exist_ok=True)
    baseline = summary.get("baseline", "baseline")
    note = f"\n{FLAGGED_NOTE}" if any(c.get("flagged") for c in summary["comparisons"]) else ""
    for key, label in panels:
        fig, ax = plt.subplots(figsize=(5.0, 4.0))
        _draw(ax, summary, key, f"{label} vs {baseline}{note}")
        fig.tight_layout()
        path = folder / "plots" / f"{key}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    rows = math.ceil(len(panels) / GRID_COLUMNS)
    columns = math.ceil(len(panels) / rows)  # balanced: four panels are 2 x 2, five 3 + 2
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 4.0 * rows), squeeze=False)
    cells = list(axes.flat)
    for ax, (key, label) in zip(cells, panels, strict=False):
        _draw(ax, summary, key, label)
    for ax in cells[len(panels) :]:
        ax.axis("off")
    flat = [t for k, t in PANELS if _groups(summary, k) and _flat(summary, k)]
    if flat:
        note += f"\nnot plotted, no difference for any method: {', '.join(flat)}"
    fig.suptitle(f"{title}vs {baseline}; 95% paired bootstrap intervals{note}", fontsize=10)
    fig.tight_layout()
    path = folder / "comparison.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written
