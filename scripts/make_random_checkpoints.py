"""Write small random checkpoints of the model families in the exact Hub layout.

Examples::

    python scripts/make_random_checkpoints.py out/            # both families, out/nemotron-labs-diffusion, out/setdlm
    python scripts/make_random_checkpoints.py out/ --family setdlm --shards 2 --format bin
    python scripts/make_random_checkpoints.py out/ --lora-rank 8 --set hidden_size=128 --set num_hidden_layers=4

The same checkpoints come from :func:`specframe.testing.models.write_random_checkpoint`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint


def _override(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _count(option: str, minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{option} must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="folder to write one subfolder per family into")
    parser.add_argument("--family", choices=[NEMOTRON, SETDLM], action="append", help="default: both")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--shards", type=_count("--shards", 1), default=1, help="number of weight files (>1 writes an index)"
    )
    parser.add_argument("--format", choices=["safetensors", "bin"], default="safetensors")
    parser.add_argument(
        "--lora-rank", type=_count("--lora-rank", 0), default=0, help="Nemotron: also write linear_spec_lora/"
    )
    parser.add_argument(
        "--backbone-config",
        choices=["inline", "file", "none"],
        default="inline",
        help="SetDLM: where the Qwen3 sizes go",
    )
    parser.add_argument("--no-tokenizer", action="store_true")
    parser.add_argument(
        "--set",
        type=_override,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config.json field (JSON value; null deletes it)",
    )
    args = parser.parse_args(argv)
    for family in args.family or [NEMOTRON, SETDLM]:
        try:
            folder = write_random_checkpoint(
                family,
                args.output / family,
                seed=args.seed,
                shards=args.shards,
                weights_format=args.format,
                lora_rank=args.lora_rank if family == NEMOTRON else 0,
                tokenizer=not args.no_tokenizer,
                backbone_config=args.backbone_config,
                **dict(args.set),
            )
        except (TypeError, ValueError, OverflowError) as exc:  # a size the tokenizer or the weights cannot take
            settings = " ".join(f"--set {key}={value!r}" for key, value in args.set)
            parser.error(
                f"cannot write a {family} checkpoint with {settings or 'these settings'} ({exc}); sizes must be "
                "integers for the weights and the tokenizer (add --no-tokenizer to write a broken config.json "
                "on purpose, for the loader to refuse)"
            )
        print(folder)


if __name__ == "__main__":
    main()
