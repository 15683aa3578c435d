"""Reading a checkpoint's ``config.json``: typed fields, RoPE settings and special token ids.

Field names are those of the published Hub configs (Llama / Mistral / Qwen3 conventions). Every missing or
malformed field is reported in one :class:`~specframe.errors.CheckpointError` that names the file and says
what to do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specframe.errors import CheckpointError
from specframe.models.layers import RopeSpec

CONFIG_NAME = "config.json"

_MISSING = object()


def finite_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (not a bool).

    JSON's ``NaN`` and ``Infinity`` are accepted by Python's parser, and a comparison with NaN is always false,
    so every number read from a config is checked here before its range is.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def read_json(path: Path, what: str) -> dict[str, Any]:
    """Parse a JSON object from ``path``.

    Raises:
        CheckpointError: If the file is missing, is not valid JSON or is not an object.
    """
    if not path.is_file():
        raise CheckpointError(f"{what} not found: {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{what} {path} is not valid JSON ({exc}); restore or re-download it") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {path} must hold a JSON object, not {type(data).__name__}")
    return data


def read_config(folder: Path) -> dict[str, Any]:
    """The ``config.json`` of a checkpoint folder."""
    return read_json(folder / CONFIG_NAME, "model config")


class Fields:
    """Typed access to a config dict that collects every problem before raising.

    Args:
        data: The parsed config.
        where: How to name the config in messages (usually its path).
        hint: What the user can do about missing fields.
    """

    def __init__(self, data: Mapping[str, Any], where: str, hint: str = "") -> None:
        self.data = data
        self.where = where
        self.hint = hint
        self.missing: list[str] = []
        self.invalid: list[str] = []

    def int(self, name: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        """An integer field ``>= minimum`` (missing fields without a default are recorded)."""
        value = self._get(name, default)
        if value is None or value is _MISSING:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.invalid.append(f"{name}={value!r} (expected an integer >= {minimum})")
            return 0
        return value

    def float(self, name: str, default: Any = _MISSING) -> float:
        """A positive number field."""
        value = self._get(name, default)
        if value is None or value is _MISSING:
            return 0.0
        if not finite_number(value) or value <= 0:
            self.invalid.append(f"{name}={value!r} (expected a finite positive number)")
            return 0.0
        return float(value)

    def value(self, name: str, default: Any = None) -> Any:
        """Any field, ``default`` when absent (never recorded as missing)."""
        return self.data.get(name, default)

    def expect(self, name: str, allowed: tuple[Any, ...], why: str) -> None:
        """Record an invalid field unless it is absent or one of ``allowed``."""
        value = self.data.get(name, allowed[0])
        if value not in allowed:
            self.invalid.append(f"{name}={value!r} ({why})")

    def check(self) -> None:
        """Raise one error naming every missing and invalid field seen so far."""
        problems = []
        if self.missing:
            problems.append("missing field(s) " + ", ".join(self.missing))
        if self.invalid:
            problems.append("unsupported value(s) " + "; ".join(self.invalid))
        if problems:
            hint = f"; {self.hint}" if self.hint else ""
            raise CheckpointError(f"{self.where}: " + "; ".join(problems) + hint)

    def _get(self, name: str, default: Any) -> Any:
        value = self.data.get(name, default)
        if value is _MISSING or (value is None and default is _MISSING):
            self.missing.append(name)
            return _MISSING
        return value


@dataclass(frozen=True)
class DecoderDims:
    """Sizes of a Llama-style decoder, as named in ``config.json``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_positions: int


def read_dims(fields: Fields, *, default_eps: float) -> DecoderDims:
    """Read the decoder sizes (``num_key_value_heads`` defaults to the heads, ``head_dim`` to hidden/heads)."""
    hidden = fields.int("hidden_size")
    heads = fields.int("num_attention_heads")
    kv_heads = fields.int("num_key_value_heads", heads or None)
    head_dim = fields.int("head_dim", (hidden // heads) if heads else None)
    dims = DecoderDims(
        vocab_size=fields.int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=fields.int("intermediate_size"),
        num_layers=fields.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=fields.float("rms_norm_eps", default_eps),
        max_positions=fields.int("max_position_embeddings"),
    )
    if heads and kv_heads and heads % kv_heads:
        fields.invalid.append(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    if head_dim % 2:
        fields.invalid.append(f"head_dim={head_dim} (rotary embeddings need an even head size)")
    fields.expect("hidden_act", ("silu",), "only SiLU (SwiGLU) MLPs are supported")
    fields.expect("attention_bias", (False,), "attention biases are not supported")
    fields.expect("mlp_bias", (False,), "MLP biases are not supported")
    window = fields.value("sliding_window")
    if fields.value("use_sliding_window", window is not None) and window is not None:
        if not isinstance(window, int) or window < dims.max_positions:
            fields.invalid.append(f"sliding_window={window!r} (sliding-window attention is not supported)")
    return dims


def rope_parameters(data: Mapping[str, Any]) -> dict[str, Any]:
    """The RoPE settings, from ``rope_parameters`` or its alias ``rope_scaling``, with top-level fallbacks."""
    params = data.get("rope_parameters") or data.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        return {"rope_type": params}
    merged = dict(params)
    for key in ("rope_theta", "llama_4_scaling_beta", "original_max_position_embeddings"):
        if key not in merged and key in data:
            merged[key] = data[key]
    return merged


def partial_rotary_problem(data: Mapping[str, Any]) -> str | None:
    """What is wrong with a config's ``partial_rotary_factor`` (top level or in its RoPE settings), if anything.

    Args:
        data: The parsed config.

    Returns:
        ``None`` when the field is absent or 1 (rotary embeddings over whole heads, all specframe runs), else
        a message naming the field and its value.
    """
    params = data.get("rope_parameters") or data.get("rope_scaling")
    nested = params.get("partial_rotary_factor") if isinstance(params, Mapping) else None
    partial = data.get("partial_rotary_factor", nested)
    if partial is None or partial == 1:
        return None
    return (
        f"partial_rotary_factor={partial!r} (rotary embeddings on part of each head; specframe needs full rotary "
        "embeddings, partial_rotary_factor 1)"
    )


def read_rope(fields: Fields, max_positions: int) -> RopeSpec:
    """Read the RoPE settings (types ``default`` and ``yarn``); ``rope_theta`` may be nested or top-level.

    Rotary embeddings must cover whole heads: a ``partial_rotary_factor`` (nested or top-level) other than 1
    is recorded as invalid.
    """
    params = rope_parameters(fields.data)
    kind = params.get("rope_type", params.get("type", "default"))
    partial = partial_rotary_problem(fields.data)
    if partial:
        fields.invalid.append(partial)
    theta = params.get("rope_theta")
    if theta is None:
        fields.missing.append("rope_theta (top level or inside rope_parameters)")
        theta = 10000.0
    elif not finite_number(theta) or theta <= 1:
        fields.invalid.append(f"rope_theta={theta!r} (expected a finite number > 1)")
        theta = 10000.0
    if kind == "default":
        return RopeSpec(theta=float(theta))
    if kind != "yarn":
        fields.invalid.append(f"rope type {kind!r} (supported: 'default', 'yarn')")
        return RopeSpec(theta=float(theta))
    original = params.get("original_max_position_embeddings") or max_positions
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        fields.invalid.append(f"rope original_max_position_embeddings={original!r} (expected an integer >= 1)")
        original = max(int(max_positions), 1)
    factor = params.get("factor")
    if factor is None:
        factor = max_positions / original
    elif not finite_number(factor) or factor < 1:
        fields.invalid.append(f"rope factor={factor!r} (YaRN stretches the context: expected a finite number >= 1)")
        factor = 1.0
    for beta in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"):
        value = params.get(beta)
        if value is not None and (not finite_number(value) or value < 0):
            fields.invalid.append(f"rope {beta}={value!r} (expected a finite non-negative number)")
    return RopeSpec(
        theta=float(theta),
        kind="yarn",
        factor=float(factor),
        original_max_positions=int(original),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
    )


def token_ids(value: Any, name: str = "token id", where: str = "config.json") -> tuple[int, ...]:
    """Token ids from a config value that may be ``None``, an int or a list of ints.

    Args:
        value: The field's value.
        name: The field's name (for messages).
        where: The config file (for messages).

    Raises:
        CheckpointError: If an entry is not an integer (naming the file, the field and its value).
    """
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else [value]
    ids = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise CheckpointError(
                f"{where}: {name}={value!r} is not a token id (an integer, or a list of integers); use the "
                "config.json published with the checkpoint"
            )
        ids.append(item)
    return tuple(dict.fromkeys(ids))


def check_special_ids(ids: Mapping[str, int | tuple[int, ...] | None], vocab_size: int, where: str) -> None:
    """Fail when a special token id lies outside the model's vocabulary."""
    bad = []
    for name, value in ids.items():
        for token in token_ids(value, name, where):
            if not 0 <= token < vocab_size:
                bad.append(f"{name}={token}")
    if bad:
        raise CheckpointError(
            f"{where}: special token id(s) {', '.join(bad)} outside the model vocabulary of {vocab_size}; "
            "the config and the weights (or tokenizer) do not belong together"
        )


def checkpoint_dtype(data: Mapping[str, Any]) -> Any:
    """The dtype a checkpoint was saved in (``torch_dtype`` or ``dtype``), if recorded, else ``None``.

    The value is returned as written, a string or not: :func:`specframe.models.loading.check_saved_dtype`
    reports one that names no dtype rather than taking it for an absent one.
    """
    for source in (data, data.get("backbone_config") or {}):
        if isinstance(source, Mapping):
            for key in ("torch_dtype", "dtype"):
                value = source.get(key)
                if value is not None:
                    return value
    return None
