"""``specframe ablation-order``: the order in which ``lowest-confidence`` would verify some draft positions.

A plugin's command, registered through the ``register_commands`` hook; specframe imports this module only
when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from specframe.errors import InputError
from specframe_ablation_orders import LowestConfidenceFirst


def add_parser(subparsers: Any) -> None:
    """Add ``specframe ablation-order`` to specframe's command line."""
    parser = subparsers.add_parser(
        "ablation-order",
        help="show the order in which lowest-confidence verifies draft positions",
        description="Print the positions in lowest-confidence's verification order: the least confident "
        "scored positions first, then the unscored ones left to right.",
    )
    parser.add_argument("positions", type=int, nargs="+", help="draft positions, e.g. 5 6 7")
    parser.add_argument(
        "--score", action="append", default=[], metavar="POSITION=SCORE", help="a position's confidence (repeatable)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the verification order, one line of space-separated positions."""
    scores = {}
    for item in args.score:
        position, _, score = item.partition("=")
        try:
            scores[int(position)] = float(score)
        except ValueError:
            raise InputError(f"--score takes POSITION=SCORE, e.g. 5=0.9, got {item!r}") from None
    print(" ".join(map(str, LowestConfidenceFirst().order(sorted(args.positions), scores))))
    return 0
