"""Reading a transformers checkpoint (a local folder or a Hub repo id) into a ``SourceModel``.

Supported: ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM`` (Qwen2 and Qwen2.5, whose query,
key and value projections have biases) and ``Qwen3ForCausalLM`` with safetensors weights (one file or shards
with an index), a ``tokenizer.json``, and the chat template from ``chat_template.jinja`` or
``tokenizer_config.json``. Refused, each by name: RoPE scaling, partial rotary embeddings
(``partial_rotary_factor`` < 1), biases other than Qwen2's q/k/v ones (``attention_bias``, ``mlp_bias``) and
activations other than SiLU. A sliding window (Mistral's, or Qwen's with ``use_sliding_window``) caps the
converted model's context at the window, where full attention is the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specframe.convert.source import ARCHITECTURES, SourceModel
from specframe.errors import CheckpointError
from specframe.models.chat import read_chat_template
from specframe.models.config_json import partial_rotary_problem, read_json
from specframe.models.weights import open_weights


def read_transformers(source: str | Path, *, revision: str | None = None) -> SourceModel:
    """Read a transformers checkpoint folder, or download a Hub repo id's files first.

    Raises:
        CheckpointError: For a missing folder or file, an unsupported architecture or setting (each named).
    """
    from specframe.models.hub import resolve_source

    if Path(source).expanduser().is_file():
        raise CheckpointError(f"{source} is a file: give a .gguf file or a transformers checkpoint folder")
    folder = resolve_source(source, revision=revision)
    where = str(folder / "config.json")
    raw = read_json(folder / "config.json", "model config")
    architecture = (raw.get("architectures") or [None])[0]
    if architecture not in ARCHITECTURES:
        raise CheckpointError(
            f"{where}: architecture {architecture!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
        )
    config = _network_config(raw, architecture, where)
    if not (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").is_file():
        raise CheckpointError(f"{folder}: no safetensors weights (model.safetensors or an index of shards)")
    tensors = _tensor_loaders(folder, raw, where)
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    config["qkv_bias"] = architecture == "Qwen2ForCausalLM"
    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise CheckpointError(f"{folder}: no tokenizer.json; the converted model needs the source's tokenizer")
    try:
        tokenizer = json.loads(tokenizer_path.read_text(encoding="utf-8"))
        added = tokenizer.get("added_tokens", [])
        tokenizer["model"]["vocab"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{tokenizer_path} is not a tokenizer.json document ({exc})") from exc
    special = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = raw.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int) and not isinstance(value, bool):
            special[key] = value
    prompt_bos = _prompt_bos(folder, tokenizer, special.get("bos_token_id"))
    if prompt_bos is not None:
        special["bos_token_id"] = prompt_bos
    model = SourceModel(
        architecture=architecture,
        config=config,
        tensors=tensors,
        tokenizer_json=tokenizer,
        chat_template=read_chat_template(folder),
        special=special,
        control_tokens=[int(a["id"]) for a in added if a.get("special")],
        add_bos=prompt_bos is not None,
        description=str(source),
    )
    model.check_biases()
    return model


def _prompt_bos(folder: Path, tokenizer: dict[str, Any], bos: int | None) -> int | None:
    """The id the source's tokenizer puts before a prompt, if any.

    tokenizer_config.json's ``add_bos_token`` decides where it is given; otherwise the first special token of
    tokenizer.json's post-processor template, if the template starts with one.
    """
    try:
        settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        settings = {}
    if isinstance(settings, dict) and isinstance(settings.get("add_bos_token"), bool):
        return bos if settings["add_bos_token"] else None
    processors = [tokenizer.get("post_processor")]
    while processors:
        processor = processors.pop()
        if not isinstance(processor, dict):
            continue
        processors.extend(processor.get("processors") or [])  # a Sequence of post-processors
        single = processor.get("single")
        if processor.get("type") == "TemplateProcessing" and isinstance(single, list) and single:
            name = (single[0].get("SpecialToken") or {}).get("id") if isinstance(single[0], dict) else None
            ids = ((processor.get("special_tokens") or {}).get(name) or {}).get("ids") if name else None
            if isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], int):
                return ids[0]
    return None


def _network_config(raw: dict[str, Any], architecture: str, where: str) -> dict[str, Any]:
    problems = []
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if kind != "default":
        problems.append(f"RoPE scaling {kind!r} (only plain RoPE converts)")
    for name in ("attention_bias", "mlp_bias"):
        if raw.get(name):
            problems.append(
                f"{name}={raw[name]!r} (biases on every attention projection or on the MLP; specframe's networks "
                "take biases on the query, key and value projections only, as Qwen2's)"
            )
    partial = partial_rotary_problem(raw)
    if partial:
        problems.append(partial)
    if raw.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {raw.get('hidden_act')!r} (SwiGLU with SiLU only)")
    missing = [
        k
        for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "vocab_size")
        if not isinstance(raw.get(k), int)
    ]
    if missing:
        problems.append("missing " + ", ".join(missing))
    if problems:
        raise CheckpointError(f"{where}: cannot convert: {'; '.join(problems)}")
    heads = raw["num_attention_heads"]
    theta = raw.get("rope_theta", scaling.get("rope_theta", 10000.0) if isinstance(scaling, dict) else 10000.0)
    positions = int(raw.get("max_position_embeddings", 4096))
    window = raw.get("sliding_window")
    windowed = architecture == "MistralForCausalLM" or raw.get("use_sliding_window") is True  # Qwen: a switch
    if windowed and isinstance(window, int) and 0 < window < positions:
        positions = window  # within the window, sliding-window attention is full attention
    return {
        "hidden_size": raw["hidden_size"],
        "num_hidden_layers": raw["num_hidden_layers"],
        "intermediate_size": raw["intermediate_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": int(raw.get("num_key_value_heads") or heads),
        "head_dim": int(raw.get("head_dim") or raw["hidden_size"] // heads),
        "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(theta),
        "max_position_embeddings": positions,
        "vocab_size": raw["vocab_size"],
    }


def _tensor_loaders(folder: Path, raw: dict[str, Any], where: str) -> dict[str, Any]:
    source = open_weights(folder, stem="model")
    names = [n for n in source.names() if not n.endswith("rotary_emb.inv_freq")]
    unexpected = [n for n in names if not (n.startswith("model.") or n == "lm_head.weight")]
    if unexpected:
        raise CheckpointError(f"{where}: unexpected tensor(s) {', '.join(unexpected[:8])}")
    if raw.get("tie_word_embeddings") and "lm_head.weight" in names:
        names.remove("lm_head.weight")  # tied: the embedding is the output layer

    def loader(name: str):
        return lambda: source.load(name).float()

    return {name: loader(name) for name in names}
