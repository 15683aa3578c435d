"""Compose a decoder from a plain configuration (a dict or a :class:`DecoderConfig`).

Example::

    from specframe import compose

    decoder = compose({
        "model": "nvidia/Nemotron-Labs-Diffusion-8B",   # Hub repo id, local folder, or None for the bundled model
        "schedule": "packed",
        "order": "ltr",
        "acceptance": {"name": "rejection", "temperature": 1.0, "top_k": 20},
        "width": 15,
        "max_new_tokens": 256,
        "seed": 0,
    })
    print(decoder.generate("def fib(n):").text)

Plugin fields (``schedule``, ``order``, ``acceptance``) take a registered name or a mapping with ``name`` plus
the plugin's options. Every field is validated and every error names the field, what is wrong and what to do.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specframe.acceptance.base import AcceptanceRule
from specframe.auto import setup as auto_setup
from specframe.auto.setup import check_cost
from specframe.blame import remember
from specframe.decoder import Decoder, as_integer, seed_problem
from specframe.errors import ConfigError, PluginError, SpecframeError
from specframe.kernels.quant import QUANTIZED
from specframe.masks.base import MaskBuilder
from specframe.models.base import ModelBackend
from specframe.models.hub import model_display_name
from specframe.models.threads import apply_threads, check_threads
from specframe.models.tokenizer import unicode_problem
from specframe.orders.base import OrderPolicy
from specframe.plugins import BUILTIN_DISTRIBUTION, KINDS, PluginEntry, get_registry
from specframe.schedules.base import Schedule

# What each kind's factory must return.
PRODUCTS: Mapping[str, type] = {
    "mask_builder": MaskBuilder,
    "order_policy": OrderPolicy,
    "acceptance_rule": AcceptanceRule,
    "schedule": Schedule,
}


@dataclass
class DecoderConfig:
    """Everything needed to compose a decoder.

    Attributes:
        model: Hub repo id, local checkpoint folder, an already loaded :class:`ModelBackend`, or ``None``
            for the small model bundled with specframe.
        schedule: Schedule name or ``{"name": ..., **options}`` (``ar``, ``linear``, ``quadratic``,
            ``packed``, ``native``, or a plugin's).
        order: Verification order name or mapping (``ltr``, ``confidence``).
        acceptance: Acceptance rule name or mapping (``greedy``; ``rejection`` with ``temperature``,
            ``top_k``, ``top_p``).
        width: Speculative width W >= 1 (Nemotron's block size is W + 1), or ``"auto"``: ``packed``,
            ``linear``, ``quadratic``, ``kbranch``, ``auto`` and any schedule that declares a ``rate_model``
            then choose the width of every call from the machine's cost model (``packed`` also falls back to
            plain AR calls); ``native`` uses 8, and another plugin schedule its ``auto_width`` (one that declares
            neither needs a width: ``"auto"`` is an error). ``ar`` takes no width: leave it at ``"auto"``.
        max_new_tokens: Output length limit L >= 1.
        seed: Seed of the sampling generator; ``None`` draws a fresh seed per request.
        device: Device to load the model on (``"cpu"``, ``"cuda"``, ``"cuda:1"``...); default CPU.
        dtype: Model dtype (``"float32"``, ``"bfloat16"``, ``"float16"``, ``"float64"``); default float32
            on CPU and the checkpoint's dtype on GPUs.
        revision: Hub revision (branch, tag or commit) when ``model`` is a repo id.
        quant: Quantize the model's float projections at load to a GGUF block format (``"q8_0"``, ``"q4_0"``,
            ``"q4_1"``), run by specframe's CPU kernels; ``None`` keeps them as the checkpoint stores them.
        adapter: Load and use the model's proposal-only adapter (Nemotron's ``linear_spec_lora``): ``True``,
            ``False``, or ``None`` (the default) for the drafter the checkpoint declares, if any (converted
            models with a trained drafter declare theirs).
        stop: Stops: strings (generation ends at the output token whose text completes one, whatever tokens
            spell it) or lists of token ids (it ends once all of them are accepted).
        threads: CPU threads for torch (``None``: ``OMP_NUM_THREADS`` if set, else chosen from the model's
            size and the machine's free cores; see :mod:`specframe.models.threads`).
        compile: Run steady-state model calls as compiled graphs over a fixed-capacity cache (``torch.compile``;
            CUDA graphs on CUDA); see :mod:`specframe.models.compiled`.
        cost: The cost model a width or schedule ``"auto"`` chooses by: ``None`` (this machine's, calibrated
            at first use and cached on disk), a :class:`~specframe.auto.costs.CostModel`, or a mapping such as
            ``{"tau": 0.007, "delta": 0.0002}`` (seconds per call and per row).
    """

    model: str | ModelBackend | None = None
    schedule: str | Mapping[str, Any] = "packed"
    order: str | Mapping[str, Any] = "ltr"
    acceptance: str | Mapping[str, Any] = "greedy"
    width: int | str = "auto"
    max_new_tokens: int = 256
    seed: int | None = 0
    device: str | None = None
    dtype: str | None = None
    revision: str | None = None
    quant: str | None = None
    adapter: bool | None = None
    stop: Sequence[str | Sequence[int]] = field(default_factory=tuple)
    threads: int | None = None
    compile: bool = False
    cost: Any = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> DecoderConfig:
        """Build a config from a mapping, rejecting unknown keys.

        Raises:
            ConfigError: For an unknown key (the message lists the valid ones).
        """
        if not isinstance(values, Mapping):
            raise ConfigError(f"a decoder config must be a mapping or DecoderConfig, got {type(values).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            close = {key: difflib.get_close_matches(key, known, n=1) for key in unknown}
            guesses = [
                f"{match[0]!r}" + (f" for {key!r}" if len(unknown) > 1 else "") for key, match in close.items() if match
            ]
            hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
            raise ConfigError(
                f"unknown config key(s) {', '.join(map(repr, unknown))}{hint}; valid keys: {', '.join(known)}"
            )
        return cls(**dict(values))

    def validate(self) -> None:
        """Check every field's type and range.

        Raises:
            ConfigError: Naming the first bad field, what is wrong and what to do.
        """
        if self.width != "auto":
            self.width = _check_int("width", self.width, minimum=1, hint='or "auto"')
        check_cost(self.cost)
        self.max_new_tokens = _check_int("max_new_tokens", self.max_new_tokens, minimum=1)
        if self.seed is not None:
            if seed_problem(self.seed):
                raise ConfigError(f"seed {seed_problem(self.seed)}")
            self.seed = as_integer(self.seed)  # a NumPy integer is taken as the int it is
        if self.model is not None and not isinstance(self.model, (str, ModelBackend)):
            raise ConfigError(
                f"model must be a Hub repo id, a folder path, a loaded ModelBackend or None, got {self.model!r}"
            )
        if isinstance(self.model, str) and not self.model.strip():
            raise ConfigError("model is an empty string; give a Hub repo id or folder, or None for the bundled model")
        for name in ("device", "dtype", "revision", "quant"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{name} must be a string or None, got {value!r}")
        if isinstance(self.device, str) and not self.device.strip():
            raise ConfigError("device is an empty string; give 'cpu', 'cuda', 'cuda:1', ... or None for the CPU")
        if self.quant is not None and self.quant not in QUANTIZED:
            raise ConfigError(f"quant {self.quant!r} is not a block format; use one of {', '.join(QUANTIZED)} or None")
        if isinstance(self.model, ModelBackend):
            given = [n for n in ("device", "dtype", "revision", "quant") if getattr(self, n) is not None]
            if given:
                raise ConfigError(
                    f"{', '.join(given)} only apply when specframe loads the model; the given model is already "
                    f"loaded on {self.model.device} as {self.model.dtype} (drop those keys)"
                )
        if self.adapter is not None and not isinstance(self.adapter, bool):
            raise ConfigError(
                f"adapter must be true, false or null (the checkpoint's own drafter), got {self.adapter!r}"
            )
        if self.threads is not None:
            self.threads = check_threads(self.threads)
        if not isinstance(self.compile, bool):
            raise ConfigError(f"compile must be true or false, got {self.compile!r}")
        for name in ("schedule", "order", "acceptance"):
            plugin_spec(name, getattr(self, name))
        if isinstance(self.stop, (str, bytes)) or not isinstance(self.stop, Sequence):
            raise ConfigError(f"stop must be a list of strings or token-id lists, got {self.stop!r}")
        for item in self.stop:
            if isinstance(item, str):
                if not item:
                    raise ConfigError("stop contains an empty string")
                if unicode_problem(item):
                    raise ConfigError(f"stop string {item!r}: {unicode_problem(item)}; give UTF-8 text")
            elif not (
                isinstance(item, Sequence)
                and item
                and all(as_integer(t) is not None and as_integer(t) >= 0 for t in item)
            ):
                raise ConfigError(f"stop entries must be non-empty strings or lists of token ids, got {item!r}")


def plugin_spec(field_name: str, value: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split a plugin field into ``(name, options)``.

    Raises:
        ConfigError: If the value is neither a name nor a mapping with a string ``name``.
    """
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{field_name} is an empty string; give a registered {field_name} name")
        name, colon, options = value.partition(":")
        if colon and "=" in options:  # the command line's NAME:key=value, which names no plugin
            raise ConfigError(
                f"{field_name} {value!r} is the command line's NAME:key=value form; in a configuration, give "
                f"the options in a mapping: {{'name': {name!r}, 'key': value, ...}}"
            )
        return value, {}
    if isinstance(value, Mapping):
        options = dict(value)
        name = options.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{field_name} mapping needs a 'name' key with the {field_name}'s name, got {value!r}")
        return name, options
    raise ConfigError(f"{field_name} must be a name or a mapping with 'name' and options, got {value!r}")


def build_plugin(entry: PluginEntry, field_name: str, options: Mapping[str, Any], *args: Any) -> Any:
    """Call a plugin factory with validated options and check what it returns.

    Raises:
        ConfigError: An option the factory does not take (the message lists the ones it takes), or a
            ``ValueError`` / ``TypeError`` the factory raised about its options.
        PluginError: The factory failed in another way or returned the wrong type (the message names the
            plugin and its distribution).
    """
    origin = f"(plugin {entry.plugin!r}, distribution {entry.distribution!r})"
    expected = PRODUCTS.get(entry.kind)
    if inspect.isclass(entry.factory) and inspect.isabstract(entry.factory):
        missing = ", ".join(sorted(entry.factory.__abstractmethods__))
        interface = f" ({expected.__module__}.{expected.__qualname__})" if expected is not None else ""
        raise PluginError(
            f"{field_name} {entry.name!r} {origin}: class {entry.factory.__qualname__} does not implement {missing}, "
            f"which every {KINDS[entry.kind][1]}{interface} must; this is a bug in that plugin"
        )
    try:
        signature = inspect.signature(entry.factory)
    except (TypeError, ValueError):  # some builtins and C callables have no signature: let the call decide
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **options)
        except TypeError:
            raise ConfigError(_option_problem(entry, field_name, options, signature, len(args))) from None
    try:
        product = entry.factory(*args, **options)
    except SpecframeError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{field_name} {entry.name!r} {origin}: {exc}") from exc
    except Exception as exc:
        raise PluginError(
            f"{field_name} {entry.name!r} {origin} failed while being built: {type(exc).__name__}: {exc}; this "
            "is a bug in that plugin (report it to its authors, or choose another one)"
        ) from exc
    if expected is not None and not isinstance(product, expected):
        raise PluginError(
            f"{field_name} {entry.name!r} {origin}: its factory returned {type(product).__name__}, not a "
            f"{KINDS[entry.kind][1]} ({expected.__module__}.{expected.__qualname__}); this is a bug in that plugin"
        )
    remember(product, entry)  # errors it raises while decoding name its plugin
    return product


def _option_problem(
    entry: PluginEntry, field_name: str, options: Mapping[str, Any], signature: inspect.Signature, skip: int
) -> str:
    parameters = list(signature.parameters.values())[skip:]
    accepted = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in parameters if p.name in accepted and p.default is p.empty and p.name not in options]
    unknown = sorted(set(options) - set(accepted))
    takes = ", ".join(accepted) if accepted else "no options"
    if entry.distribution != BUILTIN_DISTRIBUTION:  # say whose options these are
        takes += f" (plugin {entry.plugin!r}, distribution {entry.distribution!r})"
    if unknown:
        return f"{field_name} {entry.name!r} does not take option(s) {', '.join(map(repr, unknown))}; it takes: {takes}"
    return f"{field_name} {entry.name!r} needs option(s) {', '.join(map(repr, required))}; it takes: {takes}"


def compose(config: DecoderConfig | Mapping[str, Any] | None = None, **overrides: Any) -> Decoder:
    """Build a :class:`Decoder` from a configuration.

    Args:
        config: A :class:`DecoderConfig` or a plain mapping (``None``: all defaults).
        **overrides: Fields that replace the config's.

    Raises:
        ConfigError: A bad value, bad plugin options, or a combination the model family refuses.
        UnknownPluginError: A plugin name that nothing registered (the message lists the known names).
        CheckpointError: The model cannot be loaded.
    """
    if config is None:
        cfg = DecoderConfig()
    elif isinstance(config, DecoderConfig):
        cfg = dataclasses.replace(config)
    else:
        cfg = DecoderConfig.from_mapping(config)
    if overrides:
        cfg = DecoderConfig.from_mapping({**_fields(cfg), **overrides})
    cfg.validate()
    registry = get_registry()
    model = _load(cfg)
    if cfg.width != "auto":
        check_width(cfg.width, model)
    apply_threads(model, cfg.threads)
    if cfg.compile:
        enable_compiled(model)
    builder = build_plugin(registry.get("mask_builder", model.family), "mask builder", {}, model)
    order_name, order_options = plugin_spec("order", cfg.order)
    order = build_plugin(registry.get("order_policy", order_name), "order", order_options)
    builder.check_order(order, order_name)
    rule_name, rule_options = plugin_spec("acceptance", cfg.acceptance)
    rule = build_plugin(registry.get("acceptance_rule", rule_name), "acceptance", rule_options)
    check_top_k(rule, model)
    schedule_name, schedule_options = plugin_spec("schedule", cfg.schedule)
    schedule = build_plugin(registry.get("schedule", schedule_name, family=model.family), "schedule", schedule_options)
    schedule.name = schedule.name or schedule_name
    check_schedule_width(cfg.width, schedule)
    asked = cfg.width if getattr(schedule, "takes_width", True) else 1  # ar: a one-token window, a small cache
    schedule, width = auto_setup.resolve(asked, cfg.cost, schedule, schedule_name, model, builder, order, rule)
    return Decoder(
        model,
        builder,
        schedule,
        order,
        rule,
        width=width,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        stop_sequences=_stop_sequences(cfg, model),
        stop_texts=[item for item in cfg.stop if isinstance(item, str)],
        config={**_fields(cfg), "model": model.name},
    )


def check_width(width: int, model: ModelBackend) -> None:
    """Refuse a width wider than the model's context: no window can span more positions than it has.

    Raises:
        ConfigError: Naming the width, the model's context and what to use instead.
    """
    context = model.max_positions + 1
    if width > context:
        raise ConfigError(
            f"width {width} exceeds the context of model {model_display_name(model.name)!r} ({context} positions): "
            f"a window can never be wider than that; use a width <= {context} (speculative widths are typically 4-32)"
        )


def check_top_k(rule: AcceptanceRule, model: ModelBackend) -> None:
    """Refuse a ``top_k`` (as the rule describes it) larger than the model's vocabulary instead of clamping it.

    Raises:
        ConfigError: Naming top_k, the vocabulary size and what to use instead.
    """
    top_k = rule.describe().get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > model.vocab_size:
        raise ConfigError(
            f"top_k {top_k} exceeds the vocabulary of model {model_display_name(model.name)!r} ({model.vocab_size} "
            f"tokens), so it would keep every token; use a top_k <= {model.vocab_size}, or 0 for no truncation"
        )


def check_schedule_width(width: int | str, schedule: Schedule) -> None:
    """Refuse a width for a schedule that takes none (``ar``) instead of ignoring it.

    ``"auto"`` (the default) and 1 (what such a schedule's calls verify) pass.

    Raises:
        ConfigError: Naming the schedule and the width, and what to do instead.
    """
    if width in ("auto", 1) or getattr(schedule, "takes_width", True):
        return
    raise ConfigError(
        f"schedule {schedule.name!r} takes no width: it verifies one token per call, so width {width} would be "
        "ignored; drop the width (--width), or pick a speculative schedule (packed, linear, quadratic, kbranch) "
        f"to draft {width} tokens per call"
    )


def _fields(cfg: DecoderConfig) -> dict[str, Any]:
    """The config's fields, shallowly (``dataclasses.asdict`` would deep-copy a loaded model)."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _load(cfg: DecoderConfig) -> ModelBackend:
    if isinstance(cfg.model, ModelBackend):
        if cfg.adapter and not cfg.model.has_adapter:
            raise ConfigError("adapter=True but the given model was loaded without its adapter")
        return cfg.model
    from specframe.models.loading import load_configured

    return load_configured(cfg)


def enable_compiled(model: ModelBackend) -> None:
    """Switch ``model`` to its compiled path.

    Raises:
        ConfigError: If the backend has no compiled path, or torch.compile cannot run on this machine.
    """
    enable = getattr(model, "enable_compiled", None)
    if enable is None:
        raise ConfigError(
            f"model backend {type(model).__name__} ({model.family}) has no compiled path; drop compile / --compile"
        )
    enable()


def _stop_sequences(cfg: DecoderConfig, model: ModelBackend) -> list[list[int]]:
    """The token-id stop sequences; stop strings are checked here and matched as text by the decoder."""
    sequences = []
    for item in cfg.stop:
        if isinstance(item, str):
            if model.tokenizer is None:
                raise ConfigError(f"stop string {item!r} needs a tokenizer, and model {model.name!r} has none")
            if not model.tokenizer.encode(item):
                raise ConfigError(f"stop string {item!r} tokenizes to nothing")
        else:
            ids = [int(t) for t in item]
            if max(ids) >= model.vocab_size:
                raise ConfigError(f"stop sequence {ids} has ids outside the vocabulary of {model.vocab_size}")
            sequences.append(ids)
    return sequences


def _check_int(name: str, value: Any, *, minimum: int, hint: str = "") -> int:
    """``value`` as an int (a NumPy integer is one too), checked against ``minimum``."""
    number = as_integer(value)
    if number is None:
        raise ConfigError(f"{name} must be an integer{' ' + hint if hint else ''}, got {value!r}")
    if number < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return number
