"""Writing checkpoints in a family's Hub layout: ``config.json`` and the weights under the checkpoint's names.

The trainer exports its networks with these functions and the test support writes its random checkpoints
with them, so both write exactly what :func:`specframe.models.load_model` reads::

    config = write_config("setdlm", folder, vocab_size=1024, hidden_size=128, mask_token_id=1000)
    write_tensors(checkpoint_tensors(network, setdlm.LAYOUT, torch.bfloat16), folder)

Tensor names are never listed here: they are the network's own ``state_dict()`` names, mapped by the family's
:class:`~specframe.models.weights.KeyLayout` (``nemotron.LAYOUT``, ``setdlm.LAYOUT``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from specframe.models import nemotron, setdlm
from specframe.models.weights import KeyLayout

#: Sizes of a new checkpoint unless overridden (a tiny model; the trainer sets its own).
DEFAULT_DIMS: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # differs from hidden / heads, as in Nemotron-Labs-Diffusion-3B and Qwen3
    "hidden_act": "silu",
    "attention_bias": False,
    "sliding_window": None,
    "max_position_embeddings": 256,
    "torch_dtype": "float32",
}

#: A Nemotron-Labs-Diffusion config.json with the published field names and special ids.
NEMOTRON_CONFIG: dict[str, Any] = {
    "architectures": ["NemotronLabsDiffusionModel"],
    "model_type": nemotron.MODEL_TYPES[0],
    **DEFAULT_DIMS,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    },
    **nemotron.SPECIAL_IDS,
    "block_size": 32,
}

#: The Qwen3 backbone settings of a SetDLM checkpoint (``backbone_config``).
QWEN3_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    **DEFAULT_DIMS,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "rope_theta": 1000000.0,
    "bos_token_id": None,
    "eos_token_id": None,
}


def write_config(
    family: str, folder: str | Path, *, backbone_config: str = "inline", **overrides: Any
) -> dict[str, Any]:
    """Write the ``config.json`` of a new checkpoint of ``family`` into ``folder`` (created if needed).

    Args:
        family: ``"nemotron-labs-diffusion"`` or ``"setdlm"``.
        folder: The checkpoint folder.
        backbone_config: SetDLM only: ``"inline"`` puts the Qwen3 sizes into ``backbone_config``, ``"file"``
            into ``backbone_config.json`` next to config.json, ``"none"`` leaves them out (only the backbone's
            name remains, as in a config that defers to the Hub).
        **overrides: Fields to change (``None`` deletes a field). For Nemotron a ``rope_parameters`` dict is
            merged into the default one; for SetDLM, Qwen3 fields go to the backbone settings and the others
            to the top level.

    Returns:
        The network's settings: the config for Nemotron, the Qwen3 backbone settings for SetDLM (whatever
        ``backbone_config`` says, so that the caller knows the sizes).

    Raises:
        ValueError: For an unknown family or ``backbone_config`` mode.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if family == nemotron.FAMILY:
        config = dims = merge(NEMOTRON_CONFIG, overrides)
    elif family == setdlm.FAMILY:
        dims = merge(QWEN3_CONFIG, {k: v for k, v in overrides.items() if k in QWEN3_CONFIG})
        top = {k: v for k, v in overrides.items() if k not in QWEN3_CONFIG}
        config = _setdlm_config(dims, top, folder, backbone_config)
    else:
        raise ValueError(f"unknown family {family!r}; use {nemotron.FAMILY!r} or {setdlm.FAMILY!r}")
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return dims


def merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` updated by ``overrides``, recursively for mappings; an override of ``None`` deletes."""
    merged = copy.deepcopy(dict(defaults))
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _setdlm_config(backbone: dict[str, Any], top: dict[str, Any], folder: Path, mode: str) -> dict[str, Any]:
    nested: dict[str, Any] = {
        "_target_": "src.backbone.automodel.AutoModelFromPreTrained",
        "automodel_cls": "AutoModelForCausalLM",
        "pretrained_model_name_or_path": "Qwen/Qwen3-1.7B-Base",
        "trust_remote_code": True,
    }
    if mode == "inline":
        nested.update(backbone)
    elif mode == "file":
        (folder / setdlm.BACKBONE_CONFIG_NAME).write_text(json.dumps(backbone, indent=2), encoding="utf-8")
    elif mode != "none":
        raise ValueError(f"backbone_config must be 'inline', 'file' or 'none', not {mode!r}")
    config = {
        "architectures": ["SetDLM"],
        "model_type": setdlm.MODEL_TYPES[0],
        "backbone_config": nested,
        "noise_config": {"_target_": "src.noise_schedule.noise_schedules.LinearNoise"},
        "length": 1024,
        "torch_dtype": "float32",
    }
    return merge(config, top)


def checkpoint_tensors(
    network: nn.Module, layout: KeyLayout, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The network's weights under the checkpoint names ``layout`` gives them (in ``dtype``, if given)."""
    return {
        layout.to_checkpoint(name): tensor.detach().to(dtype or tensor.dtype)
        for name, tensor in network.state_dict().items()
    }


def write_tensors(
    tensors: Mapping[str, torch.Tensor],
    folder: Path,
    *,
    shards: int = 1,
    weights_format: str = "safetensors",
    stem: str = "model",
) -> None:
    """Save tensors in the Hub layout: one file, or ``shards`` files plus a ``*.index.json``.

    Raises:
        ValueError: If ``weights_format`` is neither ``"safetensors"`` nor ``"bin"``.
    """
    if weights_format not in ("safetensors", "bin"):
        raise ValueError(f"weights_format must be 'safetensors' or 'bin', not {weights_format!r}")
    ext = weights_format
    stem = ("pytorch_model" if stem == "model" else stem) if ext == "bin" else stem
    names = list(tensors)
    groups = [names[i::shards] for i in range(shards)] if shards > 1 else [names]
    weight_map = {}
    for number, group in enumerate(groups, start=1):
        filename = f"{stem}.{ext}" if shards == 1 else f"{stem}-{number:05d}-of-{shards:05d}.{ext}"
        part = {name: tensors[name].contiguous() for name in group}
        if ext == "safetensors":
            save_file(part, str(folder / filename), metadata={"format": "pt"})
        else:
            torch.save(part, folder / filename)
        weight_map.update(dict.fromkeys(group, filename))
    if shards > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / f"{stem}.{ext}.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
