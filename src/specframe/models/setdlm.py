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
from dataclasses import replace
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
from specframe.models.transformer import DecoderBackend, NetworkConfig, SpecialTokens
from specframe.models.weights import KeyLayout, TensorSource

FAMILY = "setdlm"
MODEL_TYPES = ("bd3lm",)
BACKBONE_CONFIG_NAME = "backbone_config.json"
MASK_TOKEN = "<|fim_middle|>"
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
PAD_TOKEN = "<|endoftext|>"
#: Qwen3's special tokens, in vocabulary order after the BPE entries (``<|endoftext|>`` is 151643 and
#: ``<|fim_middle|>`` 151660 in the released tokenizer).
SPECIAL_TOKENS = (
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
#: config.json special-id fields of a new checkpoint and the tokens whose ids they hold.
CONFIG_TOKENS = {"mask_token_id": MASK_TOKEN, "pad_token_id": PAD_TOKEN}
MASKED_LOGIT = -1e6
_DIM_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)
_IGNORED = (r"(^|\.)rotary_emb\.inv_freq$", r"(^|\.)static_attention_mask$")
#: The released (BD3LM) checkpoints' names; the layout specframe writes SetDLM checkpoints in.
LAYOUT = KeyLayout(renames=(("backbone.model.model.", "body."), ("backbone.model.lm_head.", "head.")), ignored=_IGNORED)
#: A plain Qwen3 checkpoint's names (loadable with ``family="setdlm"``).
QWEN3_LAYOUT = KeyLayout(renames=(("model.", "body."), ("lm_head.", "head.")), ignored=_IGNORED)


class SetDLM(DecoderBackend):
    """A loaded SetDLM model (see the module docstring)."""

    family = FAMILY

    @classmethod
    def read_checkpoint(cls, ckpt: Checkpoint) -> tuple[NetworkConfig, SpecialTokens, HubTokenizer | None]:
        """Network settings from the (backbone) config, the tokenizer, and special ids from either."""
        config = parse_config(ckpt.config, ckpt.folder)
        tokenizer = load_tokenizer(ckpt.folder, config.dims.vocab_size)
        where = str(ckpt.folder / "config.json")
        special = special_tokens(ckpt.config, tokenizer, where)
        ids = {"mask_token_id": special.mask, "eos_token_id": special.eos}
        check_special_ids(ids, config.dims.vocab_size, where)
        return config, special, tokenizer

    @classmethod
    def key_layout(cls, tensors: TensorSource, config: NetworkConfig, where: str) -> KeyLayout:
        """The checkpoint layout in use (BD3LM or plain Qwen3), checking a tied output layer's shape.

        Raises:
            CheckpointError: If no known layout matches, or the tied output layer has the wrong shape.
        """
        names = tensors.names()
        for layout in (LAYOUT, QWEN3_LAYOUT):
            embed = layout.to_checkpoint("body.embed_tokens.weight")
            if embed not in names:
                continue
            head = layout.to_checkpoint("head.weight")
            if not (config.tie_embeddings and head in names):
                return layout
            if tensors.shape(head) != tensors.shape(embed):
                raise CheckpointError(
                    f"{where}: tied output layer {head} has shape {list(tensors.shape(head))}, "
                    f"but the embedding {embed} has {list(tensors.shape(embed))}"
                )
            return replace(layout, ignored=(*layout.ignored, f"^{re.escape(head)}$"))
        expected = " or ".join(layout.to_checkpoint("body.embed_tokens.weight") for layout in (LAYOUT, QWEN3_LAYOUT))
        raise CheckpointError(f"{where}: no embedding found (expected {expected}); is this a SetDLM/Qwen3 checkpoint?")

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
    tied = merged.get("tie_word_embeddings", True)
    if not isinstance(tied, bool):
        fields.invalid.append(f"tie_word_embeddings={tied!r} (expected true or false)")
        fields.check()
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
    named = tuple(t for t in map(vocab, EOS_TOKENS) if t is not None)
    eos = token_ids(configured("eos_token_id"), "eos_token_id", where) + named
    pad = configured("pad_token_id")
    return SpecialTokens(mask=mask, eos=tuple(dict.fromkeys(eos)), pad=pad if pad is not None else vocab(PAD_TOKEN))


def load(ckpt: Checkpoint) -> SetDLM:
    """Load a located SetDLM checkpoint (use :func:`specframe.models.load_model`).

    Args:
        ckpt: The checkpoint's folder and config, and the device and dtype to load it on.

    Raises:
        CheckpointError: If the checkpoint is malformed or inconsistent.
    """
    return SetDLM.from_checkpoint(ckpt)


@hookimpl
def register_model_backends(register: Register) -> None:
    """Register the SetDLM family."""
    register(FAMILY, load, model_types=list(MODEL_TYPES))
