"""One device check for specframe on a CUDA machine (runs in a few minutes; ``--quick`` for a CPU smoke run).

Usage::

    python scripts/gpu_check.py OUT_DIR                # on a CUDA machine: all three parts, full sizes
    python scripts/gpu_check.py OUT_DIR --quick        # tiny sizes; on a CPU-only machine the CUDA parts say so

Parts:

(a) correctness: the greedy output of every speculative schedule (linear, quadratic, packed; LTR) equals plain
    AR decoding token for token in float32, on the bundled models (when this installation ships any) and on
    random-weight checkpoints of both families; in bfloat16 the number of tokens until the first divergence
    from bfloat16 AR (and of bfloat16 AR from float32 AR) is reported, not hidden;
(b) the schedule comparison (``specframe bench`` on the ``smoke`` task) on the bundled models (or, without
    one, on the random Nemotron checkpoint, where only call costs mean anything);
(c) a larger random-weight Nemotron-style model (about 1.2B parameters, bfloat16) whose forward is
    memory-bound: the time of one forward for the row counts of the AR / Linear-SS / Quadratic-SS / Packed-SS
    calls, against weight bytes / device copy bandwidth (measured with a large tensor copy), on the eager path
    and on the compiled path (one graph for every row count, captured as CUDA graphs on CUDA: "graphs on");
(d) the performance report of ``scripts/perf_report.py`` on the bundled model: transformers' ``generate``
    vs specframe ``ar`` (eager and compiled), Packed-SS / Linear-SS vs ``ar``, the call-cost fit
    ``tau + delta x rows``, the weight-streaming floor and the non-model share.

With ``--quick`` the compiled path is left out (on a CPU each graph costs tens of seconds to compile).

Writes ``gpu_check.json`` and ``gpu_check.md`` into OUT_DIR (plus the bench output folders).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from specframe import compose
from specframe.bench import BenchSettings, run_bench
from specframe.bench.output import machine_description
from specframe.bench.tasks import get_task
from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.models.hub import bundled_model, bundled_model_names
from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint

SPECULATIVE = ("linear", "quadratic", "packed")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import perf_report  # noqa: E402  (the sibling script, for part (d))


# --- helpers ------------------------------------------------------------------------------------------------
def log(text: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (``None`` when identical, ``min(len)`` when one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def decoder_sizes(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int) -> dict:
    """The size fields of a decoder's config.json."""
    names = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    return dict(zip(names, (hidden, intermediate, layers, heads, kv_heads), strict=True)) | {"head_dim": head_dim}


def random_checkpoints(folder: Path, quick: bool) -> dict[str, Path]:
    """Random-weight checkpoints of both families (slightly larger than the unit-test ones off --quick)."""
    sizes = {} if quick else decoder_sizes(256, 512, 4, 4, 2, 64) | {"max_position_embeddings": 1024}
    return {
        "random-nemotron": write_random_checkpoint(NEMOTRON, folder / "random-nemotron", seed=11, **sizes),
        "random-setdlm": write_random_checkpoint(SETDLM, folder / "random-setdlm", seed=12, **sizes),
    }


# --- (a) correctness ----------------------------------------------------------------------------------------
def correctness(
    models: dict[str, Path], device: str, prompts: list[str], widths: list[int], max_new_tokens: int
) -> list[dict[str, Any]]:
    """Greedy speculative output vs AR, per model, dtype, schedule and width."""
    rows: list[dict[str, Any]] = []
    for name, folder in models.items():
        reference: dict[int, list[int]] = {}
        for dtype in ("float32", "bfloat16"):
            model = load_model(folder, device=device, dtype=dtype)
            ar = compose({"model": model, "schedule": "ar", "max_new_tokens": max_new_tokens})
            ar_out = [ar.generate(p).output_ids for p in prompts]
            if dtype == "float32":
                reference = dict(enumerate(ar_out))
            else:
                divs = [first_divergence(reference[i], out) for i, out in enumerate(ar_out)]
                rows.append(_row(name, dtype, "ar vs float32 ar", None, divs, max_new_tokens))
            for schedule in SPECULATIVE:
                for width in widths:
                    try:
                        decoder = compose(
                            {"model": model, "schedule": schedule, "width": width, "max_new_tokens": max_new_tokens}
                        )
                        divs = [
                            first_divergence(ar_out[i], decoder.generate(p).output_ids) for i, p in enumerate(prompts)
                        ]
                        rows.append(_row(name, dtype, schedule, width, divs, max_new_tokens))
                    except Exception as exc:  # a failing schedule is a finding, not the end of the check
                        rows.append(
                            {
                                "model": name,
                                "dtype": dtype,
                                "schedule": schedule,
                                "width": width,
                                "error": f"{type(exc).__name__}: {exc}",
                                "ok": False,
                            }
                        )
                        log(f"{name} {dtype} {schedule}/w{width}: {type(exc).__name__}: {exc}")
            del model
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows


def _row(model: str, dtype: str, schedule: str, width: int | None, divs: list[int | None], cap: int) -> dict:
    diverged = [d for d in divs if d is not None]
    return {
        "model": model,
        "dtype": dtype,
        "schedule": schedule,
        "width": width,
        "prompts": len(divs),
        "identical": len(divs) - len(diverged),
        "first_divergence": divs,
        "min_tokens_before_divergence": min(diverged) if diverged else None,
        "mean_tokens_before_divergence": statistics.mean(d if d is not None else cap for d in divs),
        "ok": not diverged if dtype == "float32" else None,  # bfloat16 is reported, not judged
    }


# --- (b) schedule comparison --------------------------------------------------------------------------------
def schedule_comparison(
    models: dict[str, Path], device: str, out: Path, quick: bool, broken: dict[str, set[str]]
) -> list[dict[str, Any]]:
    """``specframe bench`` on the smoke task for each model; schedules that failed in (a) are left out."""
    results = []
    for name, folder in models.items():
        schedules = ["ar", *(s for s in SPECULATIVE if s not in broken.get(name, set()))]
        settings = BenchSettings(
            task="smoke",
            model=str(folder),
            schedules=schedules,
            widths=[4] if quick else [4, 8],
            max_new_tokens=16 if quick else 128,
            limit=3 if quick else None,
            device=device,
            resamples=2000 if quick else 20_000,
            warmup=1,
        )
        try:
            summary, report = run_bench(
                settings, out / f"bench-{name}", progress=False, command=f"gpu_check.py bench {name}", log=log
            )
            print(report, file=sys.stderr)
            results.append(
                {"model": name, "left_out": sorted(broken.get(name, set())), "summary": summary, "report": report}
            )
        except Exception as exc:
            log(f"bench on {name} failed: {exc}")
            results.append(
                {"model": name, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=3)}
            )
    return results


# --- (c) memory-bound forward -------------------------------------------------------------------------------
def big_nemotron(folder: Path, quick: bool) -> tuple[Path, dict[str, Any]]:
    """Write a random Nemotron-style checkpoint in bfloat16 (about 1.2B parameters; tiny with --quick)."""
    if quick:
        overrides = decoder_sizes(128, 256, 2, 4, 2, 32) | {"vocab_size": 512, "max_position_embeddings": 1024}
    else:
        overrides = decoder_sizes(4096, 11008, 5, 32, 8, 128) | {"vocab_size": 32768, "max_position_embeddings": 4096}
    write_random_checkpoint(
        NEMOTRON, folder, tokenizer=False, dtype=torch.bfloat16, torch_dtype="bfloat16", **overrides
    )
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        params = sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())
    return folder, dict(overrides) | {"parameters": params}


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 10) -> float:
    """Device memory bandwidth in bytes/s from copying a large buffer (each copy reads and writes nbytes)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    seconds = time.perf_counter() - start
    del src, dst
    return 2 * nbytes * repeats / seconds


def forward_ms(model: Any, cache: Any, rows: int, context: int, repeats: int) -> float:
    """Median time of one forward of ``rows`` causal rows after ``context`` cached rows (nothing committed)."""
    device = model.device
    ids = torch.randint(0, model.vocab_size, (rows,), device=device)
    positions = torch.arange(context, context + rows, device=device)
    attention = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    times = []
    for i in range(repeats + 2):
        sync(device)
        start = time.perf_counter()
        model.forward(cache, ModelCall(ids, positions, attention))
        sync(device)
        if i >= 2:  # two warm-up calls per shape
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def call_shapes(model: Any, quick: bool) -> dict[str, dict[str, Any]]:
    """Rows per call of each schedule's steady-state calls, from short real decodes (paper widths)."""
    widths = {"ar": 1, "linear": 7 if quick else 31, "quadratic": 3 if quick else 7, "packed": 7 if quick else 31}
    prompt = torch.randint(0, model.vocab_size, (64,)).tolist()
    shapes = {}
    for schedule, width in widths.items():
        try:
            decoder = compose({"model": model, "schedule": schedule, "width": width, "max_new_tokens": 24})
            metrics = decoder.generate(prompt_ids=prompt).metrics
            steady = metrics.rows_per_call[1:] or [1]
            shapes[schedule] = {
                "width": width,
                "rows_max": max(steady),
                "rows_mean": statistics.mean(steady),
                "nfe": metrics.nfe,
                "decoder_ms_per_nfe": 1000 * metrics.wall_s / metrics.nfe,
            }
        except Exception as exc:
            shapes[schedule] = {"width": width, "error": f"{type(exc).__name__}: {exc}"}
    return shapes


def memory_bound(folder: Path, device: str, quick: bool) -> dict[str, Any]:
    """Time per forward by row count vs the weight-streaming floor."""
    path, config = big_nemotron(folder / "big-nemotron", quick)
    model = load_model(path, device=device, dtype="bfloat16")
    model.check_inputs = False  # no host sync for input validation inside the timed forward
    dev = torch.device(model.device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.network.parameters())
    bandwidth = copy_bandwidth(dev, (64 if quick else 2048) * 2**20)
    floor_ms = 1000 * weight_bytes / bandwidth
    shapes = call_shapes(model, quick)
    context = 128 if quick else 512
    cache = model.new_cache(context + 512)
    prefill = torch.randint(0, model.vocab_size, (context,), device=dev)
    model.forward(
        cache,
        ModelCall(
            prefill,
            torch.arange(context, device=dev),
            torch.ones(context, context, dtype=torch.bool, device=dev).tril(),
            output_rows=torch.tensor([context - 1], device=dev),
        ),
    )
    cache.commit(list(range(context)))
    sweep = {1, 2, 4, 8, 16, 32, 64, 128, 256}
    sweep |= {int(s["rows_max"]) for s in shapes.values() if "rows_max" in s}
    timings = {r: forward_ms(model, cache, r, context, 3 if quick else 20) for r in sorted(sweep)}
    graphs: dict[int, float] = {}
    graph_note = "left out with --quick" if quick else None
    if not quick:
        try:
            graphs = compiled_timings(model, shapes, context)
        except Exception as exc:  # a compiler failure is a finding, not the end of the check
            graph_note = f"compiled path failed: {type(exc).__name__}: {exc}"
            log(graph_note)
    for shape in shapes.values():
        if "rows_max" in shape:
            shape["forward_ms"] = timings[int(shape["rows_max"])]
            shape["over_floor"] = shape["forward_ms"] / floor_ms
            shape["over_one_row"] = shape["forward_ms"] / timings[1]
            if int(shape["rows_max"]) in graphs:
                shape["graphs_ms"] = graphs[int(shape["rows_max"])]
                shape["graphs_over_floor"] = shape["graphs_ms"] / floor_ms
    return {
        "graphs_ms_by_rows": graphs,
        "graphs_note": graph_note,
        "config": config,
        "weight_bytes": weight_bytes,
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "floor_ms": floor_ms,
        "context_rows": context,
        "forward_ms_by_rows": timings,
        "call_shapes": shapes,
    }


def compiled_timings(model: Any, shapes: dict[str, dict[str, Any]], context: int) -> dict:
    """Forward ms on the compiled path (CUDA graphs on CUDA) for each schedule's steady row count."""
    model.enable_compiled()
    rows = sorted({int(s["rows_max"]) for s in shapes.values() if "rows_max" in s})
    cache = perf_report.prefilled_cache(model, context, context + max(rows))
    started = time.perf_counter()
    for r in rows:  # untimed: the third call compiles the graph, and each row count records its CUDA graph
        forward_ms(model, cache, r, context, 3)
    graphs = model.compiled.compiled_graphs()
    log(f"compiled {graphs} graph(s) for rows {rows} in {time.perf_counter() - started:.0f} s")
    timings = {r: forward_ms(model, cache, r, context, 20) for r in rows}
    model.path = "eager"
    return timings


def perf_part(device: str, quick: bool) -> dict[str, Any]:
    """Part (d): scripts/perf_report.py's figures on the bundled model."""
    args = ["--device", device, "--json", "-"]
    if quick:
        args.append("--quick")
    return perf_report.collect(perf_report.parse(args))


# --- report -------------------------------------------------------------------------------------------------
def markdown(result: dict[str, Any]) -> str:
    lines = ["# specframe device check", ""]
    m = result["machine"]
    cuda = m.get("cuda") or {}
    lines += [
        f"- device: {result['device']} ({cuda.get('device', m['cpu'])}), torch {m['torch']}, "
        f"quick={result['quick']}, {result['seconds']:.0f} s",
        "",
    ]
    for note in result["notes"]:
        lines.append(f"- {note}")
    lines += [
        "",
        "## (a) Greedy speculative output vs AR",
        "",
        "| model | dtype | schedule | width | identical / prompts | first divergence (tokens) | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["correctness"]:
        if "error" in row:
            lines.append(
                f"| {row['model']} | {row['dtype']} | {row['schedule']} | {row['width']} | - | "
                f"{row['error'][:80]} | ERROR |"
            )
            continue
        verdict = {True: "pass", False: "FAIL", None: "reported"}[row["ok"]]
        divs = ", ".join("-" if d is None else str(d) for d in row["first_divergence"])
        lines.append(
            f"| {row['model']} | {row['dtype']} | {row['schedule']} | {row['width'] or '-'} | "
            f"{row['identical']}/{row['prompts']} | {divs} | {verdict} |"
        )
    lines += ["", "## (b) Schedule comparison (smoke task)", ""]
    for entry in result["bench"]:
        lines.append(f"### {entry['model']}")
        lines += ["", "```", entry.get("report") or entry.get("error", ""), "```", ""]
    mb = result.get("memory_bound")
    if mb:
        lines += [
            "## (c) Memory-bound forward (random Nemotron-style model, bfloat16)",
            "",
            f"- {mb['config']['parameters'] / 1e6:,.1f}M parameters, {mb['weight_bytes'] / 2**20:,.1f} MiB of "
            f"weights; copy bandwidth {mb['copy_bandwidth_gb_s']:.0f} GB/s; weight-streaming floor "
            f"{mb['floor_ms']:.3f} ms per forward; {mb['context_rows']} cached rows",
            "- a memory-bound forward costs about the floor whatever its row count: compare 'x floor' and "
            "'x 1 row' across the schedules' call shapes",
            "",
            "| schedule | width | rows/call (max) | forward ms | x floor | x 1 row | decoder ms/NFE |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, s in mb["call_shapes"].items():
            if "error" in s:
                lines.append(f"| {name} | {s['width']} | - | - | - | - | {s['error'][:60]} |")
            else:
                lines.append(
                    f"| {name} | {s['width']} | {s['rows_max']} | {s['forward_ms']:.3f} | "
                    f"{s['over_floor']:.2f} | {s['over_one_row']:.2f} | {s['decoder_ms_per_nfe']:.3f} |"
                )
        lines += ["", "| rows | forward ms |", "| --- | --- |"]
        lines += [f"| {r} | {t:.3f} |" for r, t in mb["forward_ms_by_rows"].items()]
        lines += ["", "Compiled path (graphs on; CUDA graphs on CUDA):", ""]
        if mb.get("graphs_note"):
            lines.append(f"- {mb['graphs_note']}")
        lines += [
            f"- {r} rows: {t:.3f} ms ({t / mb['floor_ms']:.2f} x floor)" for r, t in mb["graphs_ms_by_rows"].items()
        ]
    perf = result.get("perf")
    if perf:
        lines += ["", "## (d) Performance report (bundled model)", "", perf.get("text") or perf.get("error", "")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder for gpu_check.json, gpu_check.md and bench outputs")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke run of this script)")
    parser.add_argument("--device", help="default: cuda when available, else cpu")
    parser.add_argument("--parts", default="a,b,c,d", help="which parts to run (default a,b,c,d)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    parts = set(args.parts.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    notes = []
    if device == "cpu":
        notes.append(
            "CUDA is not available: every part runs on the CPU (CUDA synchronisation and the GPU "
            "bandwidth figure do not apply); run on a CUDA machine for the real check"
        )
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    bundled = {f"bundled-{name}": bundled_model(name) for name in bundled_model_names()}
    if not bundled:
        notes.append(
            "this installation ships no bundled model (specframe/assets/models is empty): parts (a) and "
            "(b) use random-weight checkpoints only"
        )
    models = {**bundled, **random_checkpoints(work, args.quick)}
    prompts = [e.prompt for e in get_task("smoke").load()][: 3 if args.quick else 6]
    result: dict[str, Any] = {
        "device": device,
        "quick": args.quick,
        "machine": machine_description(),
        "notes": notes,
        "correctness": [],
        "bench": [],
        "memory_bound": None,
        "perf": None,
    }
    if "a" in parts:
        log("(a) greedy correctness")
        result["correctness"] = correctness(
            models, device, prompts, [3] if args.quick else [4, 8], 16 if args.quick else 64
        )
    broken: dict[str, set[str]] = {}
    for row in result["correctness"]:
        if "error" in row:
            broken.setdefault(row["model"], set()).add(row["schedule"])
    if "b" in parts:
        log("(b) schedule comparison")
        targets = bundled or {"random-nemotron": models["random-nemotron"]}
        result["bench"] = schedule_comparison(targets, device, args.out, args.quick, broken)
    if "c" in parts:
        log("(c) memory-bound forward")
        try:
            result["memory_bound"] = memory_bound(work, device, args.quick)
        except Exception as exc:
            result["memory_bound"] = None
            notes.append(f"part (c) failed: {type(exc).__name__}: {exc}")
    if "d" in parts and bundled:
        log("(d) performance report")
        try:
            result["perf"] = perf_part(device, args.quick)
        except Exception as exc:
            result["perf"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=3)}
            notes.append(f"part (d) failed: {type(exc).__name__}: {exc}")
    result["seconds"] = time.perf_counter() - started
    failures = [r for r in result["correctness"] if r.get("ok") is False]
    result["passed"] = not failures
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    (args.out / "gpu_check.md").write_text(markdown(result), encoding="utf-8")
    log(f"done in {result['seconds']:.0f} s; float32 failures/errors: {len(failures)}; wrote {args.out}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
