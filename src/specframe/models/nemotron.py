"""Nemotron-Labs-Diffusion: a Ministral-3 decoder with an untied ``diffusion_head`` serving both modes.

AR (causal) rows predict the token after their position; MASK rows under a bidirectional mask predict the
token at their own position. The architecture is plain Ministral-3: pre-norm RMSNorm, grouped-query
attention without biases or qk-norm, YaRN RoPE, Llama-4 query scaling after RoPE, SwiGLU MLP. An optional
proposal-only LoRA on ``o_proj`` (subfolder ``linear_spec_lora/``) applies to drafting rows only.

Models converted from AR checkpoints (``specframe convert``) use the same layout with plain RoPE; one
converted from Qwen3 sets ``qk_norm: true`` (per-head RMSNorm of queries and keys, Qwen3's block), one
converted from Qwen2 ``qkv_bias: true`` (biases on the query, key and value projections, Qwen2's block:
``encoder.layers.{i}.self_attn.{q,k,v}_proj.bias``), fields the published configs do not have. Such a
checkpoint may declare its drafter adapter in ``specframe_drafter`` (see
:func:`specframe.models.loading.load_model`).

Checkpoint keys: ``encoder.embed_tokens.weight``, ``encoder.layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``encoder.layers.{i}.mlp.{gate,up,down}_proj.weight``, ``encoder.layers.{i}.{input,post_attention}_layernorm
.weight``, ``encoder.norm.weight``, ``diffusion_head.weight`` (:data:`LAYOUT` maps them to the network's
names, both ways). Special ids always come from config.json; :data:`SPECIAL_IDS` are the published
checkpoints' (tekken) ids, which new checkpoints written by specframe use too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specframe.hookspecs import Register, hookimpl
from specframe.models.config_json import (
    Fields,
    check_special_ids,
    finite_number,
    read_dims,
    read_rope,
    rope_parameters,
    token_ids,
)
from specframe.models.hub import ADAPTER_FOLDER
from specframe.models.loading import Checkpoint
from specframe.models.lora import attach_lora, read_acceptance
from specframe.models.tokenizer import HubTokenizer, load_tokenizer
from specframe.models.transformer import DecoderBackend, NetworkConfig, SpecialTokens
from specframe.models.weights import KeyLayout, TensorSource

FAMILY = "nemotron-labs-diffusion"
MODEL_TYPES = ("nemotron_labs_diffusion",)
LAYOUT = KeyLayout(renames=(("encoder.", "body."), ("diffusion_head.", "head.")))

#: The special tokens at the start of the family's (tekken) vocabulary, by id, and the size of that block.
SPECIAL_TOKENS = {0: "<unk>", 1: "<s>", 2: "</s>", 11: "<|im_end|>", 100: "[MASK]"}
RESERVED_IDS = 128
#: The config.json special ids of the published checkpoints (``<s>``, ``<|im_end|>``, ``[MASK]``).
SPECIAL_IDS = {"bos_token_id": 1, "eos_token_id": 11, "mask_token_id": 100, "pad_token_id": 11}


class NemotronLabsDiffusion(DecoderBackend):
    """A loaded Nemotron-Labs-Diffusion model (see the module docstring)."""

    family = FAMILY

    @classmethod
    def read_checkpoint(cls, ckpt: Checkpoint) -> tuple[NetworkConfig, SpecialTokens, HubTokenizer | None]:
        """Network settings and special ids from config.json, and the tokenizer."""
        config, special = parse_config(ckpt.config, str(ckpt.folder / "config.json"))
        return config, special, load_tokenizer(ckpt.folder, config.dims.vocab_size)

    @classmethod
    def key_layout(cls, tensors: TensorSource, config: NetworkConfig, where: str) -> KeyLayout:
        """The one layout of the family's checkpoints (:data:`LAYOUT`)."""
        return LAYOUT


def parse_config(raw: dict[str, Any], where: str) -> tuple[NetworkConfig, SpecialTokens]:
    """Network settings and special ids from a Nemotron-Labs-Diffusion ``config.json``.

    Raises:
        CheckpointError: Naming every missing or unsupported field.
    """
    fields = Fields(raw, where, "use the config.json published with the checkpoint")
    dims = read_dims(fields, default_eps=1e-5)
    rope = read_rope(fields, dims.max_positions)
    fields.expect("tie_word_embeddings", (False,), "Nemotron-Labs-Diffusion has an untied diffusion_head")
    mask = fields.int("mask_token_id", minimum=0)
    # not in the published configs: models converted from Qwen3 set qk_norm, those from Qwen2 qkv_bias
    switches = {name: raw.get(name, False) for name in ("qk_norm", "qkv_bias")}
    for name, value in switches.items():
        if not isinstance(value, bool):
            fields.invalid.append(f"{name}={value!r} (expected true or false)")
    params = rope_parameters(raw)
    beta = params.get("llama_4_scaling_beta") or 0.0
    if not finite_number(beta):
        fields.invalid.append(f"rope llama_4_scaling_beta={beta!r} (expected a finite number)")
        beta = 0.0
    fields.check()
    eos = token_ids(raw.get("eos_token_id"), "eos_token_id", where)
    bos, pad = raw.get("bos_token_id"), raw.get("pad_token_id")
    check_special_ids({"mask_token_id": mask, "eos_token_id": eos, "bos_token_id": bos}, dims.vocab_size, where)
    config = NetworkConfig(
        dims=dims,
        rope=rope,
        qk_norm=switches["qk_norm"] is True,
        qkv_bias=switches["qkv_bias"] is True,
        query_scale_beta=float(beta),
        query_scale_length=int(params.get("original_max_position_embeddings") or dims.max_positions),
    )
    return config, SpecialTokens(mask=mask, eos=eos, bos=bos, pad=pad)


def load(ckpt: Checkpoint, *, adapter: bool | str | os.PathLike[str] = False) -> NemotronLabsDiffusion:
    """Load a located Nemotron-Labs-Diffusion checkpoint (use :func:`specframe.models.load_model`).

    Args:
        ckpt: The checkpoint's folder and config, and the device and dtype to load it on.
        adapter: Load the proposal-only LoRA: ``True`` for ``linear_spec_lora/``, or an adapter folder.

    Raises:
        CheckpointError: If the checkpoint is malformed or inconsistent.
    """
    model = NemotronLabsDiffusion.from_checkpoint(ckpt)
    if adapter is not False:
        folder = ckpt.folder / ADAPTER_FOLDER if adapter is True else Path(adapter)
        attach_lora(model.network, folder, module_prefix="encoder", device=ckpt.device, dtype=ckpt.dtype)
        model.has_adapter = True
        model.drafter_acceptance = read_acceptance(folder)
    return model


@hookimpl
def register_model_backends(register: Register) -> None:
    """Register the Nemotron-Labs-Diffusion family."""
    register(FAMILY, load, model_types=list(MODEL_TYPES))
