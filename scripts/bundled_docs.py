"""Regenerate docs/models/bundled.md: the bundled models' training curves, perplexity and acceptance.

Usage::

    python scripts/bundled_docs.py                       # all figures, writes docs/models/bundled.md + PNGs
    python scripts/bundled_docs.py --prompts 8 --check   # quicker; exit 1 if the acceptance targets are missed

It loads each bundled model through ``specframe.models.load_model`` (float32, CPU), measures held-out AR
perplexity through the inference forward, decodes held-out prompts greedily with Linear-SS and Packed-SS at
W = 4, 8, 16 (plus AR as a check), and plots the training curves from the records that
``scripts/train_bundled.sh`` copies to docs/models/training/<model>/. The measured figures are also written
to docs/models/bundled.json. It needs the specframe-training plugin (``pip install ./plugins/specframe-training``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch
from specframe_training.distill import DistillConfig
from specframe_training.evaluate import acceptance, heldout_perplexity, heldout_prompts, heldout_windows
from specframe_training.objectives import AnyOrderObjective, BlockDiffusionObjective
from specframe_training.trainer import BUNDLED, TrainConfig, step_seconds

from specframe.models import load_model
from specframe.models.hub import DEFAULT_MODEL, bundled_model

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "models"
NAMES = {"linear": "Linear-SS", "packed": "Packed-SS", "ar": "AR"}
TARGETS = {"linear": ("tokens_per_verification", 2.0), "packed": ("tokens_per_nfe", 1.5)}
TARGET_WIDTH = 8
# The Nemotron-style model before distillation, and variants not shipped (same protocol: 30 prompts, 128 tokens,
# W = 8), measured while closing the Packed-SS gap.
NOTES = (
    "Drafter self-distillation made the difference for the Nemotron-style model. The same checkpoint before its "
    "24 distillation steps (main steps only) reached 2.29 tokens per verification with Linear-SS and 1.42 tokens "
    "per NFE with Packed-SS at W = 8 on these prompts and gained nothing from W beyond 4; distillation cost 1.7 "
    "points of held-out perplexity (29.14 before). Two other variants tried before distillation were not "
    "shipped: a 1024-token vocabulary with more drafting blocks (1300 steps; held-out perplexity 13.0 per "
    "1024-vocabulary token) accepted less (Linear-SS "
    "2.24, Packed-SS 1.36); loop-continuation training for the drafter (`repeat_prob 0.25`: a quarter of the "
    "windows end in a loop that only the diffusion rows learn from) reached Packed-SS 1.48 but lowered Linear-SS "
    "to 2.20 and worsened held-out perplexity to 36.1. The SetDLM-style model has no distillation stage yet."
)


def plot_curves(name: str, records: list[dict[str, Any]], path: Path, base_steps: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def x(record: dict[str, Any]) -> int:  # distillation steps continue after the main steps
        return record.get("step", base_steps) + record.get("distill_step", 0)

    steps = [r for r in records if "loss" in r and "distill_step" not in r]
    distill = [r for r in records if "loss" in r and "distill_step" in r]
    evals = [r for r in records if r.get("eval")]
    skip = ("step", "distill_step", "elapsed", "lr", "loss", "grad_norm")
    terms = [k for k in steps[0] if k not in skip] if steps else []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for term in terms:
        axes[0].plot([x(r) for r in steps], [r[term] for r in steps], label=f"train {term}", linewidth=1)
        if distill:
            axes[0].plot([x(r) for r in distill], [r[term] for r in distill], label=f"distillation {term}", linewidth=1)
    if distill:
        for ax in axes:
            ax.axvline(base_steps, color="grey", linestyle=":", linewidth=1)
    if evals:
        axes[0].plot(
            [x(r) for r in evals], [r["heldout_ar_loss"] for r in evals], "o-", label="held-out AR", markersize=3
        )
        for term in [t for t in evals[0].get("heldout_terms", {}) if t != "ar"]:  # "ar" repeats held-out AR
            axes[0].plot(
                [x(r) for r in evals],
                [r["heldout_terms"][term] for r in evals],
                "s--",
                label=f"held-out {term}",
                markersize=3,
            )
    axes[0].set_xlabel("step (after the dotted line: distillation steps)" if distill else "step")
    axes[0].set_ylabel("cross-entropy (nats / token)")
    axes[0].set_ylim(0, None)
    axes[0].legend(fontsize=7)
    axes[0].set_title(f"{name}: losses")
    if evals:
        axes[1].plot([x(r) for r in evals], [math.exp(r["heldout_ar_loss"]) for r in evals], "o-")
    axes[1].set_xlabel("step (after the dotted line: distillation steps)" if distill else "step")
    axes[1].set_ylabel("held-out AR perplexity")
    axes[1].set_yscale("log")
    axes[1].set_title(f"{name}: held-out perplexity")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    folder = bundled_model(name)
    model = load_model(folder)
    windows = heldout_windows(model, args.window)
    started = time.perf_counter()
    ppl = heldout_perplexity(model, windows)
    print(
        f"{name}: held-out AR perplexity {ppl:.3f} over {windows.numel()} tokens ({time.perf_counter() - started:.0f}s)"
    )
    _, _, config = read_records(name)
    step_s = step_seconds(TrainConfig(**config), folder, threads=2) if args.timing else None
    if step_s is not None:
        print(f"  one training step: {step_s:.2f}s with 2 threads -> {config['steps'] * step_s / 60:.1f} min")
    prompts = heldout_prompts(args.prompts)
    results = []
    for schedule in ("ar", "linear", "packed"):
        for width in (1,) if schedule == "ar" else args.widths:
            started = time.perf_counter()
            stats = acceptance(model, schedule, width, prompts, args.max_new_tokens)
            row = stats.to_dict()
            results.append(row)
            print(
                f"  {schedule:7s} W={width:2d} tokens/verification {row['tokens_per_verification']:.3f} "
                f"mean acceptance length {row['mean_acceptance_length']:.3f} tokens/NFE {row['tokens_per_nfe']:.3f} "
                f"({time.perf_counter() - started:.0f}s)",
                flush=True,
            )
    files = sorted(p.name for p in folder.iterdir())
    size = sum((folder / f).stat().st_size for f in files)
    return {
        "name": name,
        "family": model.family,
        "files": files,
        "bytes": size,
        "describe": model.describe(),
        "heldout_ppl": ppl,
        "step_seconds_2_threads": step_s,
        "heldout_tokens": int(windows.numel()),
        "prompts": len(prompts),
        "prompt_sources": sorted({p.source for p in prompts}),
        "acceptance": results,
    }


def read_records(name: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    folder = DOCS / "training" / name
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    config = json.loads((folder / "train_config.json").read_text(encoding="utf-8"))
    records = [json.loads(line) for line in (folder / "log.jsonl").read_text(encoding="utf-8").splitlines() if line]
    return summary, records, config


def architecture(config: dict[str, Any], summary: dict[str, Any]) -> str:
    return (
        f"{config['num_hidden_layers']} layers, hidden {config['hidden_size']}, SwiGLU {config['intermediate_size']}, "
        f"{config['num_attention_heads']} query / {config['num_key_value_heads']} key-value heads of "
        f"{config['head_dim']}, vocabulary {config['vocab_size']}, {summary['parameters'] / 1e6:.2f}M parameters"
    )


def objective(config: dict[str, Any]) -> str:
    cls = BlockDiffusionObjective if config["family"] == "nemotron-labs-diffusion" else AnyOrderObjective
    settings = {f.name: f.default for f in dataclasses.fields(cls) if f.name != "mask_id"}
    settings.update(config.get("objective", {}))
    return ", ".join(f"{k} {v}" for k, v in settings.items())


def training_time(config: dict[str, Any], summary: dict[str, Any], measured: dict[str, Any]) -> str:
    """Steps, and minutes on 2 cores: main steps x measured step time, plus the distillation stage's wall time."""
    text = f"{config['steps']} steps of {config['batch_size']}x{config['seq_len']} tokens"
    distill_steps = config.get("distill_steps", 0)
    if distill_steps:
        settings = {f.name: f.default for f in dataclasses.fields(DistillConfig)}
        settings.update(config.get("distill", {}))
        text += (
            f" + {distill_steps} distillation steps of {settings['batch_size']} rollouts of {settings['rollout']} "
            f"after {settings['prefix']} tokens"
        )
    step_s = measured.get("step_seconds_2_threads")
    if step_s is None:
        return text
    main_min = config["steps"] * step_s / 60
    if not distill_steps:
        return f"{text}, {main_min:.0f} min on 2 cores ({step_s:.2f} s/step)"
    distill_min = summary.get("distill_seconds", 0.0) / 60
    return (
        f"{text}, {main_min + distill_min:.1f} min on 2 cores ({main_min:.1f} min at {step_s:.2f} s/step + "
        f"{distill_min:.1f} min of distillation)"
    )


def page(measured: list[dict[str, Any]]) -> str:
    settings = measured[0]["settings"]
    lines = [
        "# Bundled models",
        "",
        "<!-- Generated by scripts/bundled_docs.py; do not edit by hand. -->",
        "",
        "specframe ships two small tri-mode models (AR, masked diffusion and both at once in one network), trained "
        "by the project on a CPU so that everything runs offline with drafts that really get accepted. They are "
        "ordinary checkpoints in their family's Hub layout (`config.json` with the real field names, "
        "`model.safetensors` with the real tensor names, in bfloat16, and `tokenizer.json`) under "
        "`specframe/assets/models/`, loaded by the same loader as Hub models:",
        "",
        "```python",
        "from specframe import load_model",
        "",
        f'model = load_model("{DEFAULT_MODEL}")',
        f'setdlm = load_model("{BUNDLED["setdlm"]}")',
        "```",
        "",
        'The name works everywhere a model is named: `compose({"model": ...})`, `--model` on the command line. '
        f'Without a model (`load_model()`, `specframe generate "def fib(n):"`) specframe uses `{DEFAULT_MODEL}`.',
        "",
        "## Training",
        "",
        '- **Corpus:** the CPython standard-library source of the machine (`sysconfig.get_paths()["stdlib"]`), '
        "without `site-packages`, the test suites, the `encodings` code-page tables and generated files. Files are "
        "held out by the SHA-256 of their relative path (5%), so the split is the same everywhere.",
        "- **Tokenizers:** byte-level BPE trained with `tokenizers` on the training files, with each family's special "
        "tokens at its ids (Nemotron: `<s>` 1, `<|im_end|>` 11, `[MASK]` 100 in a reserved block; SetDLM: Qwen3's "
        "specials after the BPE entries, `<|fim_middle|>` as the mask).",
        "- **Nemotron-Labs-Diffusion objective** (`BlockDiffusionObjective`): next-token loss on causal rows plus "
        "a block-diffusion loss on a second copy of the window cut into blocks at a random phase; block rows attend "
        "bidirectionally within the block and to the clean rows before it. Most blocks keep their first token clean "
        "(the drafting seed of `[last accepted, MASK x W]`) and mask every other slot; some mask the seed too (the "
        "first call and Quadratic-SS groups); the rest are partly masked (native block decoding).",
        "- **Drafter self-distillation** (Nemotron-style model, `specframe_training.distill`): after the main "
        "steps, a short stage extends real prefixes from the training files with the model's own greedy AR "
        "rollouts (float32, the tokens the verifier would choose) and trains the same objective on them, except "
        "that rollout tokens carry no next-token loss. Greedy verification accepts a draft token when it equals the "
        "AR argmax, not the data, and at inference the context is largely the model's own output, so this teaches "
        "the drafter what to propose while the verifier keeps learning from real code only.",
        "- **SetDLM objective** (`AnyOrderObjective`): any-order autoregression with duplicate masks over staggered "
        "orders (left to right with local shuffling, some windows exactly left to right). A mask row sees the clean "
        "tokens earlier in the order (verifier queries) or only those a random number of ranks earlier (proposal "
        "queries, which see only the verified prefix).",
        "- **Reproduce:** `bash scripts/train_bundled.sh` (both models, `specframe train ...`, resumable; the "
        "command comes from the specframe-training plugin, `pip install ./plugins/specframe-training`).",
        "",
        "| model | family | architecture | objective | training | tokens seen | held-out AR perplexity |",
        "| :--- | :--- | :--- | :--- | :--- | ---: | ---: |",
    ]
    for m in measured:
        summary, _, config = read_records(m["name"])
        lines.append(
            f"| `{m['name']}` | {m['family']} | {architecture(config, summary)} | {objective(config)} | "
            f"{training_time(config, summary, m)} | "
            f"{summary['train_tokens'] / 1e6:.1f}M | {m['heldout_ppl']:.2f} |"
        )
    lines += [
        "",
        "Perplexity: next-token perplexity over all held-out tokens ("
        + ", ".join(f"{m['heldout_tokens']:,} for `{m['name']}`" for m in measured)
        + f"; windows of {settings['window']}), computed through the inference forward of the loaded model "
        "(float32 from the bfloat16 files). The two models have different tokenizers, so their perplexities are "
        "not directly comparable. Training time: the number of steps times the median time of one training step "
        "measured by this script with 2 torch threads on this machine (the runs themselves shared the 2 cores with "
        "each other and other work part of the time; their own wall times are in docs/models/training/*/summary.json).",
        "",
    ]
    for m in measured:
        lines += [f"![{m['name']} training curves](bundled-{m['name']}-training.png)", ""]
    lines += [
        "## Acceptance on held-out code",
        "",
        f"{measured[0]['prompts']} prompts cut from the held-out files (each ends with the colon of a `def` line and "
        f"holds up to 400 characters of the file before it), greedy decoding, {settings['max_new_tokens']} new tokens, "
        "float32 on "
        "the CPU. *Tokens / verification* is `Metrics.tokens_per_verification` pooled over prompts (accepted drafts "
        "plus the verifier's own token, per verification that checked a draft); *mean acceptance length* is "
        "`Metrics.mean_acceptance_length` (`1 + accepted / drafts`); *tokens / NFE* counts every forward, the "
        "prompt call included. Greedy speculative decoding is lossless: the tests check that every schedule "
        "reproduces AR token for token (in float64).",
        "",
        "| model | schedule | W | tokens / verification | mean acceptance length | tokens / NFE |",
        "| :--- | :--- | ---: | ---: | ---: | ---: |",
    ]
    for m in measured:
        for row in m["acceptance"]:
            width = "-" if row["schedule"] == "ar" else str(row["width"])
            tpv = "-" if row["schedule"] == "ar" else f"{row['tokens_per_verification']:.2f}"
            mal = "-" if row["schedule"] == "ar" else f"{row['mean_acceptance_length']:.2f}"
            lines.append(
                f"| `{m['name']}` | {NAMES[row['schedule']]} | {width} | {tpv} | {mal} | {row['tokens_per_nfe']:.2f} |"
            )
    lines += ["", "### Targets (Nemotron-style model, W = 8, held-out code, greedy)", ""]
    for schedule, (metric, bound) in TARGETS.items():
        value = target_value(measured, schedule, metric)
        status = "met" if value >= bound else "**missed**"
        label = metric.replace("_", " ").replace("nfe", "NFE")
        lines.append(f"- {NAMES[schedule]} {label} >= {bound}: {value:.2f} ({status})")
    lines += [
        "",
        "## How these figures were made",
        "",
        f"- **Command:** `{settings['command']}`",
        f"- **Machine:** {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s); "
        f"Python {platform.python_version()}, torch {torch.__version__}",
        "- **Held-out prompt files:** " + ", ".join(f"`{s}`" for s in measured[0]["prompt_sources"]),
        "",
        "Small greedy models repeat themselves, and part of the acceptance above comes from such loops, which the "
        "distilled drafter learned to continue. Packed-SS, whose drafts are one call older (they cannot see the "
        "tokens the same call accepts), accepts fewer tokens per verification than Linear-SS but needs one call per "
        "iteration instead of two, so it produces more tokens per NFE. The figures measure these checkpoints on "
        "this held-out split only; they are not a claim about the real 3B-14B models.",
        "",
        NOTES,
        "",
    ]
    return "\n".join(lines)


def target_value(measured: list[dict[str, Any]], schedule: str, metric: str) -> float:
    nemotron = next(m for m in measured if m["name"] == BUNDLED["nemotron-labs-diffusion"])
    row = next(r for r in nemotron["acceptance"] if r["schedule"] == schedule and r["width"] == TARGET_WIDTH)
    return float(row[metric])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=30, help="held-out prompts (default 30)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per generation (default 128)")
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=[4, 8, 16])
    parser.add_argument("--window", type=int, default=256, help="perplexity window (default 256)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default=",".join(BUNDLED.values()), help="bundled model names")
    parser.add_argument("--out", type=Path, default=DOCS, help="folder of bundled.md and its PNGs")
    parser.add_argument("--check", action="store_true", help="only measure; exit 1 if a target is missed")
    parser.add_argument("--no-timing", dest="timing", action="store_false", help="skip timing training steps")
    parser.add_argument(
        "--from-json", action="store_true", help="rebuild the page and plots from bundled.json without measuring"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.from_json:
        measured = json.loads((args.out / "bundled.json").read_text(encoding="utf-8"))
    else:
        command = "python " + " ".join(shlex.quote(a) for a in ["scripts/bundled_docs.py", *(argv or sys.argv[1:])])
        settings = {"command": command, "window": args.window, "max_new_tokens": args.max_new_tokens}
        measured = [{**measure(name, args), "settings": settings} for name in args.models.split(",")]
    missed = [s for s, (metric, bound) in TARGETS.items() if target_value(measured, s, metric) < bound]
    if args.check:
        return 1 if missed else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for m in measured:
        _, records, config = read_records(m["name"])
        plot_curves(m["name"], records, args.out / f"bundled-{m['name']}-training.png", config["steps"])
    (args.out / "bundled.json").write_text(json.dumps(measured, indent=2) + "\n", encoding="utf-8")
    (args.out / "bundled.md").write_text(page(measured), encoding="utf-8")
    print(f"wrote {args.out / 'bundled.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
