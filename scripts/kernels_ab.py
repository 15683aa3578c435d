"""specframe's CPU kernels against torch's on one model, interleaved in one process: model calls by row count.

Usage::

    python scripts/kernels_ab.py --model smollm2-135m --dtype float32
    python scripts/kernels_ab.py --model smollm2-135m --dtype bfloat16 --rows 1,2,4,6,10 --rounds 5

Both kernel sets run the same calls (a causal call of R rows after a 128-row cache) in alternating rounds, so
a machine that slows down slows both alike; each figure is the fastest call of all rounds. Also printed: each
call against the 1-row call of its kernel set, and the one-row call against the read floor (the bytes a call
streams over this machine's copy bandwidth). torch's kernels are what ``SPECFRAME_KERNELS=0`` runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from perf_report import CONTEXT, prefilled_cache, streamed_bytes, streaming_floor  # noqa: E402

from specframe import compose, kernels  # noqa: E402
from specframe.bench.output import machine_description  # noqa: E402
from specframe.models import load_model  # noqa: E402
from specframe.models.base import ModelCall  # noqa: E402


def use(model, kind: str) -> None:
    """Rebuild the model's projections with ``kind``'s kernels (``specframe`` or ``torch``)."""
    os.environ[kernels.SWITCH] = "1" if kind == "specframe" else "0"
    model.set_cpu_tuning(True)


def fastest(model, cache, rows: int, repeats: int) -> float:
    ids = torch.randint(0, model.vocab_size, (rows,))
    positions = torch.arange(cache.length, cache.length + rows)
    call = ModelCall(ids, positions, torch.ones(rows, rows, dtype=torch.bool).tril(), checked=True)
    model.forward(cache, call)  # warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        model.forward(cache, call)
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rows", default="1,2,4,6,10,18")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    model = load_model(args.model, dtype=args.dtype)
    model.check_inputs = False
    compose({"model": model, "schedule": "ar", "threads": args.threads})
    cache = prefilled_cache(model, CONTEXT, CONTEXT + max(rows))
    times: dict[tuple[str, int], float] = {}
    for _ in range(args.rounds):
        for kind in ("specframe", "torch"):
            use(model, kind)
            for r in rows:
                times[kind, r] = min(times.get((kind, r), float("inf")), fastest(model, cache, r, args.repeats))
    use(model, "specframe")
    nbytes = streamed_bytes(model)
    copy = streaming_floor(nbytes, model.dtype, torch.device("cpu"))["copy_gb_s"]
    machine = machine_description()
    flags = ", ".join(machine["cpu_flags"])
    print(f"{args.model} {args.dtype}, {torch.get_num_threads()} threads; {machine['cpu']} ({flags})")
    print(f"streamed {nbytes / 2**20:.1f} MiB, copy {copy:.1f} GB/s, read floor {nbytes / copy / 1e6:.2f} ms")
    print(f"kernels: {model.kernel_report()['kernels']}")
    print("| rows | specframe ms | x 1 row | torch ms | x 1 row | torch / specframe |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ours, theirs = times["specframe", r], times["torch", r]
        print(
            f"| {r} | {ours:.2f} | {ours / times['specframe', 1]:.2f} | {theirs:.2f} | "
            f"{theirs / times['torch', 1]:.2f} | {theirs / ours:.2f} |"
        )


if __name__ == "__main__":
    main()
