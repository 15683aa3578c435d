"""SetDLM (Set Diffusion): a Qwen3 decoder trained for any-order, set-wise masked prediction.

Every row is position-aligned: a MASK row with position id ``p`` predicts the token at ``p`` (no shift). The
mask-token logit is pushed to a very large negative value in every returned row, as SetDLM does.

Released checkpoints are whole BD3LM "denoisers" (``model_type "bd3lm"``): the Qwen3 backbone's weights sit
under ``backbone.model.model.*`` (``backbone.model.lm_head.weight`` is tied to the embedding), and its sizes
sit in the nested ``backbone_config`` -- or, when that only names the backbone, in the backbone's own
config.json, which may be supplied as ``backbone_config.json`` next to config.json (else it is fetched from
the Hub by the name in ``backbone_config.pretrained_model_name_or_path``). A plain Qwen3 layout (``model.*``,
``model_type "qwen3"``) loads too when the family is requested explicitly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from specframe.errors import CheckpointError
from specframe.hookspecs import Register, hookimpl
from specframe.models.config_json import (
    Fields,
    check_special_ids,
    read_dims,
    read_json,
    read_rope,
    token_ids,
)
from specframe.models.hub import download
from specframe.models.loading import Checkpoint
from specframe.models.tokenizer import HubTokenizer, load_tokenizer
from specframe.models.transformer import DecoderBackend, NetworkConfig, SpecialTokens, build_network
from specframe.models.weights import KeyLayout, TensorSource, open_weights

FAMILY = "setdlm"
MODEL_TYPES = ("bd3lm",)
BACKBONE_CONFIG_NAME = "backbone_config.json"
MASK_TOKEN = "<|fim_middle|>"
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
PAD_TOKEN = "<|endoftext|>"
MASKED_LOGIT = -1e6
_DIM_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)
_LAYOUTS = (  # (backbone prefix, output-layer prefix)
    ("backbone.model.model.", "backbone.model.lm_head."),
    ("model.", "lm_head."),
)
_IGNORED = (r"(^|\.)rotary_emb\.inv_freq$", r"(^|\.)static_attention_mask$")


class SetDLM(DecoderBackend):
    """A loaded SetDLM model (see the module docstring)."""

    family = FAMILY

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Suppress the mask token in every row."""
        logits[:, self.mask_token_id] = MASKED_LOGIT
        return logits


def backbone_fields(raw: Mapping[str, Any], folder: Path) -> tuple[dict[str, Any], str, str]:
    """The Qwen3 settings of a checkpoint, where they came from, and why a fallback failed (if it did).

    ``bd3lm`` configs nest them in ``backbone_config``; missing sizes come from ``backbone_config.json`` next
    to config.json, else from the config.json of the backbone the nested config names. Other configs (plain
    Qwen3) hold them at the top level.
    """
    nested = raw.get("backbone_config")
    if raw.get("model_type") != "bd3lm" and not isinstance(nested, Mapping):
        return dict(raw), str(folder / "config.json"), ""
    if not isinstance(nested, Mapping):
        raise CheckpointError(f"{folder / 'config.json'}: a bd3lm config needs a 'backbone_config' object")
    merged: dict[str, Any] = {}
    origin = [f"{folder / 'config.json'} (backbone_config)"]
    failure = ""
    extra_path = folder / BACKBONE_CONFIG_NAME
    if extra_path.is_file():
        merged.update(read_json(extra_path, "backbone config"))
        origin.append(str(extra_path))
    elif not all(name in nested for name in _DIM_FIELDS):
        name = nested.get("pretrained_model_name_or_path")
        try:
            path = _backbone_config_path(name)
            merged.update(read_json(path, "backbone config"))
            origin.append(str(path))
        except CheckpointError as exc:
            failure = f" (the config of the backbone named in backbone_config is unavailable too: {exc})"
    merged.update(nested)
    keep = nested.get("keep_bottom_n_layers")
    if isinstance(keep, int) and not isinstance(keep, bool) and keep > 0:
        merged["num_hidden_layers"] = keep
    return merged, " + ".join(origin), failure


def _backbone_config_path(name: object) -> Path:
    if not isinstance(name, str) or not name:
        raise CheckpointError("backbone_config has no pretrained_model_name_or_path")
    local = Path(name).expanduser() / "config.json"
    if local.is_file():
        return local
    return download(name, revision=None, patterns=[], filename="config.json")


def parse_config(raw: Mapping[str, Any], folder: Path) -> NetworkConfig:
    """Network settings of a SetDLM checkpoint.

    Raises:
        CheckpointError: Naming every missing field and where it may be supplied.
    """
    merged, origin, failure = backbone_fields(raw, folder)
    hint = (
        f"the Qwen3 backbone's sizes are needed: put the backbone's config.json next to config.json as "
        f"{BACKBONE_CONFIG_NAME}, or write the fields into backbone_config{failure}"
    )
    fields = Fields(merged, origin, hint)
    dims = read_dims(fields, default_eps=1e-6)
    rope = read_rope(fields, dims.max_positions)
    fields.check()
    tied = bool(merged.get("tie_word_embeddings", True))
    return NetworkConfig(dims=dims, rope=rope, qk_norm=True, tie_embeddings=tied)


def special_tokens(raw: Mapping[str, Any], tokenizer: HubTokenizer | None, where: str) -> SpecialTokens:
    """Mask, end and padding ids: from the config when present, else from the tokenizer's special tokens.

    Raises:
        CheckpointError: If no mask token id can be found.
    """
    sources = [raw, raw.get("tokenization_config") or {}]

    def configured(name: str) -> Any:
        return next((s[name] for s in sources if isinstance(s, Mapping) and s.get(name) is not None), None)

    def vocab(token: str) -> int | None:
        return tokenizer.token_to_id(token) if tokenizer is not None else None

    mask = configured("mask_token_id")
    mask = mask if mask is not None else vocab(MASK_TOKEN)
    if mask is None:
        raise CheckpointError(
            f"{where}: no mask token id: config.json has no mask_token_id and there is no tokenizer.json with "
            f"{MASK_TOKEN}; add mask_token_id to config.json"
        )
    eos = token_ids(configured("eos_token_id")) + tuple(t for t in map(vocab, EOS_TOKENS) if t is not None)
    pad = configured("pad_token_id")
    return SpecialTokens(mask=mask, eos=tuple(dict.fromkeys(eos)), pad=pad if pad is not None else vocab(PAD_TOKEN))


def key_layout(source: TensorSource, config: NetworkConfig, where: str) -> KeyLayout:
    """The checkpoint layout in use (BD3LM or plain Qwen3), checking a tied output layer's shape.

    Raises:
        CheckpointError: If no known layout matches, or the tied output layer has the wrong shape.
    """
    names = source.names()
    for body, head in _LAYOUTS:
        embed = f"{body}embed_tokens.weight"
        if embed not in names:
            continue
        ignored = _IGNORED
        head_name = f"{head}weight"
        if config.tie_embeddings and head_name in names:
            if source.shape(head_name) != source.shape(embed):
                raise CheckpointError(
                    f"{where}: tied output layer {head_name} has shape {list(source.shape(head_name))}, "
                    f"but the embedding {embed} has {list(source.shape(embed))}"
                )
            ignored = (*_IGNORED, f"^{re.escape(head_name)}$")
        return KeyLayout(renames=((body, "body."), (head, "head.")), ignored=ignored)
    expected = " or ".join(f"{body}embed_tokens.weight" for body, _ in _LAYOUTS)
    raise CheckpointError(f"{where}: no embedding found (expected {expected}); is this a SetDLM/Qwen3 checkpoint?")


def load(ckpt: Checkpoint) -> SetDLM:
    """Load a located SetDLM checkpoint (use :func:`specframe.models.load_model`).

    Args:
        ckpt: The checkpoint's folder and config, and the device and dtype to load it on.

    Raises:
        CheckpointError: If the checkpoint is malformed or inconsistent.
    """
    config = parse_config(ckpt.config, ckpt.folder)
    tokenizer = load_tokenizer(ckpt.folder, config.dims.vocab_size)
    special = special_tokens(ckpt.config, tokenizer, ckpt.where)
    check_special_ids({"mask_token_id": special.mask, "eos_token_id": special.eos}, config.dims.vocab_size, ckpt.where)
    with open_weights(ckpt.folder) as tensors:
        network = build_network(config, tensors, key_layout(tensors, config, ckpt.where), ckpt)
    return SetDLM(network, special, tokenizer, ckpt)


@hookimpl
def register_model_backends(register: Register) -> None:
    """Register the SetDLM family."""
    register(FAMILY, load, model_types=list(MODEL_TYPES))
