"""Load-independent check of what ``width: "auto"`` chooses: every call costed by one fixed reference model.

On a shared machine, timings swing by 2x within a minute, so a timed comparison of two decoders that differ
by 3% says little. This script takes timing out of the comparison: it measures a reference cost table once
(the fastest of many interleaved rounds of each (context, rows) pair, i.e. the machine when quiet), gives it
to the automatic decoder as its cost model (so its choices are those of an accurate calibration), runs
plain AR, the automatic decoder and fixed widths on the task's prompts (greedy, so every decoder's calls
are deterministic), and costs every call of every decoder by the same table at the call's rows and
context. It prints each method's modelled tokens per second and its ratio to AR and to the best fixed
width. The decoders' own host work per call is taken as the same for all (``--host-ms``); a real run adds
the choice's own cost on top.

Usage::

    python scripts/auto_replay.py --task humaneval --limit 40 --widths 2,3,4,8 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from specframe import compose
from specframe.auto import policy as auto_module
from specframe.auto.costs import CostModel
from specframe.bench.tasks import get_task
from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.models.threads import apply_threads

ROWS = (1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32)
CONTEXTS = (64, 320)


def reference_cost(model, rounds: int, host_ms: float) -> CostModel:
    """The fastest of ``rounds`` interleaved timings of each (context, rows) pair, as a cost model."""
    caches, inputs = {}, {}
    with torch.inference_mode():
        for c in CONTEXTS:
            cache = model.new_cache(c + max(ROWS) + 1)
            pos = torch.arange(c)
            model.forward(
                cache, ModelCall(torch.randint(10, 100, (c,)), pos, torch.ones(c, c, dtype=torch.bool).tril(), pos[-1:])
            )
            cache.commit(list(range(c)), list(range(c)))
            caches[c] = cache
            for r in ROWS:
                tri = torch.ones(r, r, dtype=torch.bool).tril()
                inputs[c, r] = (torch.randint(10, 100, (r,)), torch.arange(c, c + r), tri, torch.arange(r))
        best = dict.fromkeys(inputs, float("inf"))
        order = list(inputs)
        shuffle = random.Random(0)
        for _ in range(rounds):
            shuffle.shuffle(order)
            for key in order:
                start = time.perf_counter()
                model.forward(caches[key[0]], ModelCall(*inputs[key]))
                best[key] = min(best[key], time.perf_counter() - start)
    short = tuple((r, best[CONTEXTS[0], r]) for r in ROWS)
    long = tuple((r, max(best[CONTEXTS[1], r], s)) for r, s in short)
    delta = (short[-1][1] - short[0][1]) / (short[-1][0] - short[0][0])
    return CostModel(short[0][1], delta, short, host_ms / 1e3, CONTEXTS[0], long, CONTEXTS[1], source="given")


def modelled_seconds(cost: CostModel, prompt_tokens: int, metrics) -> float:
    """Seconds of a generation's calls under ``cost``: each call's rows over the positions cached before it."""
    total, context = 0.0, 0
    for i, rows in enumerate(metrics.rows_per_call):
        if i == 0:  # the prompt call: its rows are the prompt (and its drafts), over an empty cache
            total += cost.seconds(rows, 0)
            context = prompt_tokens
            continue
        total += cost.seconds(rows, context)
        context += metrics.verifications[i - 1].appended if i - 1 < len(metrics.verifications) else 1
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="nemotron-stdlib-tiny")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--prompt-template", default=None, help="'chat' for the model's chat template")
    parser.add_argument("--task", default="smoke")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--schedule", default="packed", help="the schedule whose width 'auto' chooses")
    parser.add_argument("--widths", default="2,3,4,8")
    parser.add_argument("--auto-schedule", action="store_true", help="also run schedule 'auto'")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--host-ms", type=float, default=0.3, help="decoder host ms per call, for every method")
    parser.add_argument("--cost", default="/tmp/specframe-reference-cost.json", help="reference cost cache")
    parser.add_argument("--repeats", type=int, default=1, help="pass over the prompts this many times (one decoder)")
    parser.add_argument("--z", type=float, default=None, help="override auto's CONFIDENCE_Z (deviations)")
    parser.add_argument("--margin", type=float, default=None, help="override auto's SWITCH_MARGIN")
    args = parser.parse_args()
    if args.z is not None:
        auto_module.CONFIDENCE_Z = args.z
    if args.margin is not None:
        auto_module.SWITCH_MARGIN = args.margin

    model = load_model(args.model, dtype=args.dtype)
    apply_threads(model, 1)
    path = Path(args.cost)
    if path.exists():
        cost = CostModel.from_mapping(json.loads(path.read_text()))
    else:
        cost = reference_cost(model, args.rounds, args.host_ms)
        path.write_text(json.dumps(cost.to_dict()))
    print(cost.describe().split("\nmodel")[0])
    examples = get_task(args.task).load(None)[: args.limit]
    prompts = [e.prompt for e in examples]
    if args.prompt_template == "chat":
        from specframe.models.chat import chat_prompt

        prompts = [chat_prompt(model.tokenizer, p, where="--prompt-template chat") for p in prompts]
    base = {"model": model, "max_new_tokens": args.max_new_tokens, "cost": cost.to_dict()}
    methods = {"ar": compose({**base, "schedule": "ar"})}
    methods[f"{args.schedule}/wauto"] = compose({**base, "schedule": args.schedule, "width": "auto"})
    if args.auto_schedule:
        methods["auto/wauto"] = compose({**base, "schedule": "auto", "width": "auto"})
    for w in filter(None, args.widths.split(",")):
        methods[f"{args.schedule}/w{w}"] = compose({**base, "schedule": args.schedule, "width": int(w)})
    totals = {name: [0.0, 0, 0] for name in methods}
    histograms: dict[str, dict[str, int]] = {name: {} for name in methods}
    reference = None
    for index, prompt in [(i, p) for _ in range(args.repeats) for i, p in enumerate(prompts)]:
        for name, decoder in methods.items():
            result = decoder.generate(prompt)
            if name == "ar":
                reference = result.output_ids
            elif result.output_ids != reference:  # (near-ties in low precision)
                print(f"note: {name} differs from ar on prompt {index}")
            totals[name][0] += modelled_seconds(cost, len(result.prompt_ids), result.metrics)
            totals[name][1] += len(result.output_ids)
            totals[name][2] += result.metrics.nfe
            for label, n in result.metrics.schedule_histogram().items():
                histograms[name][label] = histograms[name].get(label, 0) + n
    rate = {name: tok / s for name, (s, tok, _) in totals.items()}
    fixed = max(v for k, v in rate.items() if "wauto" not in k)  # ar, when no fixed width is given
    print(f"\n{args.task}, {len(examples)} prompts, {args.max_new_tokens} tokens; modelled tok/s:")
    for name, (_, tok, nfe) in totals.items():
        top = sorted(histograms[name].items(), key=lambda kv: -kv[1])[:4]
        print(
            f"{name:16s} {rate[name]:7.1f}  x ar {rate[name] / rate['ar']:.3f}  x best fixed {rate[name] / fixed:.3f}"
            f"  tok/NFE {tok / nfe:.3f}  {dict(top) if 'wauto' in name else ''}"
        )


if __name__ == "__main__":
    main()
