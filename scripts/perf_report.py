"""Where the time of a decode goes, from one run on one machine: model calls against the hardware floor.

Usage::

    python scripts/perf_report.py                          # the bundled model, float32, 128 new tokens
    python scripts/perf_report.py --model setdlm-stdlib-tiny --json out.json
    python scripts/perf_report.py --model /path/to/ckpt --dtype bfloat16 --no-compile
    python scripts/perf_report.py --quick                  # a smoke run (few tokens, no compiled path)
    python scripts/perf_report.py --model /path/to/156M-ckpt --calls-only   # floor and calls of a large model
    python scripts/perf_report.py --calls-only --fixed-shapes   # the one graph against per-row-count graphs

A 156M-parameter random checkpoint, memory-bound like real models::

    python scripts/make_random_checkpoints.py /tmp/big --family nemotron-labs-diffusion --no-tokenizer \\
        --set hidden_size=1024 --set intermediate_size=2880 --set num_hidden_layers=8 \\
        --set num_attention_heads=16 --set num_key_value_heads=4 --set head_dim=64 --set vocab_size=32000

It prints, all measured in this one process with the runs interleaved (so that a busy machine slows every
method alike; the ratios are what to read):

1. the weight-streaming floor: the time of one 1-row product over a matrix holding as many bytes as the
   model's weights, the same over the bytes a 1-row call must read (the weights less the input
   embedding), the memory copy and read bandwidths, and the read floor: those weights and the keys and
   values a 1-row call reads over the 128-row cache, at the fastest bandwidth measured;
2. the call-cost fit ``time = tau + delta x rows`` of single model calls over a 128-row cache (``--context``), per path
   (``eager``: the default path; ``compiled``: the same step as one torch.compile graph), the
   1-row call against the floor, and the ridge point ``tau / delta`` (rows at which a call costs twice a
   1-row call);
3. greedy generation of ``--tokens`` tokens (EOS disabled, so every method makes the same number):
   transformers' ``generate`` on the same weights (needs the ``bench`` extra), specframe ``ar`` on each
   path, and Packed-SS / Linear-SS at W=4 and 8 on the eager and compiled paths, as tokens/s and ratios;
4. the non-model share of wall time (``bench``'s ``non_model_share``) of each method.

The compiled path has one graph for every row count; compiling it (tens of seconds on a small CPU;
inductor caches the code on disk, so a second run only re-traces) is reported separately and not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specframe import compose
from specframe.bench.output import machine_description
from specframe.bench.tasks import get_task
from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.models.hub import resolve_source

CALL_ROWS = (1, 2, 4, 6, 10, 18, 34)
CONTEXT = 128
PROMPT = "def fibonacci(n):\n    "


def log(text: str) -> None:
    print(f"[perf_report {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- 1. the floor -------------------------------------------------------------------------------------------
def weight_bytes(model: Any) -> int:
    """Bytes of the model's weights (each tensor once: fused projections are views of the module weights)."""
    seen, total = set(), 0
    for p in model.network.parameters():
        key = (p.untyped_storage().data_ptr(), p.storage_offset(), p.numel())
        if key not in seen:
            seen.add(key)
            total += p.numel() * p.element_size()
    return total


def streamed_bytes(model: Any) -> int:
    """Bytes a 1-row call must stream: the weights less the input embedding (a call reads one row of it).

    With tied embeddings the table is the output layer too, and is streamed. Projections that run as blocks
    (``--quant``, or a checkpoint converted with ``--quant``) count the bytes the kernel reads, not the float
    copy the network keeps for training and export.
    """
    total = weight_bytes(model)
    if model.network.head is not None:
        embed = model.network.body.embed_tokens.weight
        total -= embed.numel() * embed.element_size()
    w = model.inference.weights
    for projection in [getattr(x, n) for x in w.layers for n in ("qkv", "o", "gate_up", "down")] + [w.head]:
        data = getattr(projection, "data", None)
        if data is not None and data.dtype == torch.uint8:  # blocks: the kernel streams these instead
            total += data.numel() - projection.weight.numel() * projection.weight.element_size()
    return total


def cache_bytes(model: Any, context: int) -> int:
    """Bytes of keys and values a 1-row call over ``context`` cached rows reads (every layer, its own row too)."""
    element = torch.empty((), dtype=model.dtype).element_size()
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * (context + 1) * element


def read_bandwidth(floats: torch.Tensor, repeats: int = 3) -> float:
    """GB/s of the fastest of ``repeats`` sums over ``floats``."""
    fastest = float("inf")
    for _ in range(repeats):
        sync(floats.device)
        start = time.perf_counter()
        floats.sum()
        sync(floats.device)
        fastest = min(fastest, time.perf_counter() - start)
    return floats.numel() * floats.element_size() / fastest / 1e9


def streaming_floor(nbytes: int, dtype: torch.dtype, device: torch.device, repeats: int = 20) -> dict[str, float]:
    """The time to stream ``nbytes`` of weights once: a 1-row product over one matrix of that size."""
    width = 1024
    itemsize = torch.empty((), dtype=dtype).element_size()
    matrix = torch.randn(max(1, nbytes // (itemsize * width)), width, device=device).to(dtype)
    row = torch.randn(1, width, device=device).to(dtype)
    copy_src = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    copy_dst = torch.empty_like(copy_src)
    floats = copy_src[: nbytes // 4 * 4].view(torch.float32)
    times, copies, reads = [], [], []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        F.linear(row, matrix)
        sync(device)
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        copy_dst.copy_(copy_src)
        sync(device)
        copies.append(time.perf_counter() - start)
        reads.append(read_bandwidth(floats, repeats=1))
    return {
        "floor_ms": 1000 * min(times),
        "floor_ms_median": 1000 * statistics.median(times),
        "copy_gb_s": 2 * nbytes / min(copies) / 1e9,
        "read_gb_s": max(reads),
    }


# --- 2. call costs ------------------------------------------------------------------------------------------
def prefilled_cache(model: Any, context: int, capacity: int) -> Any:
    device = model.device
    cache = model.new_cache(capacity)
    ids = torch.randint(0, model.vocab_size, (context,), device=device, generator=None)
    model.forward(
        cache,
        ModelCall(
            ids,
            torch.arange(context, device=device),
            torch.ones(context, context, dtype=torch.bool, device=device).tril(),
        ),
    )
    cache.commit(list(range(context)))
    return cache


def call_ms(model: Any, cache: Any, rows: int, repeats: int) -> tuple[float, float]:
    """``(fastest wall ms, median CPU ms)`` of a ``rows``-row causal call after the cache's rows.

    The fastest of several calls is the cost without interference from other processes; the process CPU
    time (all threads) is what the call costs the machine, whether or not it was preempted.
    """
    device = model.device
    ids = torch.randint(0, model.vocab_size, (rows,), device=device)
    positions = torch.arange(cache.length, cache.length + rows, device=device)
    attention = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    walls, cpus = [], []
    for _ in range(repeats):
        sync(device)
        start, cpu = time.perf_counter(), time.process_time()
        model.forward(cache, ModelCall(ids, positions, attention))
        sync(device)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return 1000 * min(walls), 1000 * statistics.median(cpus)


def fit(rows: list[int], ms: list[float]) -> dict[str, float]:
    """Least-squares ``ms = tau + delta * rows``, and the ridge point ``tau / delta``."""
    n = len(rows)
    mean_r, mean_t = sum(rows) / n, sum(ms) / n
    var = sum((r - mean_r) ** 2 for r in rows)
    delta = sum((r - mean_r) * (t - mean_t) for r, t in zip(rows, ms, strict=True)) / var if var else 0.0
    tau = mean_t - delta * mean_r
    return {"tau_ms": tau, "delta_ms": delta, "ridge_rows": tau / delta if delta > 0 else float("inf")}


def call_costs(
    model: Any,
    paths: list[str],
    repeats: int,
    quick: bool,
    context: int = CONTEXT,
    between: Callable[[], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per path: call time by row count over a ``context``-row cache (paths interleaved row count by row count)
    and the fit; ``between`` runs after each row count's calls (a bandwidth probe in the same minutes)."""
    out: dict[str, dict[str, Any]] = {}
    caches = {}
    for path in paths:
        set_path(model, path)
        caches[path] = prefilled_cache(model, context, context + max(CALL_ROWS))
        if path == "compiled":  # compile the graph now (untimed): the third call over a cache compiles it
            started = time.perf_counter()
            call_ms(model, caches[path], 1, 4)
            log(
                f"compiled {model.compiled.compiled_graphs()} call graph(s) in {time.perf_counter() - started:.1f} s "
                f"(compilation {model.compiled.compile_seconds:.1f} s)"
            )
        out[path] = {"ms_by_rows": {}, "cpu_ms_by_rows": {}}
    for r in CALL_ROWS[:3] if quick else CALL_ROWS:
        for path in paths:
            set_path(model, path)
            call_ms(model, caches[path], r, 1)  # warm
            out[path]["ms_by_rows"][r], out[path]["cpu_ms_by_rows"][r] = call_ms(model, caches[path], r, repeats)
        if between is not None:
            between()
    for entry in out.values():
        for key, fitted in (("ms_by_rows", "fit"), ("cpu_ms_by_rows", "cpu_fit")):
            measured = entry[key]
            if len(measured) >= 2:
                entry[fitted] = fit(list(measured), list(measured.values()))
    return out


def fixed_shapes(
    model: Any, repeats: int, rows_list: tuple[int, ...] = (2, 4, 10, 18), context: int = CONTEXT
) -> dict[int, dict[str, float]]:
    """Per row count: the compiled path's graph (every row count) against a graph fixed to that row count.

    Each fixed graph is compiled here (tens of seconds each on a small CPU); the two are called alternately
    on the same cache, and the fastest wall ms of ``repeats`` calls of each is kept.
    """
    import functools

    from specframe.models import compiled as graphs

    set_path(model, "compiled")
    cache = prefilled_cache(model, context, context + max(CALL_ROWS))
    call_ms(model, cache, 1, 4)  # the compiled path's graph exists after three calls
    out = {}
    for rows in rows_list:
        compiled = torch.compile(graphs._fresh_call(), backend="inductor", dynamic=False, fullgraph=True)
        fixed = functools.partial(compiled, model.inference.weights.for_graph())
        ids = torch.randint(0, model.vocab_size, (rows,), device=model.device)
        positions = torch.arange(cache.length, cache.length + rows, device=model.device)
        attention = torch.ones(rows, rows, dtype=torch.bool, device=model.device).tril()

        inputs = (ids, positions, attention)
        started = time.perf_counter()
        _fixed_call(model, fixed, cache, inputs)
        log(f"compiled a graph fixed to {rows} rows in {time.perf_counter() - started:.1f} s")
        times: dict[str, list[float]] = {"compiled path": [], "fixed shape": []}
        for index in range(2 * repeats):
            for name in ("compiled path", "fixed shape") if index % 2 else ("fixed shape", "compiled path"):
                sync(model.device)
                start = time.perf_counter()
                if name == "fixed shape":
                    _fixed_call(model, fixed, cache, inputs)
                else:
                    model.forward(cache, ModelCall(ids, positions, attention))
                sync(model.device)
                times[name].append(time.perf_counter() - start)
        out[rows] = {name: 1000 * min(values) for name, values in times.items()}
    out_graphs = model.compiled.compiled_graphs()
    log(f"the compiled path still has {out_graphs} graph(s)")
    return out


def _fixed_call(model: Any, fixed: Any, cache: Any, inputs: tuple[torch.Tensor, ...]) -> None:
    """One call of a fixed-shape graph (which stages the rows' keys and values in the cache, as the path's does)."""
    from specframe.models import compiled as graphs

    rows = inputs[0].shape[0]
    length = torch.tensor(cache.length, device=model.device)
    with graphs._compiling("inductor", cpp_wrapper=model.compiled.tuned):
        span = model.compiled.span(cache.capacity, cache.length + rows)
        (hidden,) = fixed(*inputs, length, cache.keys, cache.values, span, None)
    cache.reserve(rows)
    model.inference.weights.head(hidden)


def set_path(model: Any, path: str) -> None:
    if path == "compiled":
        model.enable_compiled()
    else:
        model.path = path


# --- 3. generation ------------------------------------------------------------------------------------------
def transformers_model(model: Any, source: str | None) -> Any | None:
    """The same weights in transformers' own implementation (Ministral3 / Qwen3), or ``None`` without it."""
    try:
        import transformers
    except ImportError:
        return None
    folder = resolve_source(source, revision=None)
    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    state = {name: p.detach() for name, p in model.network.state_dict().items()}
    d = model.network.config.dims
    sizes = {
        "vocab_size": d.vocab_size,
        "hidden_size": d.hidden_size,
        "intermediate_size": d.intermediate_size,
        "num_hidden_layers": d.num_layers,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": d.num_kv_heads,
        "head_dim": d.head_dim,
        "rms_norm_eps": d.rms_norm_eps,
        "max_position_embeddings": d.max_positions,
        "tie_word_embeddings": model.network.head is None,
    }
    converted = (raw.get("specframe_conversion") or {}).get("architecture")
    if converted:  # a model made by `specframe convert`: the class its users would run instead
        cls = getattr(transformers, converted)
        config = cls.config_class(**sizes, rope_parameters=raw["rope_parameters"])
    elif model.family == "nemotron-labs-diffusion":  # Ministral3 has YaRN and the Llama-4 query scaling
        config = transformers.Ministral3Config(**sizes, rope_parameters=raw["rope_parameters"])
        cls = transformers.Ministral3ForCausalLM
    else:
        theta = raw.get("backbone_config", raw).get("rope_theta", 10000.0)
        config = transformers.Qwen3Config(**sizes, rope_parameters={"rope_type": "default", "rope_theta": theta})
        cls = transformers.Qwen3ForCausalLM
    config.eos_token_id = None
    config.pad_token_id = 0
    hf = cls(config).eval().to(device=model.device, dtype=model.dtype)
    renamed = {}
    for name, tensor in state.items():
        if ".o_lora." in name or ".down_lora." in name:  # the proposal-only adapter: drafting rows only
            continue
        if name.startswith("body."):
            renamed["model." + name[len("body.") :]] = tensor
        elif name.startswith("head."):
            renamed["lm_head." + name[len("head.") :]] = tensor
    if "lm_head.weight" not in renamed:
        renamed["lm_head.weight"] = renamed["model.embed_tokens.weight"]
    hf.load_state_dict(renamed, strict=True)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


def hf_generate(hf: Any, prompt_ids: list[int], tokens: int, eos: tuple[int, ...]) -> list[int]:
    device = next(hf.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            do_sample=False,
            eos_token_id=list(eos) or None,
            pad_token_id=eos[0] if eos else 0,
        )
    sync(device)
    return out[0, len(prompt_ids) :].tolist()


def smoke_prompts(model: Any, count: int) -> list[list[int]]:
    """The first ``count`` prompts of the ``smoke`` task (random ids for a model without tokenizer)."""
    if model.tokenizer is None:
        generator = torch.Generator().manual_seed(0)
        return [torch.randint(0, model.vocab_size, (12,), generator=generator).tolist() for _ in range(count)]
    return [model.encode_prompt(e.prompt) for e in get_task("smoke").load()[:count]]


def generation(
    model: Any, source: str | None, paths: list[str], tokens: int, repeats: int, widths: list[int], prompts: int
) -> dict[str, Any]:
    """Tokens/s (wall and CPU time) and non-model share per method over the smoke prompts, greedy.

    Each run decodes every prompt (up to ``tokens`` tokens, EOS ends a prompt's output as usual, so every
    method produces the same tokens); methods are interleaved prompt by prompt in a rotating order, and the
    fastest of ``repeats`` runs counts (the one least disturbed by other processes; the median is kept too).
    """
    prompt_ids = smoke_prompts(model, prompts)
    methods: dict[str, tuple[str, str, int]] = {}
    for path in paths:
        methods[f"ar [{path}]"] = (path, "ar", 1)
        for schedule in ("packed", "linear"):
            for w in widths:
                methods[f"{schedule}/w{w} [{path}]"] = (path, schedule, w)
    hf = transformers_model(model, source)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in methods}
    outputs: dict[str, dict[int, list[int]]] = {}
    if hf is not None:
        runs["transformers generate"] = []
    warm = time.perf_counter()
    for path, schedule, width in methods.values():  # warm-up (compiles the graphs of the compiled path)
        set_path(model, path)
        decoder = compose({"model": model, "schedule": schedule, "width": width, "max_new_tokens": tokens})
        for ids in prompt_ids:
            decoder.generate(prompt_ids=ids)
    warmup_seconds = time.perf_counter() - warm
    log(f"warm-up generations (incl. compilation) took {warmup_seconds:.1f} s")
    names = list(runs)
    for repeat in range(repeats):
        totals = {name: {"wall_s": 0.0, "cpu_s": 0.0, "tokens": 0} for name in names}
        for index, ids in enumerate(prompt_ids):
            turn = (repeat * len(prompt_ids) + index) % len(names)
            for name in names[turn:] + names[:turn]:  # interleaved prompt by prompt, in a rotating order
                total = totals[name]
                sync(torch.device(model.device))
                wall, cpu = time.perf_counter(), time.process_time()
                if name == "transformers generate":
                    out = hf_generate(hf, ids, tokens, model.eos_token_ids)
                    total["wall_s"] += time.perf_counter() - wall
                    total["cpu_s"] += time.process_time() - cpu
                    total["tokens"] += len(out)
                    outputs.setdefault(name, {})[index] = out
                    continue
                path, schedule, width = methods[name]
                set_path(model, path)
                decoder = compose({"model": model, "schedule": schedule, "width": width, "max_new_tokens": tokens})
                result = decoder.generate(prompt_ids=ids)
                total["wall_s"] += time.perf_counter() - wall
                total["cpu_s"] += time.process_time() - cpu
                m = result.metrics
                total["tokens"] += m.generated_tokens
                total["decoder_wall_s"] = total.get("decoder_wall_s", 0.0) + m.wall_s
                total["model_s"] = total.get("model_s", 0.0) + m.model_s
                total["nfe"] = total.get("nfe", 0) + m.nfe
                outputs.setdefault(name, {})[index] = result.output_ids
        for name in names:
            runs[name].append(totals[name])
    table = {}
    for name, items in runs.items():
        made = items[0]["tokens"]
        table[name] = {
            "tokens_per_s": made / min(r["wall_s"] for r in items),
            "tokens_per_s_median": made / statistics.median(r["wall_s"] for r in items),
            "tokens_per_cpu_s": made / min(r["cpu_s"] for r in items),
            "tokens": made,
            "nfe": items[0].get("nfe"),
            "non_model_share": (
                statistics.median(1 - r["model_s"] / r["decoder_wall_s"] for r in items)
                if "model_s" in items[0]
                else None
            ),
        }
    reference = outputs.get("ar [eager]", [])
    agree = {name: all(a == b for a, b in zip(outs, reference, strict=True)) for name, outs in outputs.items()}
    return {
        "methods": table,
        "same_tokens_as_ar_eager": agree,
        "prompts": len(prompt_ids),
        "warmup_seconds": warmup_seconds,
    }


# --- report -------------------------------------------------------------------------------------------------
def ratios(gen: dict[str, Any], paths: list[str], widths: list[int], key: str) -> dict[str, float]:
    """Speed ratios (``key``: ``tokens_per_s`` or ``tokens_per_cpu_s``)."""
    speed = {k: v[key] for k, v in gen["methods"].items()}
    out = {}
    hf = speed.get("transformers generate")
    for path in paths:
        ar = speed.get(f"ar [{path}]")
        if hf and ar:
            out[f"ar [{path}] / transformers"] = ar / hf
        for schedule in ("packed", "linear"):
            for w in widths:
                s = speed.get(f"{schedule}/w{w} [{path}]")
                if s and ar:
                    out[f"{schedule}/w{w} / ar [{path}]"] = s / ar
    if "ar [compiled]" in speed and "ar [eager]" in speed:
        out["ar compiled / eager"] = speed["ar [compiled]"] / speed["ar [eager]"]
    return out


def _calls_table(result: dict[str, Any], key: str, fitted: str) -> list[str]:
    floor, streamed = result["floor"]["floor_ms"], result["floor"]["streamed_floor_ms"]
    read = read_floor_ms(result)
    header = (
        "| path | "
        + " | ".join(f"{r} rows" for r in CALL_ROWS)
        + " | tau ms | delta ms/row | ridge rows | 1 row / floor | 1 row / streamed floor | 1 row / read floor"
        " | 18 rows / 1 row |"
    )
    lines = [header, "|" + " --- |" * (len(CALL_ROWS) + 8)]
    nan = float("nan")
    for path, entry in result["calls"].items():
        measured = entry[key]
        cells = [f"{measured[r]:.3f}" if r in measured else "-" for r in CALL_ROWS]
        fit_ = entry.get(fitted, {})
        one = measured.get(1)
        lines.append(
            f"| {path} | " + " | ".join(cells) + f" | {fit_.get('tau_ms', nan):.3f} | "
            f"{fit_.get('delta_ms', nan):.4f} | {fit_.get('ridge_rows', nan):.1f} | "
            f"{(one / floor) if one else nan:.2f} | {(one / streamed) if one else nan:.2f} | "
            f"{(one / read) if one else nan:.2f} | {(measured[18] / one) if one and 18 in measured else nan:.2f} |"
        )
    return lines


def read_floor_ms(result: dict[str, Any]) -> float:
    """What a 1-row call must read (streamed weights and the cache's keys and values) at the fastest of the copy
    and read bandwidths measured, before the calls and between them (a floor must not overstate)."""
    f = result["floor"]
    nbytes = result["streamed_bytes"] + result.get("cache_bytes", 0)
    fastest = max(f["copy_gb_s"], f.get("read_gb_s", 0.0), f.get("read_gb_s_between_calls", 0.0))
    return nbytes / (fastest * 1e6)


def render(result: dict[str, Any]) -> str:
    """The report as Markdown."""
    m, f, context = result["machine"], result["floor"], result.get("context", CONTEXT)
    lines = [
        f"# specframe performance report: {result['model']} ({result['dtype']} on {result['device']}, "
        f"{result['threads']} thread(s))",
        "",
        f"- machine: {m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}; load average at start "
        f"{result['load_average']:.2f} (above 0 means other processes were running: read the ratios)",
        f"- weights {result['weight_bytes'] / 2**20:.1f} MiB ({result['parameters'] / 1e6:.1f}M parameters, "
        f"prepacked: {result['prepacked']}); weight-streaming floor {f['floor_ms']:.3f} ms (fastest 1-row product "
        f"over as many bytes; median {f['floor_ms_median']:.3f}); copy bandwidth {f['copy_gb_s']:.1f} GB/s "
        f"(bytes read and written), read bandwidth {f.get('read_gb_s', float('nan')):.1f} GB/s (a float32 sum; "
        f"{f.get('read_gb_s_between_calls', float('nan')):.1f} GB/s at best between the timed calls)",
        f"- streamed floor {f['streamed_floor_ms']:.3f} ms: the same over the {result['streamed_bytes'] / 2**20:.1f} "
        "MiB of weights a 1-row call must read (the weights less the input embedding, of which a call reads one "
        f"row); with the {result.get('cache_bytes', 0) / 2**20:.1f} MiB of keys and values it reads over the "
        f"{context}-row cache, at the fastest bandwidth measured, {read_floor_ms(result):.3f} ms (the read floor)",
    ]
    if result.get("kernels"):
        k = result["kernels"]
        lines.append(f"- kernels: {k['kernels']} (weights {', '.join(k['weights'])}; invariant: {k['invariant']})")
    if result.get("compile_seconds") is not None:
        lines.append(
            f"- compiled path: {result['graphs']} graph(s) for every row count, compiled (or loaded from "
            "inductor's disk cache) in "
            f"{result['compile_seconds']:.1f} s"
        )
    lines += [
        "",
        f"## Model calls over a {context}-row cache: fastest wall ms of {result['call_repeats']}",
        "",
        *_calls_table(result, "ms_by_rows", "fit"),
        "",
        "Process CPU ms (median; all threads): what the call costs the machine even when it is preempted.",
        "",
        *_calls_table(result, "cpu_ms_by_rows", "cpu_fit"),
    ]
    if result.get("fixed_shapes"):
        lines += [
            "",
            "## The compiled path's graph (every row count) against graphs fixed to one row count: fastest wall ms",
            "",
            "| rows | compiled path | fixed shape | compiled path / fixed |",
            "| --- | --- | --- | --- |",
        ]
        for rows, entry in result["fixed_shapes"].items():
            path_ms, fixed_ms = entry["compiled path"], entry["fixed shape"]
            lines.append(f"| {rows} | {path_ms:.3f} | {fixed_ms:.3f} | {path_ms / fixed_ms:.2f} |")
    gen = result["generation"]
    if gen is None:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"## Greedy generation: {gen['prompts']} smoke prompts, up to {result['tokens']} tokens each "
        f"(fastest of {result['repeats']} interleaved runs)",
        "",
        "| method | tokens | NFE | tokens/s (wall) | median run | tokens/CPU-s | non-model | same as ar [eager] |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in gen["methods"].items():
        lines.append(
            f"| {name} | {row['tokens']} | {row['nfe'] or '-'} | {row['tokens_per_s']:.1f} | "
            f"{row['tokens_per_s_median']:.1f} | "
            f"{row['tokens_per_cpu_s']:.1f} | "
            f"{'-' if row['non_model_share'] is None else format(row['non_model_share'], '.1%')} | "
            f"{gen['same_tokens_as_ar_eager'].get(name, '-')} |"
        )
    lines += ["", "## Ratios (wall / CPU time)", ""]
    for name, value in result["ratios"].items():
        lines.append(f"- {name}: {value:.2f}x / {result['cpu_ratios'].get(name, float('nan')):.2f}x")
    total = gen.get("warmup_seconds")
    if total is not None:
        lines.append(f"- warm-up generations (all methods once, untimed; includes any compilation): {total:.1f} s")
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of this script."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="bundled model name, folder or Hub id (default: nemotron-stdlib-tiny)")
    parser.add_argument("--dtype", help="default: float32 on the CPU, the checkpoint's dtype on a GPU")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quant", choices=("q8_0", "q4_0", "q4_1"), help="quantize the projections at load")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per generation method")
    parser.add_argument("--call-repeats", type=int, default=15, help="timed calls per row count")
    parser.add_argument(
        "--context",
        type=int,
        default=CONTEXT,
        help=f"cached rows the timed calls attend over (default {CONTEXT}): attention's share of a call grows with it",
    )
    parser.add_argument("--widths", default="4,8")
    parser.add_argument("--prompts", type=int, default=4, help="smoke-task prompts per generation run")
    parser.add_argument("--threads", type=int, help="torch threads (default: specframe's thread policy)")
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled path")
    parser.add_argument(
        "--calls-only",
        action="store_true",
        help="only the floor and the model calls (no generation): for large checkpoints",
    )
    parser.add_argument(
        "--fixed-shapes",
        action="store_true",
        help="also compile a graph fixed to each of 2, 4, 10 and 18 rows and time it against the compiled path's",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 16 tokens, 1 repeat, no compiled path")
    parser.add_argument("--json", help="also write the figures as JSON to this file ('-': do not)")
    args = parser.parse_args(argv)
    if args.context < 1:
        parser.error(f"--context must be at least 1 cached row, got {args.context}")
    if args.quick:
        args.tokens, args.repeats, args.call_repeats, args.no_compile, args.widths, args.prompts = (
            16,
            1,
            3,
            True,
            "4",
            2,
        )
    return args


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Measure everything; the result holds the figures and the rendered report (``text``)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    model = load_model(args.model, dtype=args.dtype, device=args.device, quant=args.quant)
    model.check_inputs = False
    compose({"model": model, "schedule": "ar", "threads": args.threads})  # applies the thread policy
    widths = [int(w) for w in args.widths.split(",")]
    paths = ["eager"] + ([] if args.no_compile else ["compiled"])
    nbytes = weight_bytes(model)
    log(f"{model.name}: {nbytes / 2**20:.1f} MiB of weights, {torch.get_num_threads()} thread(s), load {load:.2f}")
    floor = streaming_floor(nbytes, model.dtype, torch.device(model.device))
    streamed = streamed_bytes(model)
    floor["streamed_floor_ms"] = streaming_floor(streamed, model.dtype, torch.device(model.device))["floor_ms"]
    # as many bytes as a call reads, up to 256 MiB: far past any cache, without doubling a large model's memory
    probe = torch.zeros(min(streamed, 2**28) // 4, dtype=torch.float32, device=model.device)
    between: list[float] = []
    calls = call_costs(
        model, paths, args.call_repeats, args.quick, args.context, lambda: between.append(read_bandwidth(probe))
    )
    floor["read_gb_s_between_calls"] = max(between)
    fixed = None
    if args.fixed_shapes and not args.no_compile:
        fixed = fixed_shapes(model, args.call_repeats, context=args.context)
    compile_seconds = model.compiled.compile_seconds if model.compiled is not None else None
    gen = None
    if not args.calls_only:
        gen = generation(model, args.model, paths, args.tokens, args.repeats, widths, args.prompts)
    result = {
        "model": model.name,
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "machine": machine_description(),
        "load_average": load,
        "parameters": model.num_parameters,
        "weight_bytes": nbytes,
        "streamed_bytes": streamed,
        "context": args.context,
        "cache_bytes": cache_bytes(model, args.context),
        "floor": floor,
        "calls": calls,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "call_repeats": args.call_repeats,
        "generation": gen,
        "ratios": {} if gen is None else ratios(gen, paths, widths, "tokens_per_s"),
        "cpu_ratios": {} if gen is None else ratios(gen, paths, widths, "tokens_per_cpu_s"),
        "compile_seconds": compile_seconds,
        "graphs": None if model.compiled is None else model.compiled.compiled_graphs(),
        "prepacked": any(type(x.qkv).__name__ == "Prepacked" for x in model.inference.weights.layers),
        "kernels": model.kernel_report() if hasattr(model, "kernel_report") else None,
        "fixed_shapes": fixed,
    }
    result["text"] = render(result)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = collect(args)
    print(result["text"])
    if args.json and args.json != "-":
        Path(args.json).write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
