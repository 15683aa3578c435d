"""Proposal-only LoRA adapters saved in the PEFT layout, attached to attention output projections.

A PEFT adapter folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, optional
``use_rslora``) and ``adapter_model.safetensors`` (or ``.bin``) with keys
``base_model.model.<module path>.lora_A.weight`` (``[r, in]``) and ``...lora_B.weight`` (``[out, r]``).
The update ``(alpha / r) * B A x`` is added only to the rows a call marks in ``adapter_rows``; the other rows
run exactly the base weights.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from specframe.errors import CheckpointError
from specframe.models.config_json import Fields, read_json
from specframe.models.layers import LowRankUpdate
from specframe.models.transformer import DecoderNetwork
from specframe.models.weights import FiniteCheck, freeze, open_weights

SUPPORTED_TARGETS = ("o_proj",)


def adapter_scale(config: dict, where: str) -> tuple[int, float]:
    """The rank and scale (``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA) of a PEFT adapter config.

    Raises:
        CheckpointError: If fields are missing or the adapter targets modules other than ``o_proj``.
    """
    fields = Fields(config, where, "an adapter_config.json written by PEFT is expected")
    rank = fields.int("r")
    alpha = fields.float("lora_alpha")
    targets = fields.value("target_modules")
    names = [targets] if isinstance(targets, str) else list(targets or [])
    unsupported = [t for t in names if t not in SUPPORTED_TARGETS and not re.fullmatch(t, "o_proj")]
    if not names or unsupported:
        fields.invalid.append(f"target_modules={targets!r} (only {list(SUPPORTED_TARGETS)} is supported)")
    if fields.value("bias", "none") != "none":
        fields.invalid.append(f"bias={fields.value('bias')!r} (adapter biases are not supported)")
    if fields.value("rank_pattern") or fields.value("alpha_pattern"):
        fields.invalid.append("rank_pattern/alpha_pattern (per-module ranks are not supported)")
    fields.check()
    scale = alpha / math.sqrt(rank) if fields.value("use_rslora") else alpha / rank
    return rank, scale


def attach_lora(
    network: DecoderNetwork, folder: Path, *, module_prefix: str, device: torch.device, dtype: torch.dtype
) -> int:
    """Load the PEFT adapter in ``folder`` onto the attention output projections of ``network``.

    Args:
        network: The loaded base network.
        folder: The adapter folder (e.g. ``<checkpoint>/linear_spec_lora``).
        module_prefix: Path of the decoder stack inside the original model (``"encoder"`` for Nemotron).
        device: Device for the adapter weights.
        dtype: Dtype for the adapter weights.

    Returns:
        How many layers received an adapter.

    Raises:
        CheckpointError: If the adapter is missing, malformed, or does not fit the model.
    """
    if not folder.is_dir():
        raise CheckpointError(
            f"no adapter folder {folder}; this checkpoint ships no proposal-only LoRA (drop adapter=True / --adapter)"
        )
    rank, scale = adapter_scale(read_json(folder / "adapter_config.json", "adapter config"), str(folder))
    pattern = re.compile(
        rf"^base_model\.model\.{re.escape(module_prefix)}\.layers\.(\d+)\.self_attn\.o_proj\.lora_([AB])(?:\.default)?\.weight$"
    )
    found: dict[int, dict[str, str]] = {}
    layers = network.body.layers
    with open_weights(folder, stem="adapter_model") as source:
        unexpected = []
        for name in source.names():
            match = pattern.match(name)
            if not match or int(match.group(1)) >= len(layers):
                unexpected.append(name)
                continue
            found.setdefault(int(match.group(1)), {})[match.group(2)] = name
        problems = [f"unexpected tensor(s) {', '.join(unexpected[:8])}"] if unexpected else []
        for index, pair in sorted(found.items()):
            attn = layers[index].self_attn
            want = {"A": (rank, attn.o_proj.in_features), "B": (attn.o_proj.out_features, rank)}
            for half, shape in want.items():
                if half not in pair:
                    problems.append(f"layer {index} has no lora_{half}")
                elif source.shape(pair[half]) != shape:
                    problems.append(f"{pair[half]} has shape {list(source.shape(pair[half]))}, expected {list(shape)}")
        if not found:
            problems.append(f"no o_proj LoRA tensors under base_model.model.{module_prefix}.layers")
        if problems:
            raise CheckpointError(f"adapter in {folder} does not fit the model: " + "; ".join(problems))
        finite = FiniteCheck(source, f"adapter in {folder}")
        names = [name for pair in found.values() for name in pair.values()]
        loaded = {name: finite.add(name, source.load(name).to(device=device, dtype=dtype)) for name in names}
        finite.check()
        for index, pair in found.items():
            attn = layers[index].self_attn
            with torch.device("meta"):
                update = LowRankUpdate(attn.o_proj.in_features, attn.o_proj.out_features, rank, scale)
            tensors = {f"lora_{h}": loaded[n] for h, n in pair.items()}
            update.load_state_dict(tensors, strict=True, assign=True)
            freeze(update.parameters())
            attn.o_lora = update
    return len(found)
