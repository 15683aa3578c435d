"""Reading a GGUF file (llama.cpp's format) into a :class:`~specframe.convert.source.SourceModel`.

Architectures: ``llama``, ``mistral``, ``qwen2`` (with its query, key and value biases) and ``qwen3``; RoPE
scaling and partial rotary embeddings (``rope.dimension_count`` below the head size) are refused. The tensors
are dequantized with the ``gguf`` package (F32, F16, BF16 and the common block quantizations: Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, Q2_K..Q6_K); biases stay float. llama.cpp stores the query and key rows of its ``llama``
architecture permuted for its interleaved RoPE; they are permuted back to transformers' half-split layout.
The tokenizer is rebuilt as a ``tokenizer.json``: a byte-level BPE vocabulary with merges and a pre-tokenizer
name (``tokenizer.ggml.model`` ``gpt2``), or a SentencePiece BPE vocabulary with scores (``llama``, Llama 2's);
other tokenizer models are refused with what to do. The chat template is kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specframe.convert.source import SourceModel
from specframe.errors import CheckpointError, ConfigError
from specframe.kernels.quant import QUANTIZED

#: GGUF architecture name -> transformers class.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
#: Architectures whose query, key and value projections have biases (``blk.{i}.attn_{q,k,v}.bias``).
BIASED = {"qwen2"}

#: GGUF per-layer tensor names -> transformers names.
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
BIAS_NAMES = {
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
}
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_IGNORED = re.compile(r"^(rope_freqs\.weight|blk\.\d+\.attn_rot_embd)$")

# Byte-level BPE pre-tokenizers by GGUF ``tokenizer.ggml.pre`` (the regular expressions are the published
# tokenizers' own).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _split(pattern: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "gpt2": _byte_level(True),
    "default": _byte_level(True),
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _byte_level(True)]},
    "starcoder": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _byte_level(True)],
    },
    "llama-bpe": {"type": "Sequence", "pretokenizers": [_split(_LLAMA3_SPLIT), _byte_level(False)]},
    "qwen2": {"type": "Sequence", "pretokenizers": [_split(_QWEN2_SPLIT), _byte_level(False)]},
}
_IGNORE_MERGES = {"llama-bpe"}
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4
_SPACE = "\u2581"  # SentencePiece's visible space


def read_gguf(path: Path) -> SourceModel:
    """Read ``path`` (a ``.gguf`` file).

    Raises:
        CheckpointError: If the file is not a readable GGUF model, or its architecture, a tensor's
            quantization or its tokenizer is not supported (each named).
    """
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - an install problem
        raise ConfigError(
            "reading GGUF files needs the 'gguf' package, a dependency of specframe: pip install gguf"
        ) from exc
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError, struct errors, IndexError on damaged files
        raise CheckpointError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc}); is it complete?"
        ) from exc
    fields = _Fields(reader, path)
    arch = fields.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    config = _config(fields, arch)
    tensors, tied, blocks = _tensors(reader, path, arch, config, gguf)
    config["tie_word_embeddings"] = tied
    tokenizer, control = _tokenizer(fields)
    # Without tokenizer.ggml.add_bos_token, llama.cpp prepends BOS for SentencePiece vocabularies, and for
    # byte-level BPE only with Llama 3's pre-tokenizer.
    spm = fields.get("tokenizer.ggml.model") == "llama"
    pre_adds_bos = spm or fields.get("tokenizer.ggml.pre", "default") == "llama-bpe"
    config["vocab_size"] = max(config["vocab_size"], len(fields.get("tokenizer.ggml.tokens")))
    special = {
        name: fields.get(f"tokenizer.ggml.{key}", None)
        for name, key in (
            ("bos_token_id", "bos_token_id"),
            ("eos_token_id", "eos_token_id"),
            ("pad_token_id", "padding_token_id"),
            ("unk_token_id", "unknown_token_id"),
        )
    }
    model = SourceModel(
        architecture=GGUF_ARCHITECTURES[arch],
        config=config,
        tensors=tensors,
        blocks=blocks,
        tokenizer_json=tokenizer,
        chat_template=fields.get("tokenizer.chat_template", None),
        special={k: int(v) for k, v in special.items() if v is not None},
        control_tokens=control,
        add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", pre_adds_bos)),
        description=f"{path.name} ({fields.get('general.name', arch)})",
    )
    model.check_biases()
    return model


class _Fields:
    """The GGUF metadata fields, decoded, with errors that name the file and the field."""

    _MISSING = object()

    def __init__(self, reader: Any, path: Path) -> None:
        self.reader, self.path = reader, path

    def get(self, key: str, default: Any = _MISSING) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            if default is self._MISSING:
                raise CheckpointError(f"{self.path}: the GGUF metadata has no {key!r}; the file is incomplete")
            return default
        try:
            return field.contents()
        except Exception as exc:
            raise CheckpointError(f"{self.path}: cannot read GGUF field {key!r} ({exc})") from exc


def _config(fields: _Fields, arch: str) -> dict[str, Any]:
    hidden = int(fields.get(f"{arch}.embedding_length"))
    heads = int(fields.get(f"{arch}.attention.head_count"))
    scaling = fields.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise CheckpointError(
            f"{fields.path}: RoPE scaling {scaling!r} is not supported by the conversion (plain RoPE only)"
        )
    head_dim = int(fields.get(f"{arch}.attention.key_length", hidden // heads))
    rotated = fields.get(f"{arch}.rope.dimension_count", head_dim)
    if rotated != head_dim:
        raise CheckpointError(
            f"{fields.path}: {arch}.rope.dimension_count is {rotated}, but a head has {head_dim} dimensions: "
            "rotary embeddings on part of each head (partial rotary) are not supported; specframe needs full "
            "rotary embeddings (rope.dimension_count equal to the head size)"
        )
    config = {
        "hidden_size": hidden,
        "num_hidden_layers": int(fields.get(f"{arch}.block_count")),
        "intermediate_size": int(fields.get(f"{arch}.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(fields.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(fields.get(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(fields.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(fields.get(f"{arch}.context_length")),
        "vocab_size": int(fields.get(f"{arch}.vocab_size", 0)),
        "hidden_act": "silu",
        "attention_bias": False,
        "qkv_bias": arch in BIASED,
    }
    return config


def _tensors(
    reader: Any, path: Path, arch: str, config: dict[str, Any], gguf: Any
) -> tuple[dict[str, Callable[[], torch.Tensor]], bool, dict[str, Callable[[], tuple[str, torch.Tensor]]]]:
    loaders: dict[str, Callable[[], torch.Tensor]] = {}
    blocks: dict[str, Callable[[], tuple[str, torch.Tensor]]] = {}
    unknown = []
    layer_names = {**LAYER_NAMES, **BIAS_NAMES} if arch in BIASED else LAYER_NAMES
    for tensor in reader.tensors:
        name = tensor.name
        if _IGNORED.match(name):
            continue
        target = TOP_NAMES.get(name)
        match = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        if match and match.group(2) in layer_names:
            target = f"model.layers.{match.group(1)}.{layer_names[match.group(2)]}"
        if target is None:
            unknown.append(name)
            continue
        heads = None
        if arch in ("llama", "mistral") and target.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads"] if "q_proj" in target else config["num_key_value_heads"]
        loaders[target] = _loader(tensor, path, heads, gguf)
        kind = getattr(tensor.tensor_type, "name", "").lower()
        if kind in QUANTIZED and len(tensor.shape) == 2:
            blocks[target] = _block_loader(tensor, kind, heads)
    if unknown:
        raise CheckpointError(f"{path}: unexpected tensor(s) for a {arch} model: {', '.join(unknown[:8])}")
    tied = "lm_head.weight" not in loaders
    return loaders, tied, blocks


def _block_loader(tensor: Any, fmt: str, heads: int | None) -> Callable[[], tuple[str, torch.Tensor]]:
    """The tensor's blocks as stored (rows un-permuted like its values): ``(format, uint8 [out, bytes])``."""

    def load() -> tuple[str, torch.Tensor]:
        rows = int(tensor.shape[1])
        blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8)).reshape(rows, -1)
        if heads is not None:
            blocks = unpermute_rope_rows(blocks, heads)
        return fmt, blocks

    return load


def _loader(tensor: Any, path: Path, heads: int | None, gguf: Any) -> Callable[[], torch.Tensor]:
    qtype = tensor.tensor_type
    kind = getattr(qtype, "name", str(qtype))

    def load() -> torch.Tensor:
        try:
            if kind in ("F32", "F16"):
                values = np.asarray(tensor.data, dtype=np.float32)
            else:
                values = gguf.quants.dequantize(tensor.data, qtype)
        except NotImplementedError as exc:
            raise CheckpointError(
                f"{path}: tensor {tensor.name} is quantized as {kind}, which the gguf package cannot dequantize; "
                "convert from a GGUF with F16, Q8_0, Q4_0, Q4_1, Q5_*, or Q2_K..Q6_K tensors"
            ) from exc
        shape = tuple(int(n) for n in reversed(list(tensor.shape)))  # GGUF lists the fastest dimension first
        try:
            values = np.ascontiguousarray(values).reshape(shape)
        except ValueError as exc:
            raise CheckpointError(f"{path}: tensor {tensor.name} holds {values.size} values, not {shape}") from exc
        weight = torch.from_numpy(np.array(values, dtype=np.float32))  # a writable copy
        if heads is not None:
            weight = unpermute_rope_rows(weight, heads)
        return weight

    return load


def unpermute_rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's interleaving of each head's query/key rows (back to transformers' half-split RoPE)."""
    out, inner = weight.shape
    half = out // heads // 2
    return weight.reshape(heads, half, 2, inner).transpose(1, 2).reshape(out, inner).contiguous()


def _tokenizer(fields: _Fields) -> tuple[dict[str, Any], list[int]]:
    model = fields.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise CheckpointError(
            f"{fields.path}: tokenizer model {model!r} is not supported (byte-level BPE, 'gpt2', and SentencePiece "
            "BPE, 'llama', only); convert the model from its transformers checkpoint instead, which carries a "
            "tokenizer.json"
        )
    tokens = [str(t) for t in fields.get("tokenizer.ggml.tokens")]
    types = list(fields.get("tokenizer.ggml.token_type", [_NORMAL] * len(tokens)))
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens) or len(types) != len(tokens):
        raise CheckpointError(
            f"{fields.path}: the GGUF vocabulary repeats tokens, or has not one type per token; the file is damaged"
        )
    if model == "llama":
        document = _sentencepiece(fields, tokens, types, vocab)
    else:
        document = _byte_level_bpe(fields, vocab)
    kept = (_CONTROL, _USER_DEFINED, _UNKNOWN) if model == "llama" else (_CONTROL, _USER_DEFINED)
    document["added_tokens"] = [
        {
            "id": index,
            "content": tokens[index],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind != _USER_DEFINED,
        }
        for index, kind in enumerate(types)
        if kind in kept
    ]
    control = [index for index, kind in enumerate(types) if kind == _CONTROL]
    return document, control


def _sentencepiece(fields: _Fields, tokens: list[str], types: list[int], vocab: dict[str, int]) -> dict[str, Any]:
    """A SentencePiece BPE vocabulary (Llama 2's) as a ``tokenizer.json``: byte-level fallback, spaces as ``▁``.

    SentencePiece merges, again and again, the adjacent pair whose joined piece scores highest; a BPE model
    does the same when its merges are ranked by the score of the piece each makes. So every split of a piece
    into two pieces of the vocabulary is a merge, ranked by the piece's score.
    """
    scores = [float(s) for s in fields.get("tokenizer.ggml.scores")]
    if len(scores) != len(tokens):
        raise CheckpointError(f"{fields.path}: tokenizer.ggml.scores has not one score per token; the file is damaged")
    ranked = []
    for index, piece in enumerate(tokens):
        if types[index] != _NORMAL:
            continue
        for cut in range(1, len(piece)):
            left, right = vocab.get(piece[:cut]), vocab.get(piece[cut:])
            if left is not None and right is not None and types[left] == types[right] == _NORMAL:
                ranked.append((-scores[index], left, right))
    ranked.sort()
    unknown = fields.get("tokenizer.ggml.unknown_token_id", None)
    prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
    spaces = {"type": "Replace", "pattern": {"String": " "}, "content": _SPACE}
    normalizer = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": _SPACE}, spaces]}
    decoders = [
        {"type": "Replace", "pattern": {"String": _SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if prefix:  # the space the normalizer put before the text is not the text's
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "normalizer": normalizer if prefix else spaces,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None if unknown is None else tokens[int(unknown)],
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[tokens[left], tokens[right]] for _, left, right in ranked],
        },
    }


def _byte_level_bpe(fields: _Fields, vocab: dict[str, int]) -> dict[str, Any]:
    """A byte-level BPE vocabulary (GPT-2's, Llama 3's, Qwen's, ...) as a ``tokenizer.json``."""
    pre = fields.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(
            f"{fields.path}: pre-tokenizer {pre!r} is not known to the conversion (known: "
            f"{', '.join(PRE_TOKENIZERS)}); convert the model from its transformers checkpoint instead"
        )
    merges = [str(m) for m in fields.get("tokenizer.ggml.merges")]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre in _IGNORE_MERGES,
            "vocab": vocab,
            "merges": merges,
        },
    }
