"""How wide a bench run's paired intervals are from timing noise alone: a method against itself.

``specframe bench --repeats N`` times every method N times per prompt, interleaved. Comparing one repeat of a
method with another repeat of the *same* method (an A/A comparison: same plans, same outputs, only the
moment differs) gives the interval that timing noise alone produces, with the same prompts, the same
bootstrap and one response per prompt on each side. Set against it, a method-vs-baseline interval of the
same shape (one repeat of each) shows how much of its width is the method's own (an automatic choice that
switches from prompt to prompt) and how much is the noise every method shares.

Nothing here changes how bench computes its figures: it reads the run's records and bootstraps the ratio
of throughputs (tokens over wall seconds, summed over prompts) exactly as the run's report does, only over
other pairs of columns.

Usage::

    specframe bench --task humaneval --limit 40 --schedules ar,packed,auto --widths auto --repeats 3 --out runs/he3
    python scripts/bench_aa.py runs/he3
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from specframe.bench.stats import PairedBootstrap


def columns(records: list[dict]) -> tuple[dict[str, np.ndarray], dict[str, int], list[int]]:
    """Per-prompt tokens and wall seconds by ``method/repeat``, the repeats of each method, the prompts."""
    cells: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    repeats: dict[str, int] = defaultdict(int)
    for record in records:
        metrics = record["metrics"]
        cells[f"{record['method']}#{record['repeat']}"][record["prompt_index"]] = (
            metrics["generated_tokens"],
            metrics["wall_s"],
        )
        repeats[record["method"]] = max(repeats[record["method"]], record["repeat"] + 1)
    prompts = sorted(set.intersection(*(set(c) for c in cells.values())))
    out = {}
    for name, cell in cells.items():
        out[f"tokens/{name}"] = np.array([cell[i][0] for i in prompts], dtype=float)
        out[f"wall/{name}"] = np.array([cell[i][1] for i in prompts], dtype=float)
    return out, dict(repeats), prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a bench output folder (with records.jsonl), run with --repeats >= 2")
    parser.add_argument("--baseline", default="ar")
    parser.add_argument("--resamples", type=int, default=20_000)
    args = parser.parse_args()
    records = [json.loads(line) for line in (args.run / "records.jsonl").read_text().splitlines() if line.strip()]
    data, repeats, prompts = columns(records)
    if max(repeats.values()) < 2:
        raise SystemExit("an A/A comparison needs a run with --repeats 2 or more")
    boot = PairedBootstrap(data, resamples=args.resamples)

    def ratio(a: str, b: str) -> str:
        e = boot.estimate(lambda s: (s[f"tokens/{a}"] / s[f"wall/{a}"]) / (s[f"tokens/{b}"] / s[f"wall/{b}"]))
        return f"{e.estimate:.3f} [{e.low:.3f}, {e.high:.3f}]  width {e.high - e.low:.3f}"

    print(f"{args.run}: {len(prompts)} prompts; throughput ratios, paired 95% bootstrap over prompts")
    print("\nA/A (a method's repeat r against its repeat 0: timing noise alone)")
    for method, n in repeats.items():
        for r in range(1, n):
            print(f"  {method:16s} #{r} vs #0   {ratio(f'{method}#{r}', f'{method}#0')}")
    print(f"\nagainst {args.baseline}, one repeat each (the same shape as the A/A rows)")
    for method, n in repeats.items():
        if method == args.baseline:
            continue
        for r in range(min(n, repeats.get(args.baseline, 0))):
            print(f"  {method:16s} #{r} vs {args.baseline} #{r}   {ratio(f'{method}#{r}', f'{args.baseline}#{r}')}")


if __name__ == "__main__":
    main()
