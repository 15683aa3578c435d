"""Proposal-only LoRA adapters saved in the PEFT layout, on attention ``o_proj`` and MLP ``down_proj``.

A PEFT adapter folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, optional
``use_rslora``, ``rank_pattern`` and ``alpha_pattern``) and ``adapter_model.safetensors`` (or ``.bin``) with
keys ``base_model.model.<module path>.lora_A.weight`` (``[r, in]``) and ``...lora_B.weight`` (``[out, r]``).
The targets are each layer's attention output projection (``<prefix>.layers.N.self_attn.o_proj``) and MLP
output projection (``<prefix>.layers.N.mlp.down_proj``), either or both. ``rank_pattern`` / ``alpha_pattern``
give some modules another rank / alpha than ``r`` / ``lora_alpha`` (e.g. ``{"down_proj": 32}``), matched to
a module's name as PEFT matches them. The update ``scale * B A x`` (``scale = alpha / r``, or
``alpha / sqrt(r)`` with rsLoRA) is added only to the rows a call marks in ``adapter_rows``; the other rows
run exactly the base weights.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specframe.errors import CheckpointError
from specframe.models.config_json import Fields, finite_number, read_json
from specframe.models.layers import LowRankUpdate
from specframe.models.transformer import DecoderNetwork
from specframe.models.weights import FiniteCheck, freeze, open_weights

#: The projections an adapter may target: PEFT's module name -> (block of the layer, projection, adapter
#: attribute of the block).
TARGETS = {"o_proj": ("self_attn", "o_proj", "o_lora"), "down_proj": ("mlp", "down_proj", "down_lora")}
SUPPORTED_TARGETS = tuple(TARGETS)


@dataclass(frozen=True)
class AdapterConfig:
    """What ``adapter_config.json`` says about the adapter's modules.

    Attributes:
        targets: The targeted modules (keys of :data:`TARGETS`).
        rank: ``r``, the rank of a module ``rank_pattern`` does not name.
        alpha: ``lora_alpha``, the alpha of a module ``alpha_pattern`` does not name.
        rslora: Whether the scale is ``alpha / sqrt(rank)`` (rsLoRA) rather than ``alpha / rank``.
        rank_pattern: PEFT's per-module ranks (a module name, or a pattern of its name's end, to a rank).
        alpha_pattern: PEFT's per-module alphas.
    """

    targets: tuple[str, ...]
    rank: int
    alpha: float
    rslora: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)

    def module(self, name: str) -> tuple[int, float, str]:
        """``(rank, scale, where the rank comes from)`` of the module called ``name`` (its full path).

        A key equal to the name wins; else the first key that, as a regular expression, matches the name's end
        after a dot (PEFT's rule: ``"down_proj"`` names every layer's ``mlp.down_proj``).
        """
        rank_key, alpha_key = _pattern_key(self.rank_pattern, name), _pattern_key(self.alpha_pattern, name)
        rank = self.rank if rank_key is None else self.rank_pattern[rank_key]
        alpha = self.alpha if alpha_key is None else self.alpha_pattern[alpha_key]
        scale = alpha / math.sqrt(rank) if self.rslora else alpha / rank
        return rank, scale, f"r={rank}" if rank_key is None else f"rank_pattern[{rank_key!r}]={rank}"


def _pattern_key(pattern: dict[str, Any], name: str) -> str | None:
    if name in pattern:
        return name
    for key in pattern:
        try:
            if re.match(rf"(.*\.)?({key})$", name):
                return key
        except re.error:
            continue
    return None


def read_adapter_config(config: dict, where: str, module_prefix: str = "model") -> AdapterConfig:
    """The targets, ranks and alphas of a PEFT adapter config.

    A ``target_modules`` entry names a target when it is its name (``"o_proj"``) or, as a regular expression,
    matches it whole, alone or as the module's path under ``module_prefix`` (PEFT matches a string
    ``target_modules`` against the whole path, e.g. ``".*(o_proj|down_proj)"``).

    Args:
        config: The parsed ``adapter_config.json``.
        where: How to name the adapter in messages.
        module_prefix: Path of the decoder stack inside the original model (``"encoder"`` for Nemotron).

    Raises:
        CheckpointError: If fields are missing or invalid, or the adapter targets modules other than ``o_proj``
            and ``down_proj``.
    """
    fields = Fields(config, where, "an adapter_config.json written by PEFT is expected")
    rank = fields.int("r")
    alpha = fields.float("lora_alpha")
    listed = fields.value("target_modules")
    names = [listed] if isinstance(listed, str) else list(listed or [])
    targets = []
    for name in names:
        covered = [t for t in TARGETS if name == t or _names(name, t, module_prefix)]
        if not covered:
            fields.invalid.append(
                f"target_modules entry {name!r} (only {' and '.join(SUPPORTED_TARGETS)} are supported)"
            )
        targets += [t for t in covered if t not in targets]
    if not names:
        fields.invalid.append(f"target_modules={listed!r} (name o_proj and/or down_proj)")
    if fields.value("bias", "none") != "none":
        fields.invalid.append(f"bias={fields.value('bias')!r} (adapter biases are not supported)")
    rank_pattern = _pattern(fields, "rank_pattern", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0)
    alpha_pattern = _pattern(fields, "alpha_pattern", lambda v: finite_number(v) and v > 0)
    fields.check()
    ordered = tuple(t for t in TARGETS if t in targets)
    return AdapterConfig(ordered, rank, alpha, bool(fields.value("use_rslora")), rank_pattern, alpha_pattern)


def _names(pattern: Any, target: str, prefix: str) -> bool:
    """Whether the ``target_modules`` entry ``pattern`` matches ``target``, alone or as a path under ``prefix``."""
    try:
        names = (target, _module_name(prefix, 0, target))
        return isinstance(pattern, str) and any(re.fullmatch(pattern, name) for name in names)
    except re.error:
        return False


def _pattern(fields: Fields, key: str, valid: Any) -> dict:
    """A ``rank_pattern`` / ``alpha_pattern`` dict (empty when absent), its bad entries recorded."""
    value = fields.value(key) or {}
    if not isinstance(value, dict):
        fields.invalid.append(f"{key}={value!r} (expected a dict of module name to value)")
        return {}
    bad = {k: v for k, v in value.items() if not valid(v)}
    if bad:
        what = "an integer >= 1" if key == "rank_pattern" else "a finite positive number"
        fields.invalid.append(f"{key} entries {bad!r} (each value must be {what})")
    return {k: v for k, v in value.items() if k not in bad}


def attach_lora(
    network: DecoderNetwork, folder: Path, *, module_prefix: str, device: torch.device, dtype: torch.dtype
) -> int:
    """Load the PEFT adapter in ``folder`` onto the ``o_proj`` and/or ``down_proj`` projections of ``network``.

    Each targeted projection of a layer the adapter covers gets a :class:`LowRankUpdate`
    (``Attention.o_lora``, ``SwiGLU.down_lora``); a layer may carry either or both, but each with both halves.

    Args:
        network: The loaded base network.
        folder: The adapter folder (e.g. ``<checkpoint>/linear_spec_lora``).
        module_prefix: Path of the decoder stack inside the original model (``"encoder"`` for Nemotron).
        device: Device for the adapter weights.
        dtype: Dtype for the adapter weights.

    Returns:
        How many layers received an adapter (on either projection).

    Raises:
        CheckpointError: If the adapter is missing, malformed, or does not fit the model.
    """
    if not folder.is_dir():
        raise CheckpointError(
            f"no adapter folder {folder}; this checkpoint ships no proposal-only LoRA (drop adapter=True / --adapter)"
        )
    settings = read_json(folder / "adapter_config.json", "adapter config")
    config = read_adapter_config(settings, str(folder), module_prefix)
    layers = network.body.layers
    pattern = re.compile(
        rf"^base_model\.model\.{re.escape(module_prefix)}\.layers\.(\d+)\.(self_attn\.o_proj|mlp\.down_proj)"
        r"\.lora_([AB])(?:\.default)?\.weight$"
    )
    found: dict[tuple[int, str], dict[str, str]] = {}  # (layer, target) -> half -> tensor name
    with open_weights(folder, stem="adapter_model") as source:
        unexpected = []
        for name in source.names():
            match = pattern.match(name)
            if not match or int(match.group(1)) >= len(layers):
                unexpected.append(name)
                continue
            target = match.group(2).split(".")[1]
            found.setdefault((int(match.group(1)), target), {})[match.group(3)] = name
        problems = [f"unexpected tensor(s) {', '.join(unexpected[:8])}"] if unexpected else []
        problems += _fit_problems(config, found, source, layers, module_prefix)
        if problems:
            raise CheckpointError(f"adapter in {folder} does not fit the model: " + "; ".join(problems))
        finite = FiniteCheck(source, f"adapter in {folder}")
        names = [name for pair in found.values() for name in pair.values()]
        loaded = {name: finite.add(name, source.load(name).to(device=device, dtype=dtype)) for name in names}
        finite.check()
        for (index, target), pair in found.items():
            block, linear = _projection(layers, index, target)
            rank, scale, _ = config.module(_module_name(module_prefix, index, target))
            with torch.device("meta"):
                update = LowRankUpdate(linear.in_features, linear.out_features, rank, scale)
            update.load_state_dict({f"lora_{h}": loaded[n] for h, n in pair.items()}, strict=True, assign=True)
            freeze(update.parameters())
            setattr(block, TARGETS[target][2], update)
    return len({index for index, _ in found})


def _projection(layers: nn.ModuleList, index: int, target: str) -> tuple[nn.Module, nn.Linear]:
    """The block of layer ``index`` that holds ``target`` (where its adapter goes), and the projection itself."""
    block_name, projection, _ = TARGETS[target]
    block = getattr(layers[index], block_name)
    return block, getattr(block, projection)


def _module_name(prefix: str, index: int, target: str) -> str:
    """The targeted module's path in the original model (what PEFT matches its patterns against)."""
    return f"{prefix}.layers.{index}.{TARGETS[target][0]}.{target}"


def _fit_problems(
    config: AdapterConfig, found: dict[tuple[int, str], dict[str, str]], source: Any, layers: nn.ModuleList, prefix: str
) -> list[str]:
    """What keeps the adapter's tensors ``found`` from fitting ``layers`` as ``config`` describes them."""
    if not found:
        return [f"no o_proj or down_proj LoRA tensors under base_model.model.{prefix}.layers"]
    problems = []
    for target in TARGETS:
        held = any(t == target for _, t in found)
        if target in config.targets and not held:
            problems.append(f"target_modules names {target} but there are no {target} LoRA tensors")
        elif held and target not in config.targets:
            problems.append(f"there are {target} LoRA tensors but target_modules does not name {target}")
    for (index, target), pair in sorted(found.items()):
        _, linear = _projection(layers, index, target)
        rank, _, origin = config.module(_module_name(prefix, index, target))
        want = {"A": (rank, linear.in_features), "B": (linear.out_features, rank)}
        for half, shape in want.items():
            if half not in pair:
                problems.append(f"layer {index} {target} has no lora_{half}")
            elif tuple(source.shape(pair[half])) != shape:
                problems.append(
                    f"{pair[half]} has shape {list(source.shape(pair[half]))}, expected {list(shape)} ({origin})"
                )
    return problems


ACCEPTANCE_FILE = "specframe_acceptance.json"
"""Beside an adapter: ``{"by_offset": [q1, q2, ...]}``, how often its drafts at offsets 1, 2, ... agreed with the
model on held-out text (``train-drafter`` writes it from its last evaluation)."""


def read_acceptance(folder: Path) -> tuple[float, ...] | None:
    """The drafter's measured agreement by draft offset from ``folder``'s :data:`ACCEPTANCE_FILE`, if it has one.

    Raises:
        CheckpointError: If the file is there but is not a list of shares in [0, 1] under ``by_offset``.
    """
    path = folder / ACCEPTANCE_FILE
    if not path.is_file():
        return None
    values = read_json(path, "drafter acceptance").get("by_offset")
    if not isinstance(values, list) or not values or not all(finite_number(v) and 0.0 <= v <= 1.0 for v in values):
        raise CheckpointError(
            f"{path}: by_offset must be a non-empty list of shares in [0, 1] (a draft's agreement at offsets 1, "
            f"2, ...), got {values!r}; fix or delete the file (width auto then starts from a neutral guess)"
        )
    return tuple(float(v) for v in values)
