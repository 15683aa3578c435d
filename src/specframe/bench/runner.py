"""Run several schedules side by side on one task (paper, section 4 and appendix E).

The model is loaded once and one decoder is composed per method (schedule, width and concurrency). After
untimed warm-up generations, the methods run on the same prompts *interleaved*, so slow drifts of the machine
(clocks, temperature, other load) fall on all methods alike:

* at concurrency 1, for each prompt and repeat every method runs in turn, and the turn order rotates from one
  (prompt, repeat) to the next. Each response is graded (outside the timed decoder loop) and appended to
  ``records.jsonl`` at once, so an interrupted run resumes where it stopped;
* at a concurrency N > 1, for each repeat every method runs in turn (the order rotating from one repeat to
  the next), each as one *closed-loop run* over all the prompts (:mod:`specframe.bench.closed_loop`): N
  requests in flight, a finished one's slot refilled at once by the next prompt. Its responses are graded and
  written when the whole run has finished, so an interrupted closed-loop run is run again whole on resume
  (a run over part of the prompts would have a different tail, and its throughput would mean something else).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specframe.bench.closed_loop import LoopResult, RequestTiming, run_closed_loop
from specframe.bench.output import machine_description, write_report
from specframe.bench.records import (
    RECORDS_FILE,
    RUN_FILE,
    RecordWriter,
    check_same_run,
    lock_folder,
    prepare_folder,
    read_records,
    read_run,
    record_key,
    response_key,
    write_json,
)
from specframe.bench.settings import CHAT, MAX_REPEATS, BenchSettings, Method
from specframe.bench.tasks import Example, Task, digest, get_task
from specframe.decoder import Decoder, Generation, fits_context, seed_problem
from specframe.errors import ConfigError, InputError, SpecframeError
from specframe.exactness import declared_exact
from specframe.models.base import ModelBackend
from specframe.models.hub import model_display_name
from specframe.models.tokenizer import unicode_problem
from specframe.specs import format_spec, parse_spec, spec_name


def select_examples(examples: list[Example], settings: BenchSettings) -> list[Example]:
    """The prompts this process runs: the first ``limit``, then those of its shard (``index % n == i``)."""
    chosen = examples[: settings.limit] if settings.limit is not None else list(examples)
    if settings.shard is not None:
        index, count = settings.shard
        chosen = [ex for ex in chosen if ex.index % count == index]
    return chosen


def turn_order(methods: list[Method], step: int) -> list[Method]:
    """``methods`` rotated by ``step``: each method goes first once every ``len(methods)`` steps."""
    shift = step % len(methods)
    return methods[shift:] + methods[:shift]


@dataclass(frozen=True)
class Work:
    """One unit of a run: a method decoding some prompts' responses of one repeat.

    At concurrency 1 a unit is one response; above, one closed-loop run over every prompt still missing.
    """

    method: Method
    repeat: int
    examples: tuple[Example, ...]


def pending_work(examples: list[Example], settings: BenchSettings, done: set) -> list[Work]:
    """The responses still to run, in run order, grouped into :class:`Work` units.

    For each concurrency level in ``settings.concurrency`` order: at 1, for each prompt and repeat, each method
    (the turn order rotating with prompt and repeat, as bench always did); above 1, for each repeat, each
    method (rotating with repeat) as one closed-loop run over the prompts whose response is not in ``done``.
    """
    work = []
    repeats = settings.repeats
    for position, level in enumerate(settings.concurrency):
        methods = [m for m in settings.methods() if m.concurrency == level]
        if level == 1:
            work += [
                Work(method, repeat, (example,))
                for example in examples
                for repeat in range(repeats)
                for method in turn_order(methods, example.index * repeats + repeat)
                if response_key(example.index, repeat, method) not in done
            ]
            continue
        for repeat in range(repeats):
            for method in turn_order(methods, position * repeats + repeat):
                missing = tuple(ex for ex in examples if response_key(ex.index, repeat, method) not in done)
                if missing:
                    work.append(Work(method, repeat, missing))
    return work


def load_task(settings: BenchSettings) -> tuple[Task, list[Example]]:
    """The task and its full prompt list; fills in ``settings.task_digest``."""
    task = get_task(settings.task)
    examples = task.load(settings.task_file)
    settings.task_digest = digest(examples)
    return task, examples


def compose_decoders(
    model: ModelBackend, settings: BenchSettings, *, log: Callable[[str], None] | None = None
) -> dict[Method, Decoder]:
    """One decoder per method (each concurrency its own, so what one learns never leaks into another's run).

    ``ar`` is the exact reference: where ``--acceptance`` is not declared exact (a lossy rule), ``ar`` decodes
    with the exact rule of the same kind instead (:func:`exact_counterpart`), so that the lossy rule's methods
    are compared with the AR model's own output; ``log`` (if given) gets a one-line note saying so.
    """
    from specframe.config import compose

    decoders = {}
    for method in settings.methods():
        schedule: Any = parse_spec(method.schedule, option="--schedules")
        if method.name == "native" and settings.threshold is not None:
            schedule = {"name": "native", "threshold": settings.threshold, **method.options}
        config = {
            "model": model,
            "schedule": schedule,
            "order": parse_spec(settings.order, option="--order"),
            "acceptance": settings.acceptance,
            "width": method.width if method.width is not None else "auto",  # ar: no width
            "max_new_tokens": settings.max_new_tokens,
            "seed": settings.seed,
            "adapter": settings.adapter,
            "stop": list(settings.stop),
            "threads": settings.threads,
            "compile": settings.compile,
        }
        decoder = compose(config)
        if method.name == "ar" and declared_exact(decoder.rule) is not True:
            exact = exact_counterpart(decoder.rule)
            decoder = compose({**config, "acceptance": exact})
            if log is not None and method.concurrency == settings.concurrency[0]:
                log(
                    f"note: --acceptance {spec_name(settings.acceptance)} is not declared exact, so ar decodes with "
                    f"the exact rule {format_spec(exact)}: the baseline the others are compared with is the AR output"
                )
        decoders[method] = decoder
    return decoders


def exact_counterpart(rule: Any) -> str | dict[str, Any]:
    """The exact built-in rule that decodes ``ar`` for a rule not declared exact.

    Greedy for a rule that does not sample, else rejection sampling at the rule's own temperature (its
    ``describe()``'s, else 1).
    """
    if not rule.stochastic:
        return "greedy"
    temperature = rule.describe().get("temperature", 1.0)
    valid = isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > 0
    return {"name": "rejection", "temperature": float(temperature) if valid else 1.0}


def answer_text(model: ModelBackend, output_ids: list[int]) -> str:
    """The response text to grade: the output without its trailing end-of-sequence tokens."""
    ids = list(output_ids)
    while ids and ids[-1] in model.eos_token_ids:
        ids.pop()
    return model.decode(ids)


def make_record(
    settings: BenchSettings,
    example: Example,
    repeat: int,
    method: Method,
    seed: int,
    result: Generation,
    correct: bool | None,
    schedule_description: Mapping[str, Any] | None = None,
    *,
    stochastic: bool | None = None,
    timing: RequestTiming | None = None,
    loop: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``records.jsonl`` entry of one response.

    ``schedule_description`` is the method's ``schedule.describe()`` (its name and options, as the schedule
    reports them), taken when the decoder was composed. ``stochastic`` is the acceptance rule's flag:
    responses of rules that sample nothing are compared with the baseline's token for token (see
    :func:`specframe.bench.summary.summarize`). ``timing`` is what the consumer saw of the response
    (:class:`~specframe.bench.closed_loop.RequestTiming`: ``ttft_s``, ``itl_s``, ``latency_s``); ``loop``
    describes the closed-loop run it was part of at concurrency > 1 (``id``, ``wall_s``, ``requests``,
    ``output_tokens``), ``None`` at concurrency 1.
    """
    verifications = result.metrics.verifications
    longest = max((v.drafted for v in verifications), default=0)
    reached = [sum(1 for v in verifications if v.drafted > rank) for rank in range(longest)]
    accepted = [sum(1 for v in verifications if v.accepted > rank) for rank in range(longest)]
    return {
        "task": settings.task,
        "prompt_index": example.index,
        "example_id": example.id,
        "repeat": repeat,
        "schedule": method.schedule,
        "schedule_name": method.name,
        "schedule_options": method.options,
        "schedule_description": dict(schedule_description or {"name": method.name}),
        "width": method.width,
        "method": method.label,
        "order": settings.order,
        "temperature": 0.0 if stochastic is False else settings.temperature,  # a rule that does not sample has none
        "seed": seed,
        "prompt_tokens": len(result.prompt_ids),
        "output_ids": result.output_ids,
        "text": result.text,
        "stop_reason": result.stop_reason,
        "exact": result.exact,
        "stochastic": stochastic,
        "metrics": result.metrics.to_dict(),
        "acceptance_positions": {"reached": reached, "accepted": accepted},
        "correct": correct,
        "concurrency": method.concurrency,
        "ttft_s": None if timing is None else _seconds(timing.ttft_s),
        "itl_s": [] if timing is None else [_seconds(v) for v in timing.itl_s],
        "latency_s": None if timing is None else _seconds(timing.latency_s),
        "loop": None if loop is None else dict(loop),
    }


def _seconds(value: float | None) -> float | None:
    """Seconds to the microsecond (the clock's noise is far above it; records stay short)."""
    return None if value is None else round(value, 6)


def run_bench(
    settings: BenchSettings,
    out: str | Path,
    *,
    model: ModelBackend | None = None,
    progress: bool = True,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
    plots: bool = True,
) -> tuple[dict[str, Any], str]:
    """Run (or resume) a benchmark and write its report.

    Args:
        settings: What to run.
        out: Output folder (created; an existing one with the same settings is resumed).
        model: An already loaded model to use instead of loading ``settings.model``.
        progress: Show a progress bar on standard error.
        command: The command line, recorded in ``run.json``.
        log: Where to print notes (default: standard error).
        plots: Also draw the PNG figures.

    Returns:
        The summary and the formatted report.

    Raises:
        SpecframeError: Bad settings, unavailable data, or an output folder holding a different run.
    """
    log = log or (lambda text: print(text, file=sys.stderr))
    settings.validate()
    task, examples = load_task(settings)
    chosen = select_examples(examples, settings)
    if not chosen:
        raise SpecframeError(f"no prompts to run: --limit/--shard select none of the {len(examples)} prompts")
    last_seed = settings.seed_for(max(ex.index for ex in chosen), settings.repeats - 1)
    if seed_problem(last_seed):
        raise ConfigError(
            f"--seed {settings.seed} is too large: response seeds are seed + {MAX_REPEATS} * prompt index + repeat, "
            f"up to {last_seed} here, beyond the largest seed 2**64 - 1; use a smaller --seed"
        )
    check_prompt_texts(settings, chosen)  # before the folder is made: a bad prompt leaves nothing behind
    folder = prepare_folder(out)
    with lock_folder(folder):  # a second bench on the same folder would record every response again
        stored = read_run(folder)
        if stored is not None:
            check_same_run(stored.get("settings", {}), settings, str(folder))
        records = read_records(folder / RECORDS_FILE, repair=True)
        done = {record_key(r) for r in records}
        todo = pending_work(chosen, settings, done)
        run = dict(stored or {})
        if todo:
            if done:
                pending = sum(len(w.examples) for w in todo)
                log(f"resuming {folder}: {len(done)} responses stored, {pending} to go")
            model = model if model is not None else _load_model(settings)
            decoders = compose_decoders(model, settings, log=log)  # bad settings fail here, before run.json
            # Before any request (warm-up included): a schedule that learns (auto) would describe what it has seen.
            described = {method: decoder.schedule.describe() for method, decoder in decoders.items()}
            check_prompt_lengths(model, settings, list({ex.index: ex for w in todo for ex in w.examples}.values()))
            run = {
                "settings": settings.to_dict(),
                "model": model.describe(),
                "task": {"name": task.name, "description": task.description, "prompts": len(examples)},
                "environment": machine_description(),
                "command": command,
            }
            costs = {
                m.label: d.schedule.cost.to_dict() for m, d in decoders.items() if getattr(d.schedule, "cost", None)
            }
            if costs:  # the cost model widths and schedules "auto" choose by (one per model: the same for each)
                run["cost_model"] = next(iter(costs.values()))
            write_json(folder / RUN_FILE, run)
            _warm_up(decoders, chosen, settings)
            with RecordWriter(folder / RECORDS_FILE) as writer:
                for record in _generate(todo, decoders, described, task, settings, model, progress):
                    writer.write(record)
                    records.append(record)
        else:
            log(f"{folder}: all {len(done)} responses already stored; nothing to run")
        return write_report(folder, settings, records, run, plots=plots)


def check_prompt_texts(settings: BenchSettings, examples: list[Example]) -> None:
    r"""Refuse a run in which some prompt cannot be decoded at all, before any prompt runs.

    An empty prompt (one the template leaves empty too) or one holding a lone surrogate (a JSON ``"\ud800"``
    escape) would otherwise fail when its turn comes, after the records of the prompts before it, and again on
    every resume.

    Raises:
        InputError: Naming the task file (or task), the prompts (index and id) and what is wrong with each.
    """
    problems = []
    for ex in examples:
        problem = unicode_problem(ex.prompt)
        if problem is None and settings.prompt_template != CHAT and not settings.prompt_text(ex.prompt):
            problem = "the prompt is empty"
        if problem is not None:
            problems.append(f"prompt {ex.index} ({ex.id}): {problem}")
    if not problems:
        return
    source = f"task file {settings.task_file}" if settings.task_file else f"task {settings.task!r}"
    more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
    raise InputError(
        f"{len(problems)} of {len(examples)} prompt(s) of {source} cannot be decoded: {'; '.join(problems[:5])}"
        f"{more}; nothing was run. Fix or remove those prompts (or leave them out with --limit or --shard)"
    )


def check_prompt_lengths(model: ModelBackend, settings: BenchSettings, examples: list[Example]) -> None:
    """Refuse a run in which some prompt plus ``--max-new-tokens`` does not fit the model, before any prompt runs.

    Raises:
        InputError: If the model has no tokenizer (a task's prompts are text), or naming the prompts that do not
            fit (index, id and length), the model's context, and what to change.
    """
    if model.tokenizer is None:
        raise InputError(
            f"model {model_display_name(model.name)!r} has no tokenizer.json, and a bench task's prompts are text; "
            "nothing was run. Put the family's tokenizer.json into the checkpoint folder, or bench a model that "
            "has one"
        )
    limit = settings.max_new_tokens
    lengths = {ex.index: len(model.encode_prompt(settings.prompt_text(ex.prompt, model.tokenizer))) for ex in examples}
    long = [ex for ex in examples if not fits_context(lengths[ex.index], limit, model)]
    if not long:
        return
    context = model.max_positions + 1
    shown = ", ".join(f"prompt {ex.index} ({ex.id}) has {lengths[ex.index]} tokens" for ex in long[:5])
    more = f" and {len(long) - 5} more" if len(long) > 5 else ""
    longest = max(lengths[ex.index] for ex in long)
    cap = model.max_positions - longest + 1  # the largest limit fits_context accepts
    leave = "leave those prompts out (--limit, or a --task-file without them)"
    fix = f"Lower --max-new-tokens to {cap} or less, or {leave}" if cap >= 1 else leave.capitalize()
    raise InputError(
        f"{len(long)} of {len(examples)} prompt(s) do not fit the context of model "
        f"{model_display_name(model.name)!r} ({context} positions) with --max-new-tokens {limit}: {shown}{more}; "
        f"nothing was run. {fix}"
    )


def _load_model(settings: BenchSettings) -> ModelBackend:
    from specframe.models.loading import load_configured

    return load_configured(settings)


def _warm_up(decoders: Mapping[Method, Decoder], chosen: list[Example], settings: BenchSettings) -> None:
    """Untimed generations on the first prompts (compilation, allocator and cache warm-up).

    At concurrency 1, each of the first ``warmup`` prompts once per method; at N > 1, one closed-loop run per
    method of N requests cycling over those prompts, all in flight at once (the batched call sizes warm up).
    """
    warm = chosen[: settings.warmup] if settings.warmup else []
    if not warm:
        return
    for method, decoder in decoders.items():
        if method.concurrency == 1:
            for example in warm:
                _generate_one(decoder, example, method, settings, settings.seed)
            continue
        examples = [warm[i % len(warm)] for i in range(method.concurrency)]
        _run_loop(decoder, examples, [settings.seed] * len(examples), method, settings)


def _generate_one(decoder: Decoder, example: Example, method: Method, settings: BenchSettings, seed: int) -> Generation:
    try:
        return decoder.generate(settings.prompt_text(example.prompt, decoder.model.tokenizer), seed=seed)
    except InputError as exc:
        raise SpecframeError(f"prompt {example.index} ({example.id}) with {method.label}: {exc}") from exc


def _run_loop(
    decoder: Decoder, examples: list[Example], seeds: list[int], method: Method, settings: BenchSettings
) -> LoopResult:
    """Decode ``examples`` as one closed-loop run at ``method.concurrency`` (1: one request after another)."""
    prompts = [settings.prompt_text(ex.prompt, decoder.model.tokenizer) for ex in examples]
    try:
        return run_closed_loop(decoder.stream_many, prompts, seeds, method.concurrency)
    except InputError as exc:
        which = f"prompt {examples[0].index} ({examples[0].id})" if len(examples) == 1 else "a prompt"
        raise SpecframeError(f"{which} with {method.label}: {exc}") from exc


def _generate(
    todo: list[Work],
    decoders: Mapping[Method, Decoder],
    described: Mapping[Method, Mapping[str, Any]],
    task: Task,
    settings: BenchSettings,
    model: ModelBackend,
    progress: bool,
) -> Iterator[dict[str, Any]]:
    """Yield one record per pending response, unit by unit in the interleaved order of ``todo``.

    A closed-loop unit's records come when the whole run has finished (graded after it, outside its time).
    """
    from tqdm import tqdm

    bar = tqdm(
        total=sum(len(w.examples) for w in todo), unit="resp", file=sys.stderr, disable=not progress, dynamic_ncols=True
    )
    try:
        for work in todo:
            method, repeat = work.method, work.repeat
            examples = list(work.examples)
            seeds = [settings.seed_for(ex.index, repeat) for ex in examples]
            where = f"p{examples[0].index}" if method.concurrency == 1 else f"r{repeat}, {len(examples)} prompts"
            bar.set_postfix_str(f"{method.label} {where}", refresh=method.concurrency > 1)
            result = _run_loop(decoders[method], examples, seeds, method, settings)
            loop = None
            if method.concurrency > 1:
                loop = {
                    "id": f"{method.label}/r{repeat}/{uuid.uuid4().hex[:12]}",
                    "wall_s": _seconds(result.wall_s),
                    "requests": len(examples),
                    "output_tokens": result.output_tokens,
                }
            stochastic = bool(decoders[method].rule.stochastic)
            for example, seed, generation, timing in zip(
                examples, seeds, result.generations, result.timings, strict=True
            ):
                correct = task.grade(example, answer_text(model, generation.output_ids)) if task.graded else None
                bar.update()
                yield make_record(
                    settings,
                    example,
                    repeat,
                    method,
                    seed,
                    generation,
                    correct,
                    described[method],
                    stochastic=stochastic,
                    timing=timing,
                    loop=loop,
                )
    finally:
        bar.close()
