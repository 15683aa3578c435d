"""Combine benchmark shards (``--shard i/n`` runs, possibly on different hosts) into one report."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specframe.bench.output import write_report
from specframe.bench.records import (
    RECORDS_FILE,
    RUN_FILE,
    check_same_run,
    prepare_folder,
    read_records,
    read_run,
    record_key,
    write_json,
    write_records,
)
from specframe.bench.settings import BenchSettings
from specframe.errors import SpecframeError


def merge_runs(
    folders: Sequence[str | Path],
    out: str | Path,
    *,
    log: Callable[[str], None] | None = None,
    plots: bool = True,
) -> tuple[dict[str, Any], str]:
    """Merge the records of several output folders and write the combined report into ``out``.

    Records are deduplicated by their key (:func:`~specframe.bench.records.record_key`; the first folder
    wins); every folder must hold a run with the same record-defining settings (model, task and its data,
    schedules, widths, concurrency, order, acceptance, output cap, repeats, seed, dtype, ...). A shard's
    closed-loop runs (concurrency > 1) stay whole: each covers that shard's prompts.

    Args:
        folders: Output folders of the shards.
        out: The folder for the merged run (must not hold records yet).
        log: Where to print notes (default: standard error).
        plots: Also draw the PNG figures.

    Returns:
        The summary and the formatted report.

    Raises:
        SpecframeError: A folder without a run, runs with different settings, or a non-empty ``out``.
    """
    log = log or (lambda text: print(text, file=sys.stderr))
    if not folders:
        raise SpecframeError("nothing to merge: name the shard output folders")
    seen: dict[Path, str | Path] = {}
    for folder in folders:
        if Path(folder).resolve() in seen:
            first_name = seen[Path(folder).resolve()]
            raise SpecframeError(f"{folder} and {first_name} are the same folder; name each shard folder once")
        seen[Path(folder).resolve()] = folder
    out = Path(out)
    if (out / RECORDS_FILE).exists() and any(Path(f).resolve() == out.resolve() for f in folders):
        raise SpecframeError(f"--out {out} is one of the folders being merged; pick a new folder")
    if (out / RECORDS_FILE).exists():
        raise SpecframeError(f"--out {out} already holds records; merge into an empty or new folder")
    runs = []
    for folder in folders:
        run = read_run(folder)
        if run is None:
            raise SpecframeError(f"{folder} has no {RUN_FILE}: it is not a specframe bench output folder")
        runs.append(run)
    first = BenchSettings.from_dict(runs[0]["settings"])
    for folder, run in zip(folders[1:], runs[1:], strict=True):
        check_same_run(
            run["settings"], first, f"{folder} (compared with {folders[0]})", "only shards of one run can be merged"
        )
    merged: dict[Any, dict[str, Any]] = {}
    conflicts = 0
    for folder in folders:
        for record in read_records(Path(folder) / RECORDS_FILE):
            key = record_key(record)
            if key in merged:
                conflicts += merged[key]["output_ids"] != record["output_ids"]
                continue
            merged[key] = record
    if conflicts:
        log(f"warning: {conflicts} duplicate response(s) differ between folders; kept the first folder's")
    settings = first
    settings.shard = None
    limits = [BenchSettings.from_dict(r["settings"]).limit for r in runs]
    settings.limit = None if any(lim is None for lim in limits) else max(limits)
    records = sorted(
        merged.values(),
        key=lambda r: (r.get("concurrency") or 1, r["prompt_index"], r["repeat"], r["schedule"], str(r["width"])),
    )
    prepare_folder(out, option="--out")
    write_records(out / RECORDS_FILE, records)
    run = {
        "settings": settings.to_dict(),
        "model": runs[0].get("model"),
        "task": runs[0].get("task"),
        "environment": runs[0].get("environment"),
        "shards": [
            {
                "folder": str(f),
                "shard": r["settings"].get("shard"),
                "environment": r.get("environment"),
                "command": r.get("command"),
            }
            for f, r in zip(folders, runs, strict=True)
        ],
        "command": runs[0].get("command"),
    }
    write_json(out / RUN_FILE, run)
    log(f"merged {len(records)} responses from {len(folders)} folder(s) into {out}")
    return write_report(out, settings, records, run, plots=plots)
