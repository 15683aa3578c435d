"""Write a run's report files from its records: ``summary.json``, the plots, and the terminal table."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specframe.bench.plots import plot_comparisons
from specframe.bench.records import SUMMARY_FILE, write_failed, write_json
from specframe.bench.report import format_report
from specframe.bench.settings import BenchSettings
from specframe.bench.summary import record_sampled, summarize
from specframe.models.hub import DEFAULT_MODEL, model_display_name
from specframe.specs import spec_name


def machine_description() -> dict[str, Any]:
    """The machine a run happens on: OS, CPU, accelerator, Python and library versions."""
    import torch

    import specframe

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_flags": _cpu_flags(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "specframe": specframe.__version__,
        "cuda": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["cuda"] = {
            "device": props.name,
            "count": torch.cuda.device_count(),
            "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
            "runtime": torch.version.cuda,
        }
    return info


_NAMED_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16")
_NAMED_FLAGS += ("amx_tile", "amx_bf16", "amx_int8")


def _cpu_flags() -> list[str]:
    """The CPU's vector-instruction flags that decide which kernels run (from /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in _NAMED_FLAGS if flag in present]
    except OSError:
        pass
    return []


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_report(
    folder: str | Path,
    settings: BenchSettings,
    records: Sequence[Mapping[str, Any]],
    run: Mapping[str, Any],
    *,
    plots: bool = True,
) -> tuple[dict[str, Any], str]:
    """Summarise ``records`` and write ``summary.json`` and the plots into ``folder``.

    Args:
        folder: The output folder.
        settings: The run's settings (methods, baseline, repeats, bootstrap options).
        records: All records of the run.
        run: The run description (``run.json`` content: model, environment, command).
        plots: Also draw the PNG figures.

    Returns:
        The summary and the formatted terminal report.
    """
    folder = Path(folder)
    summary = summarize(
        records,
        settings.methods(),
        baseline=settings.baseline_method(),
        repeats=settings.repeats,
        resamples=settings.resamples,
        seed=settings.bootstrap_seed,
    )
    summary = {
        "task": settings.task,
        "model": run.get("model"),
        "repeats": settings.repeats,
        "temperature": settings.temperature if any(record_sampled(r) for r in records) else 0.0,
        "order": settings.order,
        **summary,
        "settings": settings.to_dict(),
        "environment": run.get("environment"),
        "cost_model": run.get("cost_model"),
        "command": run.get("command"),
    }
    write_json(folder / SUMMARY_FILE, summary)
    model_name = model_display_name((run.get("model") or {}).get("name") or settings.model or DEFAULT_MODEL)
    if plots:
        try:
            plot_comparisons(summary, folder, title=f"{model_name} on {settings.task}, ")
        except OSError as exc:
            raise write_failed(exc.filename or f"the plots in {folder}", exc) from exc
    title = f"{settings.task} on {model_name} ({settings.order}, {sampling(settings, records)}): "
    return summary, format_report(summary, title=title)


def sampling(settings: BenchSettings, records: Sequence[Mapping[str, Any]]) -> str:
    """How the report's title names the acceptance: ``T=...`` where a rule samples, else what decoded greedily.

    A rule that never draws from its generator (``greedy``, or a plugin's ``stochastic = False`` rule) has no
    temperature to claim; ``T=0`` names greedy decoding.
    """
    if any(record_sampled(r) for r in records):
        return f"T={settings.temperature:g}"
    name = spec_name(settings.acceptance)
    return "T=0" if name == "greedy" else f"acceptance {name}, which does not sample"
