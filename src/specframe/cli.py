"""The ``specframe`` command line.

Subcommands:

* ``specframe plugins``: every registered implementation as JSON (kind, name, plugin, distribution);
* ``specframe generate``: decode one prompt and print the text as it is accepted or, with ``--json``, one
  object with text, ids and metrics;
* every other command (``bench``, ``convert``, ...) and every plugin's commands come from the
  ``register_commands`` hook (:mod:`specframe.commands` registers the built-in ones) and are imported only
  when they run; the core names no plugin's command.

Errors exit non-zero with a one-line message and no traceback (set ``SPECFRAME_DEBUG=1`` to see one, also for
an error raised from another, such as a plugin's failure while decoding).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from specframe.blame import registered_name
from specframe.envflags import env_flag
from specframe.errors import ConfigError, InputError, PluginError, SpecframeError, UnknownPluginError
from specframe.exactness import inexact_reason
from specframe.plugins import BUILTIN_DISTRIBUTION, PluginEntry, get_registry
from specframe.specs import comma_items, parse_spec


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specframe`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
    except SpecframeError as exc:  # the command to run is a plugin's that could not be loaded
        return _fail(str(exc))
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # name the subcommand whose options were misspelt, not the top-level command
        commands = parser.subcommands  # type: ignore[attr-defined]
        owner = commands.get(getattr(args, "command", None), parser)
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        debug = env_flag("SPECFRAME_DEBUG")
    except ConfigError as exc:
        return _fail(str(exc))
    try:
        return int(args.handler(args) or 0)
    except SpecframeError as exc:
        if exc.__cause__ is not None and debug:
            raise  # e.g. a plugin's bug: the traceback of what it raised comes with it
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("interrupted")
    except BrokenPipeError:
        return _reader_gone()
    except Exception as exc:  # keep the one-line contract, but keep bugs debuggable
        if debug:
            raise
        return _fail(f"internal error ({type(exc).__name__}: {exc}); set SPECFRAME_DEBUG=1 for a traceback")


def _reader_gone() -> int:
    """The reader of stdout went away (``specframe calibrate | head``): stop quietly, as a shell tool would.

    Stdout is pointed at the null device so that the interpreter's final flush does not fail again, and the
    status is the shell's for a process ended by SIGPIPE (128 + 13).
    """
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (tests, embedding): nothing to redirect
        pass
    return 141


class CommandLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one ``error:`` line naming the help to read (status 2).

    Options are matched whole, never by a prefix: with prefixes ``generate --prompt "text"`` was read as
    ``--prompt-ids`` and refused as a bad token list, and ``bench --schedule`` passed for ``--schedules``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        """As argparse's, remembering the arguments (to name a misspelt option in an error)."""
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """Print ``error: MESSAGE; see `PROG --help``` on standard error and exit with status 2."""
        if message.startswith("argument {") and "invalid choice:" in message:
            # a misspelt option's value taken for a subcommand (bench --limt 2): name the option instead
            known = {flag for action in self._actions for flag in action.option_strings}
            unknown = [a for a in self._given if re.match(r"--?[A-Za-z]", a) and a.split("=")[0] not in known]
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}"
        if message.startswith("unrecognized arguments:"):
            given = message.split(":", 1)[1].split()
            for action in self._positionals._group_actions:
                if f"--{action.dest}" in given:
                    message += f" ({action.dest} is given without a flag: {self.prog} ... {action.dest.upper()})"
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The argument parser: every registered command, of which only the one ``argv`` runs is imported.

    Raises:
        PluginError: The command to run is registered twice, or its plugin's ``add_parser`` fails.
        UnknownPluginError: The command to run is not registered, and an installed plugin that
            ``SPECFRAME_LOAD_PLUGINS`` excludes registers it or some plugin failed to load (the message says which).
        SystemExit: Status 2 for any other unknown command, after one ``error:`` line that lists the commands
            and says how a plugin's command is installed.
    """
    parser = CommandLineParser(
        prog="specframe",
        description="Lossless self-speculative decoding.",
        epilog="`specframe COMMAND --help` lists a command's options.",
    )
    registry = get_registry()
    commands: dict[str, PluginEntry] = {}
    for entry in registry.entries("command"):  # a name registered twice is listed once, and refused when run
        commands.setdefault(entry.name, entry)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(commands) + "}")
    parser.subcommands = sub.choices  # type: ignore[attr-defined]
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    if chosen is not None and chosen not in commands:
        try:
            registry.get("command", chosen)
        except UnknownPluginError as exc:
            if registry.unavailable_hint("command", chosen):
                raise  # an excluded or failed plugin: the message says which
            parser.error(
                f"{exc}; a plugin's command comes with its distribution: install that (the specframe repository's "
                "own plugins: pip install ./plugins/DISTRIBUTION from a checkout), then `specframe plugins` lists it"
            )
    for name, entry in commands.items():
        if name == chosen:
            add_command(sub, registry.get("command", name))  # names both plugins of a clash
        else:
            sub.add_parser(name, help=entry.extras.get("help"), add_help=False)
    return parser


def add_command(sub: Any, entry: PluginEntry) -> None:
    """Import a registered command's ``add_parser`` and call it, blaming its plugin when that fails."""
    module, _, function = entry.factory.partition(":")
    try:
        add_parser = importlib.import_module(module)
        for attribute in function.split("."):
            add_parser = getattr(add_parser, attribute)
        add_parser(sub)
        if entry.name not in sub.choices:
            raise PluginError(f"it did not call subparsers.add_parser({entry.name!r}, ...)")
    except Exception as exc:
        if entry.distribution == BUILTIN_DISTRIBUTION:
            raise
        raise PluginError(
            f"command {entry.name!r} (plugin {entry.plugin!r}, distribution {entry.distribution!r}) could not add "
            f"its parser with {entry.factory}: {type(exc).__name__}: {exc}; this is a bug in that plugin (report "
            "it to its authors, or uninstall it)"
        ) from exc


def add_plugins_parser(sub: Any) -> None:
    """Add ``specframe plugins``."""
    plugins = sub.add_parser("plugins", help="list registered plugins as JSON")
    plugins.add_argument(
        "--failures", action="store_true", help="also print plugins that failed to load (as JSON on stderr)"
    )
    plugins.set_defaults(handler=run_plugins)


def add_calibrate_parser(sub: Any) -> None:
    """Add ``specframe calibrate``: measure (or show the cached) cost of a model call on this machine."""
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
    parser.set_defaults(handler=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    """Load the model, get its cost model (calibrating if needed or asked) and print it."""
    from specframe.auto.costs import cache_path, cost_model_for
    from specframe.config import compose

    # An AR decoder loads the model as generate would (threads, compilation) without needing a cost model.
    loading = {"model": args.model, "device": args.device, "dtype": args.dtype, "revision": args.revision}
    loading["quant"] = args.quant
    model = compose({**loading, "threads": args.threads, "compile": args.compile, "schedule": "ar"}).model
    cost = cost_model_for(model, refresh=args.refresh, announce=False)  # asked for: printed next
    if args.json:
        print(json.dumps({**cost.to_dict(), "cache_file": str(cache_path(cost.key))}))
    else:
        print(cost.describe())
        path = cache_path(cost.key)
        print(f"cache file: {path}" if path.is_file() else f"cache file: {path} (not written: see the warning above)")
    return 0


def add_generate_parser(sub: Any) -> None:
    """Add ``specframe generate``."""
    gen = sub.add_parser("generate", help="decode one prompt (the text is written as tokens are accepted)")
    gen.add_argument("prompt", nargs="?", help="prompt text ('-' reads standard input)")
    add_decoder_options(gen)
    gen.add_argument("--prompt-ids", help="comma-separated prompt token ids instead of text, e.g. 1,2,3")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, ids and metrics")
    gen.add_argument(
        "--chat", action="store_true", help="send the prompt as a user message in the model's chat template"
    )
    gen.set_defaults(handler=run_generate)


def add_model_options(parser: argparse.ArgumentParser, *, adapter: bool = True) -> None:
    """Options that say how a command loads and runs ``--model`` (device, dtype, revision, threads, ...).

    Args:
        parser: The command's parser.
        adapter: Whether to add ``--adapter/--no-adapter`` (the drafter's LoRA adapter).
    """
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default cpu)")
    parser.add_argument("--dtype", help="float32, bfloat16, float16, float64 (default: float32 on CPU)")
    parser.add_argument("--revision", help="Hub revision of --model")
    parser.add_argument(
        "--quant",
        choices=("q8_0", "q4_0", "q4_1"),
        help="quantize the projections at load to a GGUF block format, run by specframe's CPU kernels "
        "(default: as the checkpoint stores them; a checkpoint converted with --quant keeps its blocks)",
    )
    if adapter:
        parser.add_argument(
            "--adapter",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="use (or not) the model's proposal-only LoRA adapter (default: the drafter the checkpoint declares)",
        )
    parser.add_argument(
        "--threads", type=int, help="CPU threads (default: OMP_NUM_THREADS, else chosen from model size and free cores)"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compiled model calls over a fixed-capacity cache (torch.compile; slow warm-up; for GPUs: on the CPU "
        "with specframe's kernels the default eager path is faster, running the layers as one call)",
    )


def add_decoder_options(
    parser: argparse.ArgumentParser, *, schedule: bool = True, length_default: tuple[int | None, str] = (256, "256")
) -> None:
    """Options shared by ``generate`` and ``bench`` that compose a decoder.

    Args:
        parser: The subcommand's parser.
        schedule: Whether to add ``--schedule`` (``bench`` has ``--schedules`` instead).
        length_default: The default of ``--max-new-tokens`` and how its help text states it.
    """
    parser.add_argument(
        "--model",
        help="Hub repo id, checkpoint folder, or a bundled model's name "
        "(default: nemotron-stdlib-tiny; also setdlm-stdlib-tiny)",
    )
    if schedule:
        parser.add_argument(
            "--schedule",
            default="packed",
            help="packed (default), ar, linear, quadratic, kbranch, auto, native, or a plugin's; options as "
            "NAME:key=value,key=value (e.g. kbranch:k=3)",
        )
    parser.add_argument(
        "--order", default="ltr", help="verification order: ltr or confidence (options: NAME:key=value,...)"
    )
    parser.add_argument(
        "--acceptance",
        help="greedy or rejection (default: greedy, or rejection when a sampling option is given); options: "
        "NAME:key=value,... e.g. rejection:temperature=0.7,top_k=20",
    )
    parser.add_argument(
        "--width",
        type=width_value,
        default="auto",
        help="speculative width W, or auto: chosen per call from this machine's measured cost (default auto; "
        "ar takes no width)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=length_default[0],
        help=f"output length limit (default {length_default[1]})",
    )
    parser.add_argument("--temperature", type=float, help="sampling temperature (rejection sampling)")
    parser.add_argument("--top-k", type=int, help="top-k truncation (rejection sampling)")
    parser.add_argument("--top-p", type=float, help="top-p truncation (rejection sampling)")
    parser.add_argument("--threshold", type=float, help="confidence threshold of the native decoders")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    add_model_options(parser)
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        help="stop string (repeatable; backslash escapes such as \\n are interpreted); ends the output at the "
        "token that completes its text",
    )


def width_value(text: str) -> int | str:
    """``--width``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


def folder_path(text: str) -> Path:
    """A folder option's value; an empty one is refused (``Path("")`` would be the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty; give a folder path")
    return Path(text)


def decoder_config(args: argparse.Namespace, *, schedule: str | None = None) -> dict[str, Any]:
    """The decoder config a parsed command line asks for.

    ``--temperature 0`` alone means greedy decoding; combined with ``--top-k``, ``--top-p`` or an
    ``--acceptance`` rule other than ``greedy`` it is refused, because it cannot mean both.

    Raises:
        ConfigError: For malformed plugin specs, bad escapes in ``--stop``, or contradictory sampling options.
    """
    sampling = {
        k: v
        for k, v in (("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p))
        if v is not None
    }
    acceptance: Any = parse_spec(args.acceptance, option="--acceptance") if args.acceptance is not None else None
    if sampling.get("temperature") == 0:
        given = [f"--{k.replace('_', '-')}" for k in sampling if k != "temperature"]
        if acceptance is not None and _name(acceptance) != "greedy" and not given:
            # (which may be a plugin's deterministic rule: it is not the sampling that conflicts, the rule is)
            raise ConfigError(
                f"--temperature 0 means greedy decoding with the built-in greedy rule, but --acceptance "
                f"{args.acceptance} names another rule; drop --temperature 0 (a rule's own options go after its "
                "name, NAME:key=value), or drop --acceptance for greedy decoding"
            )
        if acceptance is not None and _name(acceptance) != "greedy":
            given.append(f"--acceptance {args.acceptance}")
        if given:
            raise ConfigError(
                f"--temperature 0 means greedy decoding, which samples nothing, but {' and '.join(given)} "
                "asks for sampling; drop --temperature 0 for sampling or drop the sampling options for greedy"
            )
        sampling = {}
        acceptance = acceptance or "greedy"
    if acceptance is None:
        acceptance = "rejection" if sampling else "greedy"
    if sampling:
        acceptance = _merge_options(acceptance, sampling, "--acceptance")
    schedule_spec: Any = schedule or parse_spec(getattr(args, "schedule", "packed"), option="--schedule")
    if args.threshold is not None:
        schedule_spec = _merge_options(schedule_spec, {"threshold": args.threshold}, "--schedule")
    return {
        "model": args.model,
        "schedule": schedule_spec,
        "order": parse_spec(args.order, option="--order"),
        "acceptance": acceptance,
        "width": args.width,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "device": args.device,
        "dtype": args.dtype,
        "revision": args.revision,
        "quant": args.quant,
        "adapter": args.adapter,
        "stop": [unescape(s, option="--stop") for s in args.stop],
        "threads": args.threads,
        "compile": args.compile,
    }


def _name(spec: str | dict[str, Any]) -> str:
    return spec if isinstance(spec, str) else spec["name"]


def _merge_options(spec: str | dict[str, Any], extra: dict[str, Any], option: str) -> dict[str, Any]:
    """Add options given by their own flags (``--top-k``) to a spec, refusing one given both ways."""
    merged = {"name": spec} if isinstance(spec, str) else dict(spec)
    clash = sorted(set(merged) & set(extra))
    if clash:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in clash)
        raise ConfigError(f"{flags} given both as a flag and inside {option} {_name(spec)}:...; give it once")
    return {**merged, **extra}


_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def unescape(text: str, *, option: str) -> str:
    r"""Interpret backslash escapes written on a command line, leaving every other character as it is.

    Understood: ``\n``, ``\t``, ``\r``, ``\0``, ``\\``, ``\'``, ``\"``, ``\xHH``, ``\uHHHH`` and
    ``\UHHHHHHHH``. Non-ASCII text passes through unchanged (``--stop 'é'`` stops at ``é``).

    Raises:
        ConfigError: For an unknown or incomplete escape (the message says how to write a backslash).
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        code = text[i + 1 : i + 2]
        if code in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[code])
            i += 2
            continue
        digits = _HEX_ESCAPES.get(code)
        hex_text = text[i + 2 : i + 2 + digits] if digits else ""
        if digits and len(hex_text) == digits and all(c in "0123456789abcdefABCDEF" for c in hex_text):
            value = int(hex_text, 16)
            if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                raise ConfigError(f"{option} {text!r}: \\{code}{hex_text} is not a Unicode character")
            out.append(chr(value))
            i += 2 + digits
            continue
        shown = text[i : i + 2 + (digits or 0)]
        raise ConfigError(
            f"{option} {text!r}: {shown!r} is not a valid escape; use \\n, \\t, \\xHH, \\uHHHH, or \\\\ "
            "for a literal backslash"
        )
    return "".join(out)


def run_plugins(args: argparse.Namespace) -> int:
    """``specframe plugins``: print the registry as JSON."""
    registry = get_registry()
    print(json.dumps([e.describe() for e in registry.entries()], indent=2))
    problems = [str(f) for f in registry.failures]
    problems += [
        f"{g[0].kind} {g[0].name!r} is registered by both "
        + " and ".join(f"{e.plugin!r} ({e.distribution})" for e in g)
        for g in registry.duplicates()
    ]
    if args.failures:
        print(json.dumps(problems, indent=2), file=sys.stderr)
    else:
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    """``specframe generate``: decode one prompt."""
    from specframe.config import compose

    prompt, prompt_ids = _read_prompt(args)
    if args.chat and prompt is None:
        raise InputError("--chat takes the prompt as text, not --prompt-ids")
    decoder = compose(decoder_config(args))
    if args.chat:
        from specframe.models.chat import chat_prompt

        prompt = chat_prompt(decoder.model.tokenizer, prompt)
    inexact = inexact_reason(decoder.rule, decoder.schedule, registered_name)
    # Width "auto" gets its cost model at first use, calibrating it if this machine has none: here, so that the
    # seconds of a calibration are not the request's (its wall and non-model time in the summary line).
    getattr(decoder.schedule, "cost", None)
    if args.json:
        report = getattr(decoder.model, "kernel_report", None)
        kernels = {"kernels": report()} if report is not None else {}
        print(json.dumps(decoder.generate(prompt, prompt_ids=prompt_ids).to_dict() | kernels))
        if inexact:
            print(f"note: {inexact}", file=sys.stderr)
        return 0
    if decoder.model.tokenizer is None:  # no text to write: the ids, rather than an empty line
        result = decoder.generate(prompt, prompt_ids=prompt_ids)
        print(",".join(map(str, result.output_ids)))
        note = f"note: model {decoder.model.name!r} has no tokenizer, so these are the output token ids"
        print(note, file=sys.stderr)
        print(summary_line(decoder.schedule.name, result.metrics, inexact), file=sys.stderr)
        return 0
    written = False
    try:
        for piece in decoder.stream(prompt, prompt_ids=prompt_ids):  # text appears as tokens are accepted
            sys.stdout.write(piece.text)
            sys.stdout.flush()
            written = written or bool(piece.text)
            result = piece.generation
    except BaseException:  # a failure (or Ctrl-C) mid-output: end the line, so that the error starts its own
        if written:
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise
    sys.stdout.write("\n")
    print(summary_line(decoder.schedule.name, result.metrics, inexact), file=sys.stderr)
    return 0


def summary_line(schedule: str, m: Any, inexact: str | None = None) -> str:
    """``generate``'s one-line summary of a request's :class:`~specframe.metrics.Metrics`.

    When the calls were planned by more than the schedule itself (``width: "auto"``, ``schedule: "auto"``),
    the line ends with what planned them, most frequent first: ``calls: 240 ar, 13 packed/w2``. A decoder
    that is not exact gets ``inexact`` (see :func:`specframe.exactness.inexact_reason`) after it.
    """
    share = m.non_model_s / max(m.wall_s, 1e-9)
    line = (
        f"[{schedule}] {m.generated_tokens} tokens, {m.nfe} NFE, {m.tokens_per_nfe:.2f} tokens/NFE, "
        f"{m.wall_s:.3f} s ({share:.0%} non-model)"
    )
    chosen = m.schedule_histogram()
    if set(chosen) - {schedule}:
        line += "; calls: " + ", ".join(f"{count} {label}" for label, count in chosen.items())
    if inexact:
        line += f"; {inexact}"
    return line


_INTEGER = re.compile(r"[+-]?[0-9]+")  # a --prompt-ids entry: ASCII digits, as [0-9] says


def _read_prompt(args: argparse.Namespace) -> tuple[str | None, list[int] | None]:
    if args.prompt is not None and args.prompt_ids is not None:
        raise InputError("give either a PROMPT or --prompt-ids, not both")
    if args.prompt_ids is not None:
        if not args.prompt_ids.strip():
            return None, []  # the decoder says that the prompt is empty
        parts = comma_items(args.prompt_ids, option="--prompt-ids")
        # ASCII digits only: int() also reads other scripts' digits ('١' is 1) and underscores ('1_0' is 10)
        if not all(_INTEGER.fullmatch(part) for part in parts):
            raise InputError(f"--prompt-ids must be comma-separated integers like 1,2,3, got {args.prompt_ids!r}")
        return None, [int(part) for part in parts]
    if args.prompt is None:
        raise InputError("no prompt: give PROMPT text, '-' to read standard input, or --prompt-ids")
    if args.prompt == "-":
        stdin = sys.stdin
        data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode("utf-8", "surrogateescape")
        try:
            return data.decode("utf-8-sig"), None
        except UnicodeDecodeError as exc:
            raise InputError(
                f"standard input is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); convert "
                "the prompt to UTF-8 (e.g. iconv -f latin1 -t utf-8) or pass token ids with --prompt-ids"
            ) from None
    from specframe.models.tokenizer import unicode_problem

    problem = unicode_problem(args.prompt)
    if problem:
        raise InputError(f"PROMPT: {problem}; give UTF-8 text or --prompt-ids")
    return args.prompt, None


def _fail(message: str) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
