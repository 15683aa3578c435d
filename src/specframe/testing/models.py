"""Small random checkpoints of both families in the exact Hub layout, for tests and examples.

:func:`write_random_checkpoint` writes ``config.json`` (with :func:`specframe.models.export.write_config`),
random weights under the family's tensor names (the network's ``state_dict()`` mapped by the family's key
layout; safetensors or ``.bin``, optionally sharded with an index), a ``tokenizer.json`` (a tiny byte-level
BPE trained in a fraction of a second on ``pydoc_data.topics``, with each family's special tokens at the ids
its config names) and, for Nemotron, optionally a ``linear_spec_lora/`` PEFT adapter::

    from specframe.testing.models import write_random_checkpoint

    folder = write_random_checkpoint("nemotron-labs-diffusion", tmp_path / "nemo", seed=0, lora_rank=4)
    model = load_model(folder, dtype="float64", adapter=True)
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from specframe.models import nemotron, setdlm
from specframe.models.config_json import Fields, read_dims
from specframe.models.export import merge, write_config, write_tensors
from specframe.models.layers import RopeSpec
from specframe.models.transformer import DecoderNetwork, NetworkConfig
from specframe.models.weights import KeyLayout

NEMOTRON = nemotron.FAMILY
SETDLM = setdlm.FAMILY


def write_random_checkpoint(
    family: str,
    folder: str | Path,
    *,
    seed: int = 0,
    shards: int = 1,
    weights_format: str = "safetensors",
    lora_rank: int = 0,
    lora_mlp_rank: int = 0,
    tokenizer: bool = True,
    backbone_config: str = "inline",
    logit_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    **config_overrides: Any,
) -> Path:
    """Write a small random checkpoint of ``family`` into ``folder`` (created if needed).

    Args:
        family: ``"nemotron-labs-diffusion"`` or ``"setdlm"``.
        folder: Target folder.
        seed: Seed of the random weights.
        shards: Number of weight files (more than one writes an index, as large Hub models do).
        weights_format: ``"safetensors"`` or ``"bin"`` (``pytorch_model.bin``).
        lora_rank: For Nemotron, also write a ``linear_spec_lora/`` adapter of this rank on ``o_proj`` (0: none).
        lora_mlp_rank: With ``lora_rank``, the adapter also targets ``down_proj`` with this rank (its
            ``rank_pattern``; alpha ``2 * lora_mlp_rank`` in ``alpha_pattern``); 0: ``o_proj`` only. The base
            weights and the ``o_proj`` tensors are those written without it.
        tokenizer: Write a ``tokenizer.json``.
        backbone_config: SetDLM only: where the Qwen3 sizes go (see :func:`~specframe.models.export.write_config`).
        logit_scale: Multiplies every logit the model produces (verifier and drafter alike; the argmax is
            unchanged): below 1 the sampling distributions get flatter (more distinct continuations, more
            accepted drafts under rejection sampling), above 1 sharper. It scales the final norm's weight.
        dtype: dtype of the written weights.
        **config_overrides: config.json fields to change (see :func:`~specframe.models.export.write_config`).
            For SetDLM, ``eos_token_id`` and ``bos_token_id`` go to the top level, where the loader reads
            them (:func:`~specframe.models.export.write_config` files them with the Qwen3 backbone's settings).

    Returns:
        The folder.
    """
    folder = Path(folder)
    top = {k: config_overrides.pop(k) for k in _SETDLM_TOP_IDS if family == SETDLM and k in config_overrides}
    dims = write_config(family, folder, backbone_config=backbone_config, **config_overrides)
    # Sizes only, unvalidated: tests write broken configs on purpose, and the loader is what must object.
    sizes = read_dims(Fields(dims, str(folder)), default_eps=1e-6)
    network = NetworkConfig(sizes, RopeSpec(theta=1e4), qk_norm=family == SETDLM, tie_embeddings=family == SETDLM)
    generator = torch.Generator().manual_seed(seed)
    layout = nemotron.LAYOUT if family == NEMOTRON else setdlm.LAYOUT
    tensors = random_weights(network, layout, generator)
    if logit_scale != 1.0:
        final_norm = layout.to_checkpoint("body.norm.weight")
        tensors[final_norm] = tensors[final_norm] * float(logit_scale)
    if tokenizer:
        (folder / "tokenizer.json").write_text(_tokenizer_json(family, dims["vocab_size"]), encoding="utf-8")
    if family == SETDLM:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        if "mask_token_id" not in config_overrides:
            config.update(_setdlm_special_ids(dims["vocab_size"]))
        config = merge(config, top)  # after the defaults: a given id (or None, deleting it) wins
        (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    write_tensors({k: v.to(dtype) for k, v in tensors.items()}, folder, shards=shards, weights_format=weights_format)
    if lora_rank:
        _write_lora(folder / "linear_spec_lora", dims, lora_rank, generator, lora_mlp_rank)
    return folder


def small_vocabulary(family: str, vocab_size: int) -> dict[str, int]:
    """Config fields of a tiny vocabulary: the last id is the mask token, the one before it EOS and padding.

    Nemotron's BOS stays at its published id. Use as
    ``write_random_checkpoint(family, folder, tokenizer=False, **small_vocabulary(family, 24))``.
    """
    ids = {"vocab_size": vocab_size, "mask_token_id": vocab_size - 1}
    ids |= {"eos_token_id": vocab_size - 2, "pad_token_id": vocab_size - 2}
    return ids | ({"bos_token_id": nemotron.SPECIAL_IDS["bos_token_id"]} if family == NEMOTRON else {})


#: Special ids that a SetDLM config.json holds at its top level but :func:`write_config` would file under
#: ``backbone_config`` (the Qwen3 settings have fields of these names, which the loader does not read).
_SETDLM_TOP_IDS = ("eos_token_id", "bos_token_id")


def _setdlm_special_ids(vocab_size: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(_tokenizer_json(SETDLM, vocab_size))
    ids = {name: tokenizer.token_to_id(token) for name, token in setdlm.CONFIG_TOKENS.items()}
    return {**ids, "bos_token_id": ids["pad_token_id"], "eos_token_id": tokenizer.token_to_id(setdlm.EOS_TOKENS[0])}


def random_weights(config: NetworkConfig, layout: KeyLayout, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random float32 weights for the network ``config`` describes, under the checkpoint names of ``layout``.

    The names and shapes are the network's own (its ``state_dict()`` on the meta device). Linear layers are
    scaled by ``1/sqrt(fan_in)``, an untied output layer by 3 more, and norms jittered around 1, so that
    logits are spread out enough for greedy decoding to be free of near-ties. Within each layer the two
    layer norms are drawn last, whichever order the network declares them in, so that a seed keeps giving
    the model the tests were written against.
    """
    with torch.device("meta"):
        network = DecoderNetwork(config)
    shapes = network.state_dict()
    tensors = {}
    for name in sorted(shapes, key=_draw_order):
        meta = shapes[name]
        if meta.dim() == 1:
            tensor = 1 + 0.1 * torch.randn(meta.shape, generator=generator)
        elif name.endswith("embed_tokens.weight"):
            tensor = torch.randn(meta.shape, generator=generator)
        else:
            tensor = torch.randn(meta.shape, generator=generator) / math.sqrt(meta.shape[1])
            if name.startswith("head."):
                tensor = 3 * tensor
        tensors[layout.to_checkpoint(name)] = tensor
    return tensors


def _draw_order(name: str) -> tuple[float, bool]:
    """Embedding first, then layer by layer (its layer norms last), then the final norm and the head."""
    if name.endswith("embed_tokens.weight"):
        return (-1, False)
    parts = name.split(".")
    if "layers" in parts:
        return (int(parts[parts.index("layers") + 1]), name.endswith("_layernorm.weight"))
    return (math.inf, False)


def _write_lora(
    folder: Path, dims: Mapping[str, Any], rank: int, generator: torch.Generator, mlp_rank: int = 0
) -> None:
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
    inner = dims["num_attention_heads"] * dims["head_dim"]
    tensors = {}
    for i in range(dims["num_hidden_layers"]):
        key = f"base_model.model.encoder.layers.{i}.self_attn.o_proj"
        tensors[f"{key}.lora_A.weight"] = torch.randn(rank, inner, generator=generator) / math.sqrt(inner)
        tensors[f"{key}.lora_B.weight"] = torch.randn(dims["hidden_size"], rank, generator=generator) / rank
    if mlp_rank:  # drawn after the o_proj tensors, which stay those of an o_proj-only adapter
        config |= {
            "target_modules": ["o_proj", "down_proj"],
            "rank_pattern": {"down_proj": mlp_rank},
            "alpha_pattern": {"down_proj": 2 * mlp_rank},
        }
        inner = dims["intermediate_size"]
        for i in range(dims["num_hidden_layers"]):
            key = f"base_model.model.encoder.layers.{i}.mlp.down_proj"
            tensors[f"{key}.lora_A.weight"] = torch.randn(mlp_rank, inner, generator=generator) / math.sqrt(inner)
            tensors[f"{key}.lora_B.weight"] = torch.randn(dims["hidden_size"], mlp_rank, generator=generator) / mlp_rank
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def _qwen_base_size(vocab_size: int) -> int:
    """BPE entries of a tiny Qwen-style tokenizer: the rest of the model vocabulary, less the specials."""
    base = min(vocab_size - len(setdlm.SPECIAL_TOKENS), vocab_size - vocab_size // 16)
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
        specials = [nemotron.SPECIAL_TOKENS.get(i, f"<SPECIAL_{i}>") for i in range(nemotron.RESERVED_IDS)]
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
        tokenizer.add_special_tokens(list(setdlm.SPECIAL_TOKENS))
    return tokenizer.to_str()


def _training_text() -> str:
    try:
        from pydoc_data.topics import topics

        return "".join(topics[key] for key in sorted(topics))[:200_000]
    except ImportError:  # some distributions strip pydoc_data
        return " ".join(["The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x + 1\n"] * 2000)
