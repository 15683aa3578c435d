"""The settings of a benchmark run, the methods it compares, and which settings must agree to resume or merge."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specframe.errors import ConfigError
from specframe.specs import format_spec, parse_spec, spec_name

# Settings that may differ between a stored run and a resumed one, or between shards being merged: they
# change which prompts a process works on or how it reports, never what a record means.
# task_file is a local path (it may differ between hosts); task_digest checks that the prompts are the same.
SCOPE_KEYS = frozenset(
    {"limit", "shard", "warmup", "baseline", "device", "resamples", "bootstrap_seed", "task_file", "threads"}
)
MAX_REPEATS = 1000  # seeds are base + 1000 * prompt index + repeat
MAX_CONCURRENCY = 4096  # requests in flight per method: far past what one model call packs usefully
# Record-defining settings that older runs did not store, with the value they implied (so old folders resume).
LEGACY_DEFAULTS: dict[str, Any] = {"concurrency": [1]}
WIDTHLESS = frozenset({"ar"})  # schedules that take no speculative width

#: ``--prompt-template`` value that sends each prompt as a user message in the model's chat template.
CHAT = "chat"


@dataclass(frozen=True, order=True)
class Method:
    """One decoding configuration being compared: a schedule, for speculative schedules a width, and a concurrency.

    Attributes:
        schedule: Schedule spec in canonical form: its name, or ``NAME:key=value,...`` with the schedule's
            options (sorted by key), e.g. ``adaptive-packed:cooldown=4,patience=2``.
        width: Speculative width, ``"auto"`` (chosen per call), ``None`` for schedules without one (``ar``).
        concurrency: Requests in flight at once (closed loop); 1 decodes one request at a time, as bench always
            did, and keeps the label and record key runs made before ``--concurrency`` existed have.
    """

    schedule: str
    width: int | str | None = None
    concurrency: int = 1

    @property
    def label(self) -> str:
        """``packed/w8``, ``packed/wauto``, ``adaptive-packed:patience=2/w8``, ``ar``; ``packed/w8@c4`` at c=4."""
        return self.unbatched_label + ("" if self.concurrency == 1 else f"@c{self.concurrency}")

    @property
    def unbatched_label(self) -> str:
        """The label without the concurrency: ``packed/w8`` for ``packed/w8@c4``."""
        return self.schedule if self.width is None else f"{self.schedule}/w{self.width}"

    def at(self, concurrency: int) -> Method:
        """The same schedule and width at another concurrency."""
        return dataclasses.replace(self, concurrency=concurrency)

    @property
    def name(self) -> str:
        """The schedule's registered name, without options."""
        return spec_name(self.schedule)

    @property
    def options(self) -> dict[str, Any]:
        """The schedule's options (empty when it has none)."""
        spec = parse_spec(self.schedule)
        return {} if isinstance(spec, str) else {k: v for k, v in spec.items() if k != "name"}

    @classmethod
    def parse(cls, text: str) -> Method:
        """Parse a label (``packed/w8``, ``packed/8``, ``ar``, ``NAME:key=value/w8``, ``packed/w8@c4``, ``ar@c4``).

        Raises:
            ConfigError: For a malformed width, concurrency or schedule spec.
        """
        head, at, tail = text.rpartition("@c")
        concurrency = 1
        if at and tail.isdigit() and int(tail) >= 1:
            text, concurrency = head, int(tail)
        schedule, slash, width = text.rpartition("/")
        if not slash:
            return cls(canonical_schedule(text), None, concurrency)
        try:
            width = width.removeprefix("w")
            return cls(canonical_schedule(schedule), "auto" if width == "auto" else int(width), concurrency)
        except ValueError:
            raise ConfigError(f"bad method {text!r}: write a schedule name or schedule/width like linear/w8") from None


def canonical_schedule(text: str) -> str:
    """A schedule spec in the canonical form that names bench methods (options sorted by key).

    Raises:
        ConfigError: For a malformed spec.
    """
    return format_spec(parse_spec(text, option="--schedules"))


@dataclass
class BenchSettings:
    """Everything that defines a benchmark run.

    Attributes:
        task: Task name.
        task_file: Local data file used instead of the task's default source.
        task_digest: Fingerprint of the task's full prompt set (filled in when the task is loaded).
        model: Hub repo id or folder (``None``: the bundled model).
        schedules: Schedules to compare, as canonical specs (``NAME`` or ``NAME:key=value,...``).
        widths: Speculative widths (applied to every schedule except ``ar``).
        order: Verification order (``NAME`` or ``NAME:key=value,...``).
        acceptance: Acceptance rule name or mapping (as in a decoder config).
        threshold: Confidence threshold of the ``native`` schedule (``None``: its default).
        max_new_tokens: Output cap.
        repeats: Responses per prompt and method.
        seed: Base seed (response seeds are ``seed + 1000 * prompt index + repeat``).
        dtype: Model dtype (``None``: the loader's default).
        quant: GGUF block format the projections are quantized to at load (``None``: as stored).
        revision: Hub revision of the model.
        adapter: Use the proposal-only adapter (``None``: the drafter the checkpoint declares, if any).
        stop: Stop strings.
        prompt_template: ``"chat"`` for the model's chat template, or text around each prompt, with ``{prompt}``
            where the prompt goes (e.g. a hand-written chat format); ``None`` for raw prompts.
        limit: Only the first ``limit`` prompts.
        shard: ``(i, n)``: only prompts whose index is ``i`` modulo ``n``.
        warmup: Untimed warm-up generations per method before measuring.
        baseline: Schedule (or ``schedule/wW``) the others are compared against.
        device: Device the model runs on.
        resamples: Bootstrap resamples.
        bootstrap_seed: Seed of the bootstrap's prompt draws.
        threads: CPU threads (``None``: the thread policy of :mod:`specframe.models.threads`).
        compile: Compiled model calls (:mod:`specframe.models.compiled`).
        concurrency: Requests in flight per method (closed loop), one run per value: ``[1]`` decodes one
            request at a time; ``[1, 4, 16]`` runs every method at each of those.
    """

    task: str
    schedules: list[str]
    widths: list[int]
    model: str | None = None
    task_file: str | None = None
    task_digest: str | None = None
    order: str = "ltr"
    acceptance: str | dict[str, Any] = "greedy"
    threshold: float | None = None
    max_new_tokens: int = 256
    repeats: int = 1
    seed: int = 0
    dtype: str | None = None
    quant: str | None = None
    revision: str | None = None
    adapter: bool | None = None
    stop: list[str] = field(default_factory=list)
    prompt_template: str | None = None
    limit: int | None = None
    shard: tuple[int, int] | None = None
    warmup: int = 1
    baseline: str | None = None
    device: str | None = None
    resamples: int = 20_000
    bootstrap_seed: int = 0
    threads: int | None = None
    compile: bool = False
    concurrency: list[int] = field(default_factory=lambda: [1])

    def validate(self) -> None:
        """Check ranges and combinations.

        Raises:
            ConfigError: Naming the bad setting and what to do.
        """
        self.schedules = [canonical_schedule(s) for s in self.schedules]
        if not self.schedules:
            raise ConfigError("--schedules is empty; name at least one schedule, e.g. ar,linear,quadratic,packed")
        if len(set(self.schedules)) != len(self.schedules):
            raise ConfigError(f"--schedules repeats a schedule: {','.join(self.schedules)}")
        if not self.widths or not all(w == "auto" or (type(w) is int and w >= 1) for w in self.widths):
            raise ConfigError(f"--widths must be positive integers or 'auto', got {self.widths}")
        if len(set(self.widths)) != len(self.widths):
            raise ConfigError(f"--widths repeats a width: {','.join(map(str, self.widths))}")
        check_concurrency(self.concurrency)
        from specframe.decoder import seed_problem

        if seed_problem(self.seed):
            raise ConfigError(f"--seed {seed_problem(self.seed)}")
        if isinstance(self.order, str):
            parse_spec(self.order, option="--order")
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise ConfigError(f"--repeats must be between 1 and {MAX_REPEATS}, got {self.repeats}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be >= 0, got {self.warmup}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.resamples < 1:
            raise ConfigError(f"--resamples must be >= 1, got {self.resamples}")
        if isinstance(self.bootstrap_seed, bool) or not isinstance(self.bootstrap_seed, int) or self.bootstrap_seed < 0:
            raise ConfigError(f"--bootstrap-seed must be an integer >= 0, got {self.bootstrap_seed!r}")
        if self.prompt_template not in (None, CHAT) and "{prompt}" not in self.prompt_template:
            raise ConfigError(
                f"--prompt-template must contain {{prompt}} where the prompt text goes, or be {CHAT!r} for the "
                "model's chat template"
            )
        if self.shard is not None:
            index, count = self.shard
            if not 0 <= index < count:
                raise ConfigError(f"--shard {index}/{count}: the shard index must be in 0..{count - 1}")
        self.baseline_method()

    @property
    def temperature(self) -> float:
        """Sampling temperature (0 for greedy acceptance)."""
        if spec_name(self.acceptance) == "greedy":
            return 0.0
        if isinstance(self.acceptance, Mapping):
            return float(self.acceptance.get("temperature", 1.0))
        return 1.0

    def methods(self) -> list[Method]:
        """The methods compared, in a fixed order: per concurrency, each schedule (speculative ones at each width)."""
        methods = []
        for concurrency in self.concurrency:
            for schedule in self.schedules:
                if spec_name(schedule) in WIDTHLESS:
                    methods.append(Method(schedule, None, concurrency))
                else:
                    methods.extend(Method(schedule, width, concurrency) for width in self.widths)
        return methods

    def baseline_method(self) -> str:
        """The baseline schedule or method label: ``--baseline``, else ``linear``, else ``ar``, else the first.

        Raises:
            ConfigError: If ``--baseline`` names no compared method.
        """
        labels = {m.unbatched_label for m in self.methods()}
        if self.baseline is None:
            for candidate in ("linear", "ar"):
                if candidate in self.schedules:
                    return candidate
            return self.schedules[0]
        wanted = Method.parse(self.baseline)
        if wanted.concurrency != 1 or "@c" in self.baseline:
            raise ConfigError(
                f"--baseline {self.baseline}: name the baseline without a concurrency (e.g. ar, not ar@c4); every "
                "method is compared with the baseline at its own concurrency"
            )
        if wanted.schedule in self.schedules and (wanted.width is None or wanted.label in labels):
            return self.baseline
        raise ConfigError(
            f"--baseline {self.baseline} is not among the compared methods ({', '.join(sorted(labels))}); add it to "
            "--schedules/--widths or pick one of them"
        )

    def prompt_text(self, prompt: str, tokenizer: object = None) -> str:
        """The text given to the model for a task prompt (the template applied, if any).

        Args:
            prompt: The task's prompt.
            tokenizer: The model's tokenizer, whose chat template ``--prompt-template chat`` applies.
        """
        if self.prompt_template is None:
            return prompt
        if self.prompt_template == CHAT:
            from specframe.models.chat import chat_prompt

            return chat_prompt(tokenizer, prompt, where="--prompt-template chat")
        return self.prompt_template.replace("{prompt}", prompt)

    def seed_for(self, prompt_index: int, repeat: int) -> int:
        """The sampling seed of one response (the same for every method, so repeats are paired too)."""
        return self.seed + MAX_REPEATS * prompt_index + repeat

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly settings (``shard`` as ``"i/n"``)."""
        data = dataclasses.asdict(self)
        data["shard"] = f"{self.shard[0]}/{self.shard[1]}" if self.shard else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchSettings:
        """Settings from :meth:`to_dict` output (unknown keys are ignored, for forward compatibility)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("concurrency") is not None:
            values["concurrency"] = list(values["concurrency"])
        if values.get("shard"):
            values["shard"] = parse_shard(values["shard"])
        return cls(**values)


def parse_shard(text: str | Sequence[int]) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)``.

    Raises:
        ConfigError: If it is not two integers with 0 <= i < n.
    """
    if not isinstance(text, str):
        index, count = (int(v) for v in text)
    else:
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise ConfigError(f"--shard must look like i/n (e.g. 0/4), got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"--shard {index}/{count}: need n >= 1 and 0 <= i < n")
    return index, count


def check_concurrency(values: Sequence[Any], option: str = "--concurrency") -> None:
    """Refuse concurrency levels that are not distinct integers in ``1..MAX_CONCURRENCY``.

    Raises:
        ConfigError: Naming the bad value and what to give instead.
    """
    shown = ",".join(map(str, values))
    if not values:
        raise ConfigError(f"{option} is empty; give requests in flight per method, e.g. 1 or 1,4,16")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
            raise ConfigError(
                f"{option} must be integers from 1 to {MAX_CONCURRENCY} (requests in flight per method), like "
                f"1,4,16; got {value!r} in {shown}"
            )
    if len(set(values)) != len(values):
        raise ConfigError(f"{option} repeats a value: {shown}; give each concurrency once")


def differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The record-defining settings that differ, as ``key: stored -> current`` lines.

    A key that ``stored`` lacks and :data:`LEGACY_DEFAULTS` names counts as that default (runs made before
    the setting existed meant it).
    """
    lines = []
    for key in sorted(set(stored) | set(current)):
        if key in SCOPE_KEYS:
            continue
        old = stored.get(key, LEGACY_DEFAULTS.get(key))
        if _canonical(old) != _canonical(current.get(key, LEGACY_DEFAULTS.get(key))):
            lines.append(f"{key}: {old!r} -> {current.get(key)!r}")
    return lines


def _canonical(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in sorted(value.items())}
    return value
