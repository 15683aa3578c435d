"""How close batched decoding comes to what the model allows, measured in one process.

Usage::

    python scripts/batch_scaling.py                          # bundled model, ar, 16 prompts, 8 in flight
    python scripts/batch_scaling.py --model smollm2-135m --dtype float32 --schedule ar --batch 8

The *bound* is what batching alone can buy: ``B x t(one 1-row call) / t(one forward of B requests' 1-row
calls)``, each request against its own cache of a typical context, timed here (fastest of ``--repeats``,
interleaved). The *achieved* ratio is decoding throughput at ``--batch`` requests in flight over one at a
time (the engine core's ``batching.run`` with ``max_batch`` B and 1, same prompts and seeds, wall time,
interleaved ``--repeats`` times, fastest kept). ``achieved / bound`` is the share of the model's batching
gain the engine delivers; the host (planning, masks, acceptance, bookkeeping) takes the rest. With
``--kv-blocks N`` the batched run is also timed with its caches paged from a pool of N blocks
(``paged_over_contiguous``). Every batched output is checked equal to its unbatched one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specframe import batching, compose
from specframe.bench.output import machine_description
from specframe.models.base import ModelCall
from specframe.models.paged import BlockPool

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts folder, for serve_load's prompts
from serve_load import PROMPTS as SERVE_PROMPTS  # noqa: E402

#: serve_load's code prompts, then 8 more (chat and code).
PROMPTS = [
    *SERVE_PROMPTS,
    "Write a haiku about the sea.",
    "Explain what a linked list is.",
    "def merge_sorted(a, b):",
    "What is the capital of France?",
    "def binary_search(xs, target):",
    "List three uses of copper.",
    "def count_words(text):",
    "Describe a cat in one sentence.",
]


def one_row_calls(model, caches):
    """One 1-row call per cache, all in one forward (``forward`` for one, ``forward_many`` for several)."""
    calls = []
    for cache in caches:
        position = cache.length
        calls.append(
            (
                cache,
                ModelCall(
                    torch.tensor([7], device=model.device),
                    torch.tensor([position], device=model.device),
                    torch.ones(1, 1, dtype=torch.bool, device=model.device),
                    torch.tensor([0], device=model.device),
                ),
            )
        )
    started = time.perf_counter()
    if len(calls) == 1:
        model.forward(*calls[0])
    else:
        model.forward_many(calls)
    return time.perf_counter() - started


def decode(decoder, max_batch, pool=None):
    """Every prompt through one engine-core run: (wall seconds, output tokens, outputs)."""
    started = time.perf_counter()
    steppers = [decoder.stepper(prompt, seed=seed) for seed, prompt in enumerate(PROMPTS)]
    results = {p.key: p.generation for p in batching.run(steppers, max_batch, pool) if p.generation is not None}
    outputs = [results[i].output_ids for i in range(len(PROMPTS))]
    return time.perf_counter() - started, sum(len(ids) for ids in outputs), outputs


def prefilled(model, context):
    cache = model.new_cache(context + 4)
    ids = torch.arange(context, device=model.device) % (model.vocab_size - 1)
    model.forward(
        cache,
        ModelCall(
            ids,
            torch.arange(context, device=model.device),
            torch.ones(context, context, dtype=torch.bool, device=model.device).tril(),
            torch.tensor([context - 1], device=model.device),
        ),
    )
    cache.commit(list(range(context)), list(range(context)))
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--quant", default=None)
    parser.add_argument("--schedule", default="ar")
    parser.add_argument("--width", default="auto")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--context", type=int, default=64, help="cache length of the bound's calls")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-blocks", type=int, default=None, help="also time the batch paged from this many blocks")
    parser.add_argument("--kv-block-size", type=int, default=16)
    args = parser.parse_args()
    config = {"schedule": args.schedule, "width": args.width, "max_new_tokens": args.max_new_tokens}
    for key in ("model", "dtype", "quant"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    decoder = compose(config)
    model = decoder.model
    caches = [prefilled(model, args.context) for _ in range(args.batch)]
    pool = None if args.kv_blocks is None else BlockPool.for_model(model, args.kv_blocks, args.kv_block_size)
    decode(decoder, args.batch)  # warm up
    one, many, outputs = [], [], {}
    runs = {"alone": (1, None), "batched": (args.batch, None)} | ({"paged": (args.batch, pool)} if pool else {})
    times = {label: [] for label in runs}
    for _ in range(args.repeats):
        for _ in range(5):
            one.append(one_row_calls(model, caches[:1]))
            many.append(one_row_calls(model, caches))
        for label, (size, paging) in runs.items():
            wall, tokens, decoded = decode(decoder, size, paging)
            times[label].append((wall, tokens))
            outputs.setdefault(label, decoded)
    bound = args.batch * min(one) / min(many)
    rate = {label: max(tokens / wall for wall, tokens in runs) for label, runs in times.items()}
    achieved = rate["batched"] / rate["alone"]
    report = {
        "machine": {key: value for key, value in machine_description().items() if key in ("cpu", "cpu_count", "torch")},
        "model": model.name,
        "schedule": args.schedule,
        "width": args.width,
        "batch": args.batch,
        "one_row_call_ms": round(1000 * min(one), 3),
        "batched_call_ms": round(1000 * min(many), 3),
        "bound": round(bound, 2),
        "tok_s_alone": round(rate["alone"], 1),
        "tok_s_batched": round(rate["batched"], 1),
        "achieved": round(achieved, 2),
        "achieved_over_bound": round(achieved / bound, 2),
        "paged_over_contiguous": round(rate["paged"] / rate["batched"], 3) if pool else None,
        "same_outputs": {
            label: sum(a == b for a, b in zip(outputs["alone"], decoded, strict=True))
            for label, decoded in outputs.items()
        },
        "requests": len(PROMPTS),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
