"""``specframe calibrate``: measure (or show the cached) cost of a model call on this machine."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> None:
    """Add ``specframe calibrate``."""
    from specframe.cli import add_model_options

    parser = sub.add_parser(
        "calibrate",
        help="measure what a model call costs here (cached; widths and schedules 'auto' choose by it)",
        description="Time forwards of a few row counts, fit seconds = tau + delta x rows, and cache the result "
        "per model, device, dtype, threads and compilation. Without --refresh a cached cost model is shown.",
    )
    parser.add_argument("--model", help="Hub repo id, checkpoint folder or bundled model name (default: bundled)")
    add_model_options(parser, adapter=False)
    parser.add_argument("--refresh", action="store_true", help="calibrate again even if a cached cost model exists")
    parser.add_argument("--json", action="store_true", help="print the cost model as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the model, get its cost model (calibrating if needed or asked) and print it."""
    from specframe.auto.costs import cache_path, cost_model_for
    from specframe.config import compose

    # An AR decoder loads the model as generate would (threads, compilation) without needing a cost model.
    loading = {"model": args.model, "device": args.device, "dtype": args.dtype, "revision": args.revision}
    model = compose({**loading, "threads": args.threads, "compile": args.compile, "schedule": "ar"}).model
    cost = cost_model_for(model, refresh=args.refresh, announce=False)  # asked for: printed next
    if args.json:
        print(json.dumps({**cost.to_dict(), "cache_file": str(cache_path(cost.key))}))
    else:
        print(cost.describe())
        path = cache_path(cost.key)
        print(f"cache file: {path}" if path.is_file() else f"cache file: {path} (not written: see the warning above)")
    return 0
