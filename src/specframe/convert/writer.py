"""Writing a :class:`~specframe.convert.source.SourceModel` as a specframe model folder, atomically.

The folder is assembled in a temporary sibling and renamed into place only when every file is written, so
an error (a damaged tensor, a full disk, Ctrl-C) leaves no half-written model behind.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from specframe.convert.source import SourceModel
from specframe.errors import CheckpointError, ConfigError, OutputError
from specframe.kernels.quant import BLOCK, QUANTIZED, quantize
from specframe.models import nemotron

#: Largest weight shard written, in bytes.
SHARD_BYTES = 2 * 1024**3
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def convert(
    source: SourceModel,
    out: str | Path,
    *,
    dtype: str = "bfloat16",
    mask_token: str | None = None,
    overwrite: bool = False,
    quant: str | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> Path:
    """Write ``source`` into the folder ``out`` in its family's layout.

    Args:
        source: The AR checkpoint, read by :func:`~specframe.convert.gguf_source.read_gguf` or
            :func:`~specframe.convert.hf_source.read_transformers`.
        out: The model folder to create.
        dtype: Weight dtype of the written files (``float32``, ``bfloat16`` or ``float16``).
        mask_token: The vocabulary entry to use as the mask token; by default an unused control token.
        overwrite: Replace an existing folder.
        quant: Store the projections (attention, MLP and the output head) block-quantized, run as stored by
            specframe's CPU kernels: ``"q8_0"``, ``"q4_0"`` or ``"q4_1"`` (a source matrix already in that
            format is kept byte for byte, others are quantized from their float values), ``"keep"`` (the
            source's own Q8_0/Q4_0/Q4_1 blocks as they are, other matrices in ``dtype``), or ``None`` (every
            tensor in ``dtype``). The embedding and norms stay in ``dtype``.
        log: Receives one line per step.

    Returns:
        The written folder.

    Raises:
        ConfigError: For a bad dtype, mask token or an existing ``out`` without ``overwrite``.
        OutputError: If the folder cannot be written.
    """
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if quant is not None and quant not in (*QUANTIZED, "keep"):
        raise ConfigError(f"--quant {quant!r}: choose one of {', '.join(QUANTIZED)} or keep")
    if quant == "keep" and not source.blocks:
        raise ConfigError(
            f"--quant keep: {source.description} holds no Q8_0, Q4_0 or Q4_1 matrices to keep; "
            f"choose --quant {'/'.join(QUANTIZED)} to quantize it, or leave --quant out"
        )
    out = Path(out)
    if out.exists() and not out.is_dir():
        replaced = "; --overwrite replaces only a model folder, never a file" if overwrite else ""
        raise ConfigError(
            f"--out {out}: a file is already there, and a converted model is a folder{replaced}; choose a new "
            "folder path (or remove the file)"
        )
    if out.exists() and not overwrite:
        raise ConfigError(f"--out {out}: a folder is already there; choose a new folder or pass --overwrite")
    mask_id = choose_mask_token(source, mask_token)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as exc:  # e.g. a file where a parent folder should be, or no permission
        raise OutputError(f"cannot write the converted model to {out}: {exc}") from exc
    try:
        config = _config(source, mask_id, dtype)
        if quant is not None:
            config["specframe_conversion"]["quant"] = quant
        (staging / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        _write_weights(source, staging, _rename, DTYPES[dtype], log, quant)
        _write_tokenizer(source, staging, mask_id)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write the converted model to {out}: {exc}") from exc
        raise
    log(f"wrote {out} ({source.family}, mask token id {mask_id})")
    return out


def choose_mask_token(source: SourceModel, wanted: str | None) -> int:
    """The mask token's id: ``wanted`` looked up in the vocabulary, else the last unused control token.

    A control token counts as used when it is the BOS, EOS, padding or unknown token or appears in the chat
    template.

    Raises:
        ConfigError: If ``wanted`` is not in the vocabulary, or no control token is free.
    """
    vocab = source.tokenizer_json["model"]["vocab"]
    added = {entry["content"]: entry["id"] for entry in source.tokenizer_json.get("added_tokens", [])}
    if wanted is not None:
        found = added.get(wanted, vocab.get(wanted))
        if found is None:
            raise ConfigError(f"--mask-token {wanted!r} is not in the model's vocabulary; give one of its tokens")
        return int(found)
    names = {index: token for token, index in added.items()}
    used = {
        v for k, v in source.special.items() if k in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
    }
    template = source.chat_template or ""
    free = [i for i in source.control_tokens if i not in used and names.get(i, "\0") not in template]
    if not free:
        raise ConfigError(
            "the model has no unused control token to serve as the mask token; pass --mask-token with a token "
            "the model never needs to produce"
        )
    return max(free)


def _rename(name: str, tied: bool) -> list[str]:
    """Checkpoint names of a source tensor in the Nemotron-Labs-Diffusion layout."""
    if name == "lm_head.weight":
        return ["diffusion_head.weight"]
    renamed = "encoder." + name.removeprefix("model.")
    if name == "model.embed_tokens.weight" and tied:
        return [renamed, "diffusion_head.weight"]  # the head starts as the (tied) LM head
    return [renamed]


def _config(source: SourceModel, mask_id: int, dtype: str) -> dict[str, Any]:
    """The Nemotron-Labs-Diffusion config.json of a converted model (``qk_norm`` / ``qkv_bias``: Qwen3 / Qwen2)."""
    c = source.config
    qk_norm = {"qk_norm": True} if source.architecture == "Qwen3ForCausalLM" else {}
    qk_norm |= {"qkv_bias": True} if c.get("qkv_bias") else {}
    return {
        "architectures": ["NemotronLabsDiffusionModel"],
        "model_type": nemotron.MODEL_TYPES[0],
        **{k: c[k] for k in _DIMS},
        "hidden_act": "silu",
        "attention_bias": False,
        "sliding_window": None,
        "torch_dtype": dtype,
        "rms_norm_eps": c["rms_norm_eps"],
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": c["rope_theta"]},
        **qk_norm,
        "bos_token_id": source.special.get("bos_token_id") if source.add_bos else None,
        "eos_token_id": _eos(source),
        "pad_token_id": source.special.get("pad_token_id"),
        "mask_token_id": mask_id,
        "block_size": 32,
        "specframe_conversion": {"source": source.description, "architecture": source.architecture},
    }


_DIMS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


def _eos(source: SourceModel) -> list[int]:
    """The end ids: the source's EOS, plus the chat template's end-of-turn token where the vocabulary has one."""
    ids = [source.special["eos_token_id"]] if "eos_token_id" in source.special else []
    added = {entry["content"]: entry["id"] for entry in source.tokenizer_json.get("added_tokens", [])}
    template = source.chat_template or ""
    for token in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "</s>"):
        if token in added and token in template and added[token] not in ids:
            ids.append(added[token])
    return ids


_PROJECTION = re.compile(r"encoder\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight|diffusion_head\.weight")
"""Written tensors that are projections (what ``--quant`` stores block-quantized)."""


def _quantized(
    source: SourceModel, name: str, target: str, tensor: torch.Tensor, quant: str | None
) -> tuple[str, torch.Tensor] | None:
    """``(stored name, blocks)`` of a projection ``--quant`` stores block-quantized, or ``None`` (float)."""
    if quant is None or not _PROJECTION.fullmatch(target) or tensor.dim() != 2:
        return None
    own = source.blocks.get(name)
    kept = own() if own is not None else None
    if kept is not None and (quant == "keep" or kept[0] == quant):
        return f"{target}.{kept[0]}", kept[1].contiguous()
    if quant == "keep" or tensor.shape[1] % BLOCK:
        return None  # nothing to keep, or rows that are no whole blocks: stays float
    return f"{target}.{quant}", quantize(tensor, quant)


def _write_weights(
    source: SourceModel,
    folder: Path,
    rename: Callable[[str, bool], list[str]],
    dtype: torch.dtype,
    log: Callable,
    quant: str | None = None,
) -> None:
    tied = bool(source.config.get("tie_word_embeddings", "lm_head.weight" not in source.tensors))
    shards: list[dict[str, torch.Tensor]] = [{}]
    size, stored = 0, 0
    for count, (name, tensor) in enumerate(source.load(), start=1):
        if not torch.isfinite(tensor).all():
            raise CheckpointError(
                f"{source.description}: tensor {name} holds NaN or infinite values; the file is damaged"
            )
        for target in rename(name, tied):
            blocks = _quantized(source, name, target, tensor, quant)
            if blocks is not None:
                target, converted = blocks
                stored += 1
            else:
                converted = tensor.to(dtype).contiguous().clone()  # a tensor written twice is stored twice
            nbytes = converted.numel() * converted.element_size()
            if shards[-1] and size + nbytes > SHARD_BYTES:
                shards.append({})
                size = 0
            shards[-1][target] = converted
            size += nbytes
        if count % 50 == 0:
            log(f"  {count}/{len(source.tensors)} tensors")
    if quant is not None:
        log(f"  {stored} projection(s) stored block-quantized ({quant})")
    if len(shards) == 1:
        save_file(shards[0], str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, start=1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / filename), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, filename))
        total += sum(t.numel() * t.element_size() for t in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")


def _write_tokenizer(source: SourceModel, folder: Path, mask_id: int) -> None:
    (folder / "tokenizer.json").write_text(json.dumps(source.tokenizer_json, ensure_ascii=False), encoding="utf-8")
    names = {entry["id"]: entry["content"] for entry in source.tokenizer_json.get("added_tokens", [])}
    vocab_names = {i: t for t, i in source.tokenizer_json["model"]["vocab"].items()}

    def text(key: str) -> str | None:
        index = source.special.get(key)
        return None if index is None else names.get(index, vocab_names.get(index))

    settings: dict[str, Any] = {
        "bos_token": text("bos_token_id"),
        "eos_token": text("eos_token_id"),
        "pad_token": text("pad_token_id"),
        "unk_token": text("unk_token_id"),
        "mask_token": names.get(mask_id, vocab_names.get(mask_id)),
        "model_max_length": source.config["max_position_embeddings"],
    }
    if source.chat_template:
        settings["chat_template"] = source.chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False), encoding="utf-8")
