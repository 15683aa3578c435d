"""``specframe train``: train a small model of either family on the standard library, on a CPU.

Examples::

    specframe train nemotron --work-dir runs/nemotron --threads 2
    specframe train setdlm --work-dir runs/setdlm --ship src/specframe/assets/models/setdlm-stdlib-tiny

A run resumes from its work folder's last saved state when restarted with the same settings. Without
``--ship`` the checkpoint stays in ``WORK_DIR/hub``, loadable with ``specframe generate --model WORK_DIR/hub``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import Any

from specframe.cli import folder_path
from specframe.errors import ConfigError


def add_parser(subparsers: Any) -> None:
    """Add ``specframe train`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "train",
        help="train a small tri-mode model on the standard-library source (CPU)",
        description="Train a small Nemotron-Labs-Diffusion-style or SetDLM-style model on the CPython "
        "standard-library source, with its own BPE tokenizer, and write it in the family's Hub layout.",
    )
    parser.add_argument("family", help="nemotron-labs-diffusion (or nemotron), or setdlm")
    parser.add_argument("--work-dir", required=True, type=folder_path, help="run folder (resumed when it exists)")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the shipped model's)")
    parser.add_argument("--threads", type=int, help="torch threads (default 2, or 1 on a one-core machine)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="change a training setting (JSON values), e.g. hidden_size=128; the objective's options depend on "
        'the family, e.g. objective={"max_block": 9} for nemotron, objective={"span": 8} for setdlm',
    )
    parser.add_argument("--ship", type=folder_path, help="copy the finished checkpoint to this model folder")
    parser.add_argument("--records", type=folder_path, help="copy the run's summary and log to this folder (docs)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``specframe train``."""
    from specframe.bench.records import prepare_folder
    from specframe_training.trainer import TrainConfig, preset, ship, train

    overrides = dict(_setting(item) for item in args.set)
    known = [f.name for f in fields(TrainConfig) if f.name != "family"]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ConfigError(f"--set: unknown training setting(s) {', '.join(unknown)}; settings: {', '.join(known)}")
    if args.steps is not None:
        overrides["steps"] = args.steps
    try:
        config = preset(args.family, **overrides)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"specframe train: {exc}") from exc
    from specframe.models.threads import check_threads, machine_cores

    threads = min(2, machine_cores()) if args.threads is None else check_threads(args.threads, "--threads")
    own = {"--ship": args.work_dir / "hub", "--records": args.work_dir}  # where the run writes those files itself
    for option, folder in (("--ship", args.ship), ("--records", args.records)):  # not only after the training
        if folder is not None:
            if folder.expanduser().resolve() == own[option].expanduser().resolve():
                raise ConfigError(
                    f"{option} {folder} is where the run writes those files itself ({own[option]}); drop {option} "
                    "or give another folder"
                )
            prepare_folder(folder, option=option)
    prepare_folder(args.work_dir, option="--work-dir")
    summary = train(config, args.work_dir, threads=threads, log=lambda line: print(line, flush=True))
    if args.ship is not None:
        ship(args.work_dir, args.ship, args.records)
        print(f"shipped to {args.ship}", flush=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))
    return 0


def _setting(item: str) -> tuple[str, Any]:
    name, sep, text = item.partition("=")
    if not sep or not name:
        raise ConfigError(f"--set expects FIELD=VALUE, got {item!r}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text
    return name.strip(), value
