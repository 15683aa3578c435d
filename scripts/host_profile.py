"""The decoder's host work per model call, measured with the model taken out.

Usage::

    python scripts/host_profile.py                                   # ar, packed W=8; greedy, both models
    python scripts/host_profile.py --sampled                         # rejection sampling, top-k 20
    python scripts/host_profile.py --model setdlm-stdlib-tiny --order confidence
    python scripts/host_profile.py --methods packed:8 --cprofile 25  # plus the 25 costliest functions
    python scripts/host_profile.py --floor                           # the cold cost of single host steps

Each method decodes a few prompts once with the model, recording every call's logits; then the same
requests are decoded again with the model's forward replaced by a lookup of the recorded logits (the KV cache
is reserved as a forward would, so the commits do their real work). The replay must make the same calls and
produce the same tokens (the script fails otherwise). Its time is host work only: planning, layout,
acceptance and bookkeeping, what ``bench``'s ``non_model_share`` counts. Times are this thread's CPU time
(``time.thread_time``), so that time other processes hold the core is not counted, and the fastest of
``--repeats`` replays is reported, in microseconds per call (the request's setup and result included, spread
over its calls), split by part of the loop:

* ``plan``: ``schedule.plan`` (the verification window, the order, the plan record);
* ``layout``: ``builder.physical`` (the template lookup, the ids and positions copied to the device);
* ``read``: ``builder.read`` (the logits split into verifier and drafter rows);
* ``update``: ``schedule.update`` (acceptance, the one host read, state bookkeeping, the next draft);
* ``ledger``: the request's cache ledger settling the verdict (acceptance, stopping rules, the KV cache
  commit of accepted rows);
* ``loop``: the rest of the decoder loop (clocks, metrics, the checked-call context).

``total`` is the sum, probes included (two clock reads per part and call); ``bare`` is the same replay on a
second decoder without the probes: the host work per call as the bench sees it.

A real forward streams the model's weights through the caches, so the host work after it runs with cold
caches, 2-5x slower than in a warm replay. ``--cold`` emulates that: each replayed call first reads a buffer
as large as the model's weights (that read is not counted). Either way the call's logits are read once before
they are returned (not counted either): a forward has just written them, so they are in the caches.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from array import array
from collections.abc import Callable
from typing import Any

import torch

from specframe import compose
from specframe.bench.tasks import get_task
from specframe.decoder import Decoder
from specframe.models import load_model

PARTS = ("plan", "layout", "read", "update", "ledger")


class Replay:
    """Records a model's logits per call, then serves them back in the same order instead of running it."""

    def __init__(self, model: Any, cold: bool = False) -> None:
        self.model = model
        self.forward = model.forward
        self.calls: list[torch.Tensor] = []
        self.index = 0
        self.flush = None
        if cold:
            nbytes = sum(p.numel() * p.element_size() for p in weights(model))
            self.flush = torch.ones(max(nbytes // 4, 1))

    def record(self, cache, call):
        logits = self.forward(cache, call)
        self.calls.append(logits.clone())
        return logits

    def replay(self, cache, call):
        rows = call.input_ids.shape[0] if call.output_rows is None else call.output_rows.shape[0]
        if self.index >= len(self.calls) or self.calls[self.index].shape[0] != rows:
            raise SystemExit(f"the replay diverged from the recorded run at call {self.index + 1}")
        logits = self.calls[self.index]
        self.index += 1
        started = clock()
        if self.flush is not None:
            self.flush.sum()
        logits.max()  # a forward has just written its logits: they are in the caches (not counted)
        self.flushed += clock() - started
        cache.reserve(call.input_ids.shape[0])
        return logits

    flushed = 0.0


def weights(model: Any) -> list[torch.Tensor]:
    """The model's parameter tensors (those of its ``torch.nn.Module``, if it exposes one)."""
    for value in vars(model).values():
        if isinstance(value, torch.nn.Module):
            return list(value.parameters())
    return [v for v in vars(model).values() if isinstance(v, torch.Tensor)]


#: The clock of every figure: this thread's CPU time, so that time other processes hold the core is not counted.
clock = time.thread_time


def timed(parts: dict[str, float], name: str, function: Callable) -> Callable:
    """``function`` with its CPU time added to ``parts[name]``."""

    def wrapper(*args, **kwargs):
        started = clock()
        try:
            return function(*args, **kwargs)
        finally:
            parts[name] += clock() - started

    return wrapper


def instrument(decoder: Decoder, parts: dict[str, float]) -> None:
    """Time the loop's parts (the wrappers add well under a microsecond each)."""
    schedule, builder = decoder.schedule, decoder.builder
    schedule.plan = timed(parts, "plan", type(schedule).plan.__get__(schedule))
    schedule.update = timed(parts, "update", type(schedule).update.__get__(schedule))
    builder.physical = timed(parts, "layout", type(builder).physical.__get__(builder))
    builder.read = timed(parts, "read", type(builder).read.__get__(builder))
    stepper = decoder.stepper

    def traced_stepper(*args, **kwargs):
        made = stepper(*args, **kwargs)
        made.ledger.settle = timed(parts, "ledger", made.ledger.settle)
        return made

    decoder.stepper = traced_stepper


def profile_method(
    model: Any, prompts: list[list[int]], config: dict[str, Any], repeats: int, cprofile: int, cold: bool = False
) -> dict[str, Any]:
    """Record one run of ``config`` over ``prompts``, replay it ``repeats`` times; host µs per call by part."""
    decoder = compose({**config, "model": model})
    replay = Replay(model, cold)
    model.forward = replay.record
    try:
        expected = [decoder.generate(prompt_ids=p).output_ids for p in prompts]
    finally:
        del model.forward
    best: dict[str, float] | None = None
    stats_text = ""
    attempts = repeats + 1 + bool(cprofile)  # the first replay warms templates up, untimed; the last is profiled
    parts: dict[str, float] = {}
    traced = compose({**config, "model": model})  # one decoder, as bench composes: templates are kept
    instrument(traced, parts)
    plain = compose({**config, "model": model})  # the same, uninstrumented: the total without the probes
    bare: list[float] = []
    for attempt in range(attempts):
        parts.update(dict.fromkeys((*PARTS, "wall"), 0.0))
        replay.index = 0
        replay.flushed = 0.0
        model.forward = replay.replay
        profiler = cProfile.Profile() if cprofile and attempt == attempts - 1 else None
        calls = 0
        try:
            if profiler:
                profiler.enable()
            for prompt, tokens in zip(prompts, expected, strict=True):
                started = clock()
                result = traced.generate(prompt_ids=prompt)
                parts["wall"] += clock() - started
                if result.output_ids != tokens:
                    raise SystemExit(f"the replay of {config} diverged from the recorded run")
                calls += result.metrics.nfe
            if profiler:
                profiler.disable()
        finally:
            del model.forward
        if replay.index != len(replay.calls):
            raise SystemExit(f"replay of {config} made {replay.index} calls, the recorded run {len(replay.calls)}")
        parts["wall"] -= replay.flushed
        if attempt and not profiler:
            bare.append(replay_total(plain, model, replay, prompts, expected) / calls * 1e6)
        per_call = {k: v / calls * 1e6 for k, v in parts.items()}
        per_call["loop"] = per_call["wall"] - sum(per_call[p] for p in PARTS)
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(cprofile)
            stats_text = out.getvalue()
        elif attempt and (best is None or per_call["wall"] < best["wall"]):
            best = per_call
    assert best is not None
    best["bare"] = min(bare)
    return {"calls_per_run": len(replay.calls), "us_per_call": best, "cprofile": stats_text}


def replay_total(decoder: Decoder, model: Any, replay: Replay, prompts: list[list[int]], expected: list) -> float:
    """CPU seconds of one uninstrumented replay of every prompt (the cache flushes not counted)."""
    replay.index = 0
    replay.flushed = 0.0
    model.forward = replay.replay
    total = 0.0
    try:
        for prompt, tokens in zip(prompts, expected, strict=True):
            started = clock()
            result = decoder.generate(prompt_ids=prompt)
            total += clock() - started
            if result.output_ids != tokens:
                raise SystemExit("the uninstrumented replay diverged from the recorded run")
    finally:
        del model.forward
    return total - replay.flushed


def floor(weight_bytes: int, samples: int = 300) -> list[tuple[str, float, float]]:
    """Median µs of single host steps, warm and after a cache flush as large as the weights: the cold floor.

    After a forward, each library path the host touches first (a numpy reduction, a tensor made from a host
    buffer, a tensor slice, a few Python dicts) costs 12-15 µs of cache misses, whatever little it computes.
    """
    flush = torch.ones(max(weight_bytes // 4, 1))
    logits = torch.randn(17, 2048)
    ids = list(range(18))

    def minimal() -> None:  # the least a greedy Packed-SS call needs: an argmax, ids and positions, a dict
        tokens = logits.numpy().argmax(-1).tolist()
        torch.frombuffer(array("q", tokens + [1]), dtype=torch.int64)
        torch.frombuffer(array("q", ids), dtype=torch.int64)
        dict(zip(ids[:17], tokens, strict=True))

    steps = {
        "nothing (a call and two clock reads)": lambda: None,
        "numpy argmax of 17 x 2048 logits": lambda: logits.numpy().argmax(-1).tolist(),
        "one tensor from a host buffer": lambda: torch.frombuffer(array("q", ids), dtype=torch.int64),
        "two tensors from host buffers": lambda: [torch.frombuffer(array("q", ids), dtype=torch.int64) for _ in "ab"],
        "a tensor slice": lambda: logits[:9],
        "a dict and a list of 18 entries": lambda: [k for k in {p: (p, p) for p in ids} if k & 1],
        "all of argmax, two tensors, a dict": minimal,
    }
    rows = []
    for label, step in steps.items():
        medians = []
        for cold in (False, True):
            times = []
            for _ in range(samples):
                if cold:
                    flush.sum()
                logits.max()
                started = clock()
                step()
                times.append(clock() - started)
            medians.append(sorted(times)[samples // 2] * 1e6)
        rows.append((label, *medians))
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="model(s); default both bundled models")
    parser.add_argument("--methods", default="ar,packed:8", help="schedule[:width], comma-separated")
    parser.add_argument("--order", default=None, help="order (default: ltr; confidence on setdlm models)")
    parser.add_argument("--sampled", action="store_true", help="rejection sampling, temperature 1, top-k 20")
    parser.add_argument("--top-k", type=int, default=20, help="top-k of --sampled (0: none)")
    parser.add_argument("--top-p", type=float, default=None, help="top-p of --sampled")
    parser.add_argument("--prompts", type=int, default=4, help="humaneval prompts to decode")
    parser.add_argument("--tokens", type=int, default=128, help="max new tokens")
    parser.add_argument("--repeats", type=int, default=5, help="timed replays (the fastest is reported)")
    parser.add_argument("--cold", action="store_true", help="flush the caches before each call, as a forward does")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N", help="print the N costliest functions")
    parser.add_argument("--floor", action="store_true", help="only the warm and cold cost of single host steps")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    models = args.model or ["nemotron-stdlib-tiny", "setdlm-stdlib-tiny"]
    if args.floor:
        nbytes = sum(p.numel() * p.element_size() for p in weights(load_model(models[0])))
        print(f"median µs of one host step, warm and after reading {nbytes / 1e6:.1f} MB (as a forward does)")
        for label, warm, cold in floor(nbytes):
            print(f"{label:40} {warm:7.1f} {cold:7.1f}")
        return 0
    acceptance: Any = "greedy"
    if args.sampled:
        acceptance = {"name": "rejection", "temperature": 1.0, "top_k": args.top_k or None, "top_p": args.top_p}
    examples = get_task("humaneval").load(None)
    caches = "cold caches" if args.cold else "warm caches"
    print(f"host work per call, model replayed (µs, {caches}); {args.prompts} humaneval prompts, {args.tokens} tokens")
    header = " ".join(f"{p:>7}" for p in (*PARTS, "loop"))
    print(f"{'model':22} {'method':10} {'order':10} {'calls':>5} {header}   total    bare")
    for name in models:
        model = load_model(name)
        prompts = [model.encode_prompt(ex.prompt) for ex in examples[: args.prompts]]
        order = args.order or ("confidence" if "setdlm" in name else "ltr")
        for method in args.methods.split(","):
            schedule, _, width = method.partition(":")
            config = {
                "schedule": schedule,
                "width": int(width) if width else 1,
                "order": order if width else "ltr",
                "acceptance": acceptance,
                "max_new_tokens": args.tokens,
                "seed": 0,
            }
            result = profile_method(model, prompts, config, args.repeats, args.cprofile, args.cold)
            row = result["us_per_call"]
            cells = " ".join(f"{row[p]:7.1f}" for p in (*PARTS, "loop"))
            label = config["order"]
            line = f"{name:22} {method:10} {label:10} {result['calls_per_run']:5d} {cells} {row['wall']:7.1f}"
            print(f"{line} {row['bare']:7.1f}")
            if result["cprofile"]:
                print(result["cprofile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
