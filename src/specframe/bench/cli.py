r"""``specframe bench``: compare schedules on a task; ``specframe bench merge``: combine shards.

Examples::

    specframe bench --task smoke --out runs/smoke
    specframe bench --model nvidia/Nemotron-Labs-Diffusion-8B --device cuda --task humaneval \
        --schedules ar,linear,quadratic,packed --widths 31 --out runs/he
    specframe bench ... --temperature 1 --paper-repeats --shard 0/4 --out runs/he-0   # one of four shards
    specframe bench merge runs/he-0 runs/he-1 runs/he-2 runs/he-3 --out runs/he
    specframe bench --task smoke --schedules ar,packed --widths 2,auto --concurrency 1,4,16 --out runs/c
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from specframe.bench.settings import MAX_CONCURRENCY, WIDTHLESS, BenchSettings, check_concurrency, parse_shard
from specframe.bench.tasks import TASKS, get_task
from specframe.errors import ConfigError
from specframe.specs import comma_items, spec_name, split_specs

DEFAULT_SCHEDULES = "ar,linear,quadratic,packed"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` (and its ``merge`` subcommand) to the ``specframe`` command line."""
    from specframe.cli import add_decoder_options

    parser = subparsers.add_parser(
        "bench",
        help="run schedules side by side on a task; paired bootstrap report",
        description="Run several schedules on the same prompts, interleaved, and report speed, accuracy and "
        "acceptance with paired 95% bootstrap intervals against a baseline. `specframe bench merge DIR... "
        "--out DIR` combines shards.",
    )
    caps = ", ".join(f"{name} {get_task(name).max_new_tokens}" for name in TASKS)
    add_decoder_options(parser, schedule=False, length_default=(None, f"the task's own cap: {caps}"))
    parser.add_argument("--task", default="smoke", help=f"task: {', '.join(TASKS)} (default smoke)")
    parser.add_argument("--task-file", help="local JSON/JSONL/Parquet data for --task instead of its default source")
    parser.add_argument(
        "--schedules",
        default=DEFAULT_SCHEDULES,
        help=f"comma-separated (default {DEFAULT_SCHEDULES}); a schedule's options as NAME:key=value,key=value, "
        "e.g. ar,adaptive-packed:patience=2,cooldown=4,packed",
    )
    parser.add_argument(
        "--widths",
        help="comma-separated speculative widths for the speculative schedules, 'auto' for a width chosen per call "
        "(default: --width, i.e. auto); ar runs once",
    )
    parser.add_argument(
        "--concurrency",
        default="1",
        help="requests in flight per method, closed loop (a finished request's slot is refilled at once); a comma "
        "list such as 1,4,16 runs every method at each. Above 1 each method decodes all prompts as one batched run: "
        "tok/s is its total tokens / its wall time, plus per-request time to first token and inter-token latency "
        "(default 1: one request at a time)",
    )
    parser.add_argument("--repeats", type=int, help="responses per prompt and schedule, distinct seeds (default 1)")
    parser.add_argument(
        "--paper-repeats",
        action="store_true",
        help="at temperature > 0, the paper's repeats: 20 per HumanEval prompt, 7 per MBPP prompt",
    )
    parser.add_argument(
        "--prompt-template",
        help="'chat' for the model's chat template, or text around each prompt, e.g. "
        "'<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n' (default: raw prompts)",
    )
    parser.add_argument("--out", help="output folder, required (rerunning with the same folder resumes)")
    parser.add_argument("--limit", type=int, help="only the first N prompts")
    parser.add_argument(
        "--baseline",
        help="schedule (or schedule/wW) to compare against, at each method's own concurrency (default linear, else ar)",
    )
    parser.add_argument("--shard", help="i/n: only prompts with index %% n == i (merge shards afterwards)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed warm-up prompts per schedule (default 1)")
    parser.add_argument("--resamples", type=int, default=20_000, help="bootstrap resamples (default 20000)")
    parser.add_argument("--bootstrap-seed", type=int, default=0, help="seed of the bootstrap draws (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)
    sub = parser.add_subparsers(dest="bench_command", metavar="{merge}")
    merge = sub.add_parser("merge", help="combine shard output folders into one report")
    merge.add_argument("folders", nargs="+", help="shard output folders")
    merge.add_argument("--out", required=True, help="folder for the merged records and report")
    merge.set_defaults(handler=run)
    return parser


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """The benchmark settings a parsed command line asks for.

    Raises:
        ConfigError: For malformed lists, conflicting options or values out of range.
    """
    from specframe.cli import decoder_config, unescape

    config = decoder_config(args, schedule="ar")  # --temperature 0 alone means greedy
    task = get_task(args.task)
    temperature_positive = config["acceptance"] != "greedy"
    if args.paper_repeats and args.repeats is not None:
        raise ConfigError("give --repeats or --paper-repeats, not both")
    repeats = args.repeats if args.repeats is not None else 1
    if args.paper_repeats:
        repeats = task.paper_repeats if temperature_positive else 1
    widths = _width_list(args.widths) if args.widths is not None else [args.width]
    _check_widths_apply(args, _name_list(args.schedules))
    concurrency = concurrency_list(args.concurrency)
    settings = BenchSettings(
        task=task.name,
        task_file=str(Path(args.task_file).expanduser().resolve()) if args.task_file else None,
        model=args.model,
        schedules=_name_list(args.schedules),
        widths=widths,
        order=args.order,
        acceptance=config["acceptance"],
        threshold=args.threshold,
        max_new_tokens=task.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens,  # 0 is refused
        repeats=repeats,
        seed=args.seed,
        dtype=args.dtype,
        quant=args.quant,
        revision=args.revision,
        adapter=args.adapter,
        stop=list(config["stop"]),
        prompt_template=unescape(args.prompt_template, option="--prompt-template")
        if args.prompt_template
        else task.prompt_template,
        limit=args.limit,
        shard=parse_shard(args.shard) if args.shard else None,
        warmup=args.warmup,
        baseline=args.baseline,
        device=args.device,
        resamples=args.resamples,
        bootstrap_seed=args.bootstrap_seed,
        threads=args.threads,
        compile=args.compile,
        concurrency=concurrency,
    )
    settings.validate()
    return settings


def run(args: argparse.Namespace) -> int:
    """Handle ``specframe bench`` and ``specframe bench merge``."""
    require_bench_packages()
    if getattr(args, "bench_command", None) == "merge":
        from specframe.bench.merge import merge_runs

        _, report = merge_runs(args.folders, args.out)
        print(report)
        return 0
    if not args.out:
        raise ConfigError("--out is required: the folder for records.jsonl, summary.json and the plots")
    from specframe.bench.runner import run_bench

    settings = settings_from_args(args)
    command = _command_line() or equivalent_command(settings, args.out)
    _, report = run_bench(settings, args.out, progress=not args.no_progress, command=command)
    print(report)
    print(f"\nwrote {Path(args.out) / 'records.jsonl'}, summary.json and plots", file=sys.stderr)
    return 0


BENCH_PACKAGES = ("numpy", "tqdm", "matplotlib")  # the 'bench' extra's packages every run needs


def require_bench_packages() -> None:
    """Fail before the first prompt, not after the last (the plots), when the 'bench' extra is missing.

    Raises:
        ConfigError: Naming the missing packages and the install command.
    """
    import importlib.util

    missing = [name for name in BENCH_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"specframe bench needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
            "installed; install the bench extra: pip install 'specframe[bench]' (from a checkout: pip install "
            "-e '.[bench]')"
        )


def _check_widths_apply(args: argparse.Namespace, schedules: list[str]) -> None:
    """Refuse ``--width`` with ``--widths``, and a width given for schedules that take none (only ``ar``)."""
    if args.widths is not None and args.width != "auto":
        raise ConfigError(f"give --width or --widths, not both (--width {args.width} --widths {args.widths})")
    given = None
    if args.widths is not None:
        given = f"--widths {args.widths}"
    elif args.width != "auto":
        given = f"--width {args.width}"
    if given and all(spec_name(s) in WIDTHLESS for s in schedules):
        raise ConfigError(
            f"{given} would be unused: --schedules {args.schedules} takes no speculative width; drop "
            f"{given.split()[0]} or add a speculative schedule (e.g. packed)"
        )


def _name_list(text: str) -> list[str]:
    return split_specs(text, option="--schedules")


def _width_list(text: str) -> list[int | str]:
    parts = comma_items(text, option="--widths")
    try:
        return [part if part == "auto" else int(part) for part in parts]
    except ValueError:
        raise ConfigError(f"--widths must be comma-separated integers or 'auto', like auto,4,8, got {text!r}") from None


def concurrency_list(text: str) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]``.

    Raises:
        ConfigError: For an empty item, a value that is not an integer from 1 to ``MAX_CONCURRENCY``, or a value
            given twice.
    """
    parts = comma_items(text, option="--concurrency")
    values = []
    for part in parts:
        try:
            values.append(int(part))
        except ValueError:
            raise ConfigError(
                f"--concurrency must be comma-separated whole numbers from 1 to {MAX_CONCURRENCY} (requests in "
                f"flight per method), like 1,4,16; got {part!r} in {text!r}"
            ) from None
    check_concurrency(values)
    return values


def _command_line() -> str | None:
    """The command as typed, when this process is the ``specframe bench`` command (not a Python caller)."""
    argv = list(sys.argv)
    if len(argv) < 2 or argv[1] != "bench":
        return None
    return shlex.join(["specframe", *argv[1:]])


def equivalent_command(settings: BenchSettings, out: str) -> str:
    """A ``specframe bench`` command line that reproduces ``settings`` (for runs started from Python)."""
    from specframe.specs import format_spec

    options: list[tuple[str, object]] = [
        ("--model", settings.model),
        ("--task", settings.task),
        ("--task-file", settings.task_file),
        ("--schedules", ",".join(settings.schedules)),
        ("--widths", ",".join(map(str, settings.widths))),
        ("--order", settings.order),
        ("--acceptance", format_spec(settings.acceptance)),
        ("--threshold", settings.threshold),
        ("--max-new-tokens", settings.max_new_tokens),
        ("--repeats", settings.repeats),
        ("--seed", settings.seed),
        ("--device", settings.device),
        ("--dtype", settings.dtype),
        ("--quant", settings.quant),
        ("--revision", settings.revision),
        ("--prompt-template", _escape(settings.prompt_template)),
        ("--limit", settings.limit),
        ("--shard", f"{settings.shard[0]}/{settings.shard[1]}" if settings.shard else None),
        ("--warmup", settings.warmup),
        ("--baseline", settings.baseline),
        ("--threads", settings.threads),
        ("--concurrency", ",".join(map(str, settings.concurrency)) if settings.concurrency != [1] else None),
        ("--out", out),
    ]
    words = ["specframe", "bench"]
    for flag, value in options:
        if value is not None:
            words += [flag, str(value)]
    words += {True: ["--adapter"], False: ["--no-adapter"]}.get(settings.adapter, [])
    words += ["--compile"] * settings.compile
    for stop in settings.stop:
        words += ["--stop", _escape(stop)]
    return shlex.join(words)


def _escape(text: str | None) -> str | None:
    """The command-line spelling of ``text`` that :func:`specframe.cli.unescape` turns back into it."""
    if text is None:
        return None
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
