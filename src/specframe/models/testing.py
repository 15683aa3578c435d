"""Small random checkpoints of both families in the exact Hub layout, for tests and examples.

:func:`write_random_checkpoint` writes ``config.json`` (the real field names), the weights under the real
tensor names (safetensors or ``.bin``, optionally sharded with an index), a ``tokenizer.json`` (a tiny
byte-level BPE trained in a fraction of a second on ``pydoc_data.topics``, with each family's special
tokens at the ids its config names) and, for Nemotron, optionally a ``linear_spec_lora/`` PEFT adapter::

    from specframe.models.testing import write_random_checkpoint

    folder = write_random_checkpoint("nemotron-labs-diffusion", tmp_path / "nemo", seed=0, lora_rank=4)
    model = load_model(folder, dtype="float64", adapter=True)
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

NEMOTRON = "nemotron-labs-diffusion"
SETDLM = "setdlm"

TINY_DIMS: dict[str, Any] = {
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

NEMOTRON_CONFIG: dict[str, Any] = {
    "architectures": ["NemotronLabsDiffusionModel"],
    "model_type": "nemotron_labs_diffusion",
    **TINY_DIMS,
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
    "bos_token_id": 1,
    "eos_token_id": 11,
    "mask_token_id": 100,
    "pad_token_id": 11,
    "block_size": 32,
}

QWEN3_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    **TINY_DIMS,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "rope_theta": 1000000.0,
    "bos_token_id": None,
    "eos_token_id": None,
}

# Qwen3's special tokens in vocabulary order (<|endoftext|> is 151643, <|fim_middle|> 151660 in the real one).
QWEN_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
NEMOTRON_SPECIALS = {0: "<unk>", 1: "<s>", 2: "</s>", 11: "<|im_end|>", 100: "[MASK]"}
NEMOTRON_RESERVED = 128  # like tekken, a block of special ids before the byte-level vocabulary


def write_random_checkpoint(
    family: str,
    folder: str | Path,
    *,
    seed: int = 0,
    shards: int = 1,
    weights_format: str = "safetensors",
    lora_rank: int = 0,
    tokenizer: bool = True,
    backbone_config: str = "inline",
    logit_scale: float = 1.0,
    **config_overrides: Any,
) -> Path:
    """Write a small random checkpoint of ``family`` into ``folder`` (created if needed).

    Args:
        family: ``"nemotron-labs-diffusion"`` or ``"setdlm"``.
        folder: Target folder.
        seed: Seed of the random weights.
        shards: Number of weight files (more than one writes an index, as large Hub models do).
        weights_format: ``"safetensors"`` or ``"bin"`` (``pytorch_model.bin``).
        lora_rank: For Nemotron, also write a ``linear_spec_lora/`` adapter of this rank (0: none).
        tokenizer: Write a ``tokenizer.json``.
        backbone_config: SetDLM only: ``"inline"`` puts the Qwen3 sizes into ``backbone_config``, ``"file"``
            into ``backbone_config.json`` next to config.json, ``"none"`` leaves them out (only the backbone's
            name remains, as in a config that defers to the Hub).
        logit_scale: Multiplies every logit the model produces (verifier and drafter alike; the argmax is
            unchanged): below 1 the sampling distributions get flatter (more distinct continuations, more
            accepted drafts under rejection sampling), above 1 sharper. It scales the final norm's weight.
        **config_overrides: config.json fields to change (``None`` deletes a field). For Nemotron a
            ``rope_parameters`` dict is merged into the default one; for SetDLM, Qwen3 fields go to the
            backbone settings and the others to the top level.

    Returns:
        The folder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if family == NEMOTRON:
        config = _merge(NEMOTRON_CONFIG, config_overrides)
        dims = config
        prefix, head = "encoder.", "diffusion_head.weight"
    elif family == SETDLM:
        backbone = _merge(QWEN3_CONFIG, {k: v for k, v in config_overrides.items() if k in QWEN3_CONFIG})
        top = {k: v for k, v in config_overrides.items() if k not in QWEN3_CONFIG}
        config = _setdlm_config(backbone, top, folder, backbone_config)
        dims = backbone
        prefix, head = "backbone.model.model.", None
    else:
        raise ValueError(f"unknown family {family!r}; use {NEMOTRON!r} or {SETDLM!r}")
    generator = torch.Generator().manual_seed(seed)
    tensors = random_weights(dims, prefix, head, qk_norm=family == SETDLM, generator=generator)
    if logit_scale != 1.0:
        tensors[f"{prefix}norm.weight"] = tensors[f"{prefix}norm.weight"] * float(logit_scale)
    if tokenizer:
        (folder / "tokenizer.json").write_text(_tokenizer_json(family, dims["vocab_size"]), encoding="utf-8")
    if family == SETDLM and "mask_token_id" not in config_overrides:
        config.update(_setdlm_special_ids(dims["vocab_size"]))
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    write_tensors(tensors, folder, shards=shards, weights_format=weights_format)
    if lora_rank:
        _write_lora(folder / "linear_spec_lora", dims, lora_rank, generator)
    return folder


def _merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(defaults))
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
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
        (folder / "backbone_config.json").write_text(json.dumps(backbone, indent=2), encoding="utf-8")
    elif mode != "none":
        raise ValueError(f"backbone_config must be 'inline', 'file' or 'none', not {mode!r}")
    config = {
        "architectures": ["SetDLM"],
        "model_type": "bd3lm",
        "backbone_config": nested,
        "noise_config": {"_target_": "src.noise_schedule.noise_schedules.LinearNoise"},
        "length": 1024,
        "torch_dtype": "float32",
    }
    return _merge(config, top)


def _setdlm_special_ids(vocab_size: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(_tokenizer_json(SETDLM, vocab_size))
    endoftext = tokenizer.token_to_id("<|endoftext|>")
    return {
        "mask_token_id": tokenizer.token_to_id("<|fim_middle|>"),
        "pad_token_id": endoftext,
        "bos_token_id": endoftext,
        "eos_token_id": tokenizer.token_to_id("<|im_end|>"),
    }


def random_weights(
    dims: Mapping[str, Any], prefix: str, head: str | None, *, qk_norm: bool, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Random float32 weights of a Llama-style decoder under Hub tensor names.

    Linear layers are scaled by ``1/sqrt(fan_in)`` and norms jittered around 1, so that logits are spread
    out enough for greedy decoding to be free of near-ties.
    """
    hidden, inter, vocab = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    heads, kv, head_dim = dims["num_attention_heads"], dims["num_key_value_heads"], dims["head_dim"]

    def linear(out: int, inp: int) -> torch.Tensor:
        return torch.randn(out, inp, generator=generator) / math.sqrt(inp)

    def norm(size: int) -> torch.Tensor:
        return 1 + 0.1 * torch.randn(size, generator=generator)

    tensors = {f"{prefix}embed_tokens.weight": torch.randn(vocab, hidden, generator=generator)}
    for i in range(dims["num_hidden_layers"]):
        layer = f"{prefix}layers.{i}."
        tensors[layer + "self_attn.q_proj.weight"] = linear(heads * head_dim, hidden)
        tensors[layer + "self_attn.k_proj.weight"] = linear(kv * head_dim, hidden)
        tensors[layer + "self_attn.v_proj.weight"] = linear(kv * head_dim, hidden)
        tensors[layer + "self_attn.o_proj.weight"] = linear(hidden, heads * head_dim)
        if qk_norm:
            tensors[layer + "self_attn.q_norm.weight"] = norm(head_dim)
            tensors[layer + "self_attn.k_norm.weight"] = norm(head_dim)
        tensors[layer + "mlp.gate_proj.weight"] = linear(inter, hidden)
        tensors[layer + "mlp.up_proj.weight"] = linear(inter, hidden)
        tensors[layer + "mlp.down_proj.weight"] = linear(hidden, inter)
        tensors[layer + "input_layernorm.weight"] = norm(hidden)
        tensors[layer + "post_attention_layernorm.weight"] = norm(hidden)
    tensors[f"{prefix}norm.weight"] = norm(hidden)
    if head is not None:
        tensors[head] = 3 * linear(vocab, hidden)
    return tensors


def write_tensors(
    tensors: Mapping[str, torch.Tensor],
    folder: Path,
    *,
    shards: int = 1,
    weights_format: str = "safetensors",
    stem: str = "model",
) -> None:
    """Save tensors in the Hub layout: one file, or ``shards`` files plus a ``*.index.json``."""
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


def _write_lora(folder: Path, dims: Mapping[str, Any], rank: int, generator: torch.Generator) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "r": rank,
        "lora_alpha": 4 * rank,
        "lora_dropout": 0.0,
        "target_modules": ["o_proj"],
        "bias": "none",
        "base_model_name_or_path": "nvidia/Nemotron-Labs-Diffusion-8B",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    inner = dims["num_attention_heads"] * dims["head_dim"]
    tensors = {}
    for i in range(dims["num_hidden_layers"]):
        key = f"base_model.model.encoder.layers.{i}.self_attn.o_proj"
        tensors[f"{key}.lora_A.weight"] = torch.randn(rank, inner, generator=generator) / math.sqrt(inner)
        tensors[f"{key}.lora_B.weight"] = torch.randn(dims["hidden_size"], rank, generator=generator) / rank
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def _qwen_base_size(vocab_size: int) -> int:
    """BPE entries of a tiny Qwen-style tokenizer: the rest of the model vocabulary, less the specials."""
    base = min(vocab_size - len(QWEN_SPECIALS), vocab_size - vocab_size // 16)
    if base < 300:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level tokenizer with specials")
    return base


@functools.lru_cache(maxsize=8)
def _tokenizer_json(family: str, vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if family == NEMOTRON:
        specials = [NEMOTRON_SPECIALS.get(i, f"<SPECIAL_{i}>") for i in range(NEMOTRON_RESERVED)]
        size = vocab_size
    else:
        specials, size = [], _qwen_base_size(vocab_size)
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_training_text()], trainer)
    if family == SETDLM:
        tokenizer.add_special_tokens(list(QWEN_SPECIALS))
    return tokenizer.to_str()


def _training_text() -> str:
    try:
        from pydoc_data.topics import topics

        return "".join(topics[key] for key in sorted(topics))[:200_000]
    except ImportError:  # some distributions strip pydoc_data
        return " ".join(["The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x + 1\n"] * 2000)
