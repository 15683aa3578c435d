r"""``specframe train-drafter``: train the drafter of a converted model (see :mod:`specframe_training.drafter`).

Examples::

    specframe convert SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2 --dtype float32
    specframe train-drafter models/smollm2 --work-dir runs/drafter --attach
    # the attached drafter continued, with a rank-32 LoRA on each MLP down_proj as well:
    specframe train-drafter models/smollm2 --work-dir runs/drafter-mlp --set mlp_rank=32 \
        --set init_from=models/smollm2/linear_spec_lora

A run resumes from its work folder: after an interruption (Ctrl-C), run the same command again.
``--attach`` copies the trained adapter into the model folder and declares it as the model's drafter, so that
every decoder composed on that folder uses it.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from dataclasses import fields
from typing import Any

import torch

from specframe.cli import folder_path
from specframe.errors import ConfigError, SpecframeError
from specframe.models.loading import attach_drafter
from specframe_training.cli import _setting


def add_parser(subparsers: Any) -> None:
    """Add ``specframe train-drafter`` to the CLI's subparsers."""
    from specframe_training.drafter import DrafterConfig

    parser = subparsers.add_parser(
        "train-drafter",
        help="train the drafter (proposal LoRA) of a converted model on its own greedy text (CPU or GPU)",
        description="Train the proposal-only LoRA of a model written by `specframe convert`, the base frozen, "
        "on the base model's own greedy continuations of prompts the project ships.",
        epilog=settings_help(DrafterConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", type=folder_path, help="the converted model folder")
    parser.add_argument("--work-dir", required=True, type=folder_path, help="run folder (resumed when it exists)")
    parser.add_argument("--steps", type=int, help="optimizer steps (default 600)")
    parser.add_argument("--threads", type=int, help="torch threads (default 2, or 1 on a one-core machine)")
    parser.add_argument(
        "--device",
        help="where the model trains: cpu, cuda, cuda:N (default: cuda when a GPU is present, else cpu)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="change a setting, e.g. rank=32 (a JSON value; the settings are listed below)",
    )
    parser.add_argument(
        "--attach", action="store_true", help="copy the adapter into the model folder and declare it its drafter"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``specframe train-drafter``."""
    from specframe.bench.records import prepare_folder
    from specframe.models.threads import check_threads, machine_cores
    from specframe_training.drafter import ADAPTER_FOLDER, DrafterConfig, train_drafter

    overrides = dict(_setting(item) for item in args.set)
    known = [f.name for f in fields(DrafterConfig)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ConfigError(f"--set: unknown drafter setting(s) {', '.join(unknown)}; settings: {', '.join(known)}")
    if args.steps is not None:
        overrides["steps"] = args.steps
    try:
        config = DrafterConfig(**overrides)
    except TypeError as exc:
        raise ConfigError(f"specframe train-drafter: {exc}") from exc
    if not (args.model / "config.json").is_file():
        raise ConfigError(f"{args.model}: not a model folder (no config.json); convert a model first")
    threads = min(2, machine_cores()) if args.threads is None else check_threads(args.threads, "--threads")
    device = training_device(args.device)
    prepare_folder(args.work_dir, option="--work-dir")
    try:
        summary = train_drafter(
            args.model, args.work_dir, config, threads=threads, device=device, log=lambda x: print(x, flush=True)
        )
    except KeyboardInterrupt:
        raise SpecframeError(
            f"interrupted; {args.work_dir} keeps the run (its self-distilled data once generated, its state every "
            f"{config.save_every} steps): run the same command again to resume it from its last saved step"
        ) from None
    if args.attach:
        attach_drafter(args.work_dir / ADAPTER_FOLDER, args.model)
        print(f"attached the drafter to {args.model}", flush=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))
    return 0


def training_device(name: str | None) -> torch.device:
    """The device ``--device`` names (a GPU when present if it names none).

    Raises:
        ConfigError: If the name is not a device, or names a GPU this machine does not have.
    """
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N") from exc
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name!r}: drafter training runs on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name!r}: this machine has no CUDA GPU that torch can use; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"--device {name!r}: this machine has {torch.cuda.device_count()} GPU(s)")
    return device


def settings_help(config: type) -> str:
    """The ``--help`` epilog: every setting ``--set`` takes, with its default (``null``: derived, see the docs)."""
    head = (
        "settings (--set FIELD=VALUE, a JSON value; the docs page 'Bring your own model' explains each; alpha null "
        "means 2 * rank; mlp_rank > 0 adds a LoRA on each MLP down_proj, mlp_alpha null meaning 2 * mlp_rank; a "
        "resumed run takes only steps, eval_every, save_every and patience anew):"
    )
    defaults = ", ".join(f"{f.name}={json.dumps(f.default)}" for f in fields(config))
    return textwrap.fill(head, 79) + "\n" + textwrap.fill(defaults, 79, initial_indent="  ", subsequent_indent="  ")
