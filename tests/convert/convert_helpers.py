"""Helpers for the conversion tests: a tiny byte-level BPE tokenizer, transformers checkpoints written by
transformers itself, and GGUF files written with ``gguf.GGUFWriter`` in llama.cpp's conventions.

The GGUF side is written here from the format's description, independently of the code under test: the q/k
row permutation (:func:`permute_rope_rows`) is expressed with explicit row indices, and the K-quant blocks,
which the ``gguf`` package cannot quantize, are built byte by byte and decoded by :func:`reference_dequantize`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: Added tokens of the test tokenizer, in id order after the BPE entries. ``<|unused|>`` sits below the
#: chat-template tokens, so choosing the highest *unused* control token is not the same as the highest one.
SPECIALS = ("<|endoftext|>", "<|unused|>", "<|im_start|>", "<|im_end|>")

#: A ChatML template with block tags on their own lines: it renders clean ChatML only with jinja's
#: ``trim_blocks`` and ``lstrip_blocks``, as transformers renders templates.
CHATML = (
    "{% for message in messages %}\n"
    "    {% if loop.first and messages[0]['role'] != 'system' %}\n"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "  {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "def add(x, y):\n    return x + y  # 12345",
    "Pack my box with five dozen liquor jugs!",
)
PROMPTS = ([5, 17, 42, 7, 100], [1, 2, 3], [250, 12, 64, 64, 9, 33, 180])


@functools.lru_cache(maxsize=1)
def tokenizer_json() -> str:
    """A byte-level BPE (SmolLM's pre-tokenizer: single digits, then byte level) with :data:`SPECIALS`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(list(TEXTS) * 10, trainer)
    tokenizer.add_special_tokens(list(SPECIALS))
    return tokenizer.to_str()


def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json())


def vocab_size() -> int:
    return tokenizer().get_vocab_size()


def special_id(token: str) -> int:
    return tokenizer().token_to_id(token)


# ---------------------------------------------------------------------------------------------------------
# transformers checkpoints


def transformers_model(architecture: str, *, tied: bool = False, seed: int = 0, **overrides: Any):
    """A random transformers model (float32) with the test tokenizer's vocabulary and EOS."""
    import transformers

    config_class = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    model_class = getattr(transformers, architecture)
    settings = {
        "vocab_size": vocab_size(),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 25000.0},  # not a default: it must be read
        "bos_token_id": None,
        "eos_token_id": special_id("<|endoftext|>"),
        "tie_word_embeddings": tied,
        "initializer_range": 0.3,  # large weights: varied greedy outputs rather than one repeated token
        **overrides,
    }
    torch.manual_seed(seed)
    model = model_class(config_class(**settings)).eval()
    with torch.no_grad():  # transformers starts biases (Qwen2's q/k/v) at zero, where a dropped one would not show
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 1.0)
    if not tied:
        # transformers initializes lm_head like every linear layer; make sure it is not the embedding
        assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    return model


def write_transformers_checkpoint(model, folder: Path, *, max_shard_size: str | None = None) -> Path:
    """``model.save_pretrained`` plus the test tokenizer and a ChatML template in tokenizer_config.json."""
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **kwargs)
    (folder / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    settings = {"eos_token": "<|endoftext|>", "chat_template": CHATML, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder


def reference_greedy(model, prompt: list[int], length: int, dtype: torch.dtype = torch.float64) -> list[int]:
    """transformers' own greedy continuation in ``dtype`` (float64 by default), never stopped by an EOS."""
    model = model.to(dtype)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=length, pad_token_id=0, attention_mask=None
        )
    tokens = output[0, len(prompt) :].tolist()
    assert len(tokens) == length
    return tokens


def specframe_outputs(model, prompt: list[int], length: int, **extra: Any) -> dict[str, list[int]]:
    """The ``ar``, ``packed`` (W=4) and ``linear`` (W=3) outputs of a loaded model, EOS disabled."""
    from specframe import compose

    saved, model.eos_token_ids = model.eos_token_ids, ()
    try:
        outputs = {}
        for schedule in ({"schedule": "ar"}, {"schedule": "packed", "width": 4}, {"schedule": "linear", "width": 3}):
            decoder = compose({"model": model, "max_new_tokens": length, **schedule, **extra})
            outputs[schedule["schedule"]] = decoder.generate(prompt_ids=prompt).output_ids
    finally:
        model.eos_token_ids = saved
    return outputs


def leftovers(out: Path) -> list[str]:
    """What a failed conversion into ``out`` left behind: ``out`` itself or a staging folder."""
    if not out.parent.exists():
        return []
    return sorted(p.name for p in out.parent.iterdir() if p.name == out.name or p.name.startswith(f".{out.name}."))


# ---------------------------------------------------------------------------------------------------------
# GGUF files

#: transformers name (per layer) -> llama.cpp name.
GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}
GGUF_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

#: The small network of the GGUF tests: every matrix row is a multiple of 256 values (one K-quant super-block).
GGUF_DIMS = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 25000.0,
    "max_position_embeddings": 128,
}


def gguf_name(name: str) -> str:
    if name in GGUF_TOP_NAMES:
        return GGUF_TOP_NAMES[name]
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{GGUF_LAYER_NAMES[rest]}"


def permute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: within each head, row ``2i`` is transformers' row ``i`` and row ``2i + 1``
    is transformers' row ``half + i`` (the two RoPE halves interleaved)."""
    rows = weight.shape[0]
    per_head = rows // heads
    half = per_head // 2
    order = []
    for head in range(heads):
        for i in range(half):
            order += [head * per_head + i, head * per_head + half + i]
    return weight[np.array(order)]


def random_weights(
    *,
    tied: bool = False,
    seed: int = 0,
    dims: dict[str, Any] | None = None,
    qk_norm: bool = False,
    qkv_bias: bool = False,
) -> dict[str, np.ndarray]:
    """Float32 weights in transformers' names and orientation for a Llama (Qwen3: ``qk_norm``, Qwen2:
    ``qkv_bias``) network."""
    dims = {**GGUF_DIMS, **(dims or {})}
    rng = np.random.default_rng(seed)
    hidden, inter, vocab = dims["hidden_size"], dims["intermediate_size"], dims.get("vocab_size", vocab_size())
    head_dim = dims.get("head_dim", hidden // dims["num_attention_heads"])
    q, kv = dims["num_attention_heads"] * head_dim, dims["num_key_value_heads"] * head_dim
    scale = 0.15

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(size)).astype(np.float32)

    weights = {"model.embed_tokens.weight": matrix(vocab, hidden)}
    for layer in range(dims["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        weights.update(
            {
                prefix + "input_layernorm.weight": norm(hidden),
                prefix + "self_attn.q_proj.weight": matrix(q, hidden),
                prefix + "self_attn.k_proj.weight": matrix(kv, hidden),
                prefix + "self_attn.v_proj.weight": matrix(kv, hidden),
                prefix + "self_attn.o_proj.weight": matrix(hidden, q),
                prefix + "post_attention_layernorm.weight": norm(hidden),
                prefix + "mlp.gate_proj.weight": matrix(inter, hidden),
                prefix + "mlp.up_proj.weight": matrix(inter, hidden),
                prefix + "mlp.down_proj.weight": matrix(hidden, inter),
            }
        )
        if qk_norm:
            weights[prefix + "self_attn.q_norm.weight"] = norm(head_dim)
            weights[prefix + "self_attn.k_norm.weight"] = norm(head_dim)
        if qkv_bias:
            for part, size in (("q", q), ("k", kv), ("v", kv)):
                weights[prefix + f"self_attn.{part}_proj.bias"] = rng.standard_normal(size).astype(np.float32)
    weights["model.norm.weight"] = norm(hidden)
    if not tied:
        weights["lm_head.weight"] = matrix(vocab, hidden)
    return weights


def write_gguf(
    path: Path,
    weights: dict[str, np.ndarray],
    *,
    qtype: str = "F32",
    arch: str = "llama",
    dims: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    pre: str = "smollm",
    raw_tensors: dict[str, tuple[np.ndarray, str]] | None = None,
) -> Path:
    """Write ``weights`` (transformers names, unpermuted) as llama.cpp would: q/k rows permuted (``llama``),
    matrices quantized as ``qtype`` (norms stay F32).

    ``raw_tensors`` holds already-quantized tensors (``{transformers name: (bytes array, type name)}``) written
    as given, after permuting their rows where llama.cpp would. ``metadata`` adds or replaces key/values
    (a value ``None`` drops the key).
    """
    import gguf
    from gguf import GGMLQuantizationType, GGUFValueType

    dims = {**GGUF_DIMS, **(dims or {})}
    heads, kv_heads = dims["num_attention_heads"], dims["num_key_value_heads"]
    tok = json.loads(tokenizer_json())
    vocab = {**tok["model"]["vocab"], **{a["content"]: a["id"] for a in tok["added_tokens"]}}
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    control = {a["id"] for a in tok["added_tokens"] if a["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    fields: dict[str, Any] = {
        "general.name": ("test model", GGUFValueType.STRING),
        f"{arch}.context_length": (dims["max_position_embeddings"], GGUFValueType.UINT32),
        f"{arch}.embedding_length": (dims["hidden_size"], GGUFValueType.UINT32),
        f"{arch}.block_count": (dims["num_hidden_layers"], GGUFValueType.UINT32),
        f"{arch}.feed_forward_length": (dims["intermediate_size"], GGUFValueType.UINT32),
        f"{arch}.attention.head_count": (heads, GGUFValueType.UINT32),
        f"{arch}.attention.head_count_kv": (kv_heads, GGUFValueType.UINT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (dims["rms_norm_eps"], GGUFValueType.FLOAT32),
        f"{arch}.rope.freq_base": (dims["rope_theta"], GGUFValueType.FLOAT32),
        f"{arch}.rope.dimension_count": (dims.get("head_dim", dims["hidden_size"] // heads), GGUFValueType.UINT32),
        f"{arch}.vocab_size": (len(tokens), GGUFValueType.UINT32),
        "tokenizer.ggml.model": ("gpt2", GGUFValueType.STRING),
        "tokenizer.ggml.pre": (pre, GGUFValueType.STRING),
        "tokenizer.ggml.tokens": (tokens, GGUFValueType.ARRAY),
        "tokenizer.ggml.token_type": ([3 if i in control else 1 for i in range(len(tokens))], GGUFValueType.ARRAY),
        "tokenizer.ggml.merges": (merges, GGUFValueType.ARRAY),
        "tokenizer.ggml.bos_token_id": (vocab["<|im_start|>"], GGUFValueType.UINT32),
        "tokenizer.ggml.eos_token_id": (vocab["<|endoftext|>"], GGUFValueType.UINT32),
        "tokenizer.chat_template": (CHATML, GGUFValueType.STRING),
    }
    if "head_dim" in dims:
        fields[f"{arch}.attention.key_length"] = (dims["head_dim"], GGUFValueType.UINT32)
        fields[f"{arch}.attention.value_length"] = (dims["head_dim"], GGUFValueType.UINT32)
    for key, value in (metadata or {}).items():
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = value
    writer = gguf.GGUFWriter(str(path), arch)
    for key, (value, kind) in fields.items():
        if key == "general.architecture":
            continue
        sub = GGUFValueType.INT32 if key == "tokenizer.ggml.token_type" else None
        writer.add_key_value(key, value, kind, sub_type=sub)

    def permuted(name: str, array: np.ndarray) -> np.ndarray:
        if arch != "llama":  # llama.cpp permutes for its llama architecture only (Qwen3 uses NeoX RoPE)
            return array
        if name.endswith("q_proj.weight"):
            return permute_rope_rows(array, heads)
        if name.endswith("k_proj.weight"):
            return permute_rope_rows(array, kv_heads)
        return array

    for name, array in weights.items():
        array = permuted(name, array)
        kind = "F32" if array.ndim == 1 else qtype
        if kind == "F32":
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(array, dtype=np.float32))
        elif kind == "F16":
            writer.add_tensor(gguf_name(name), array.astype(np.float16))
        else:
            qt = GGMLQuantizationType[kind]
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(array, qt), raw_dtype=qt)
    for name, (blocks, kind) in (raw_tensors or {}).items():
        qt = GGMLQuantizationType[kind]
        writer.add_tensor(gguf_name(name), permuted(name, blocks), raw_dtype=qt)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read_gguf_beside_transformers(path: Path, weights: dict[str, np.ndarray]) -> tuple[Any, dict[str, Any], Any]:
    """``read_gguf(path)``, its tensors by name, and transformers' model loaded from the same file (float32).

    Asserts that the tensors are transformers' own, bit for bit, under the names of ``weights``.
    """
    from transformers import AutoModelForCausalLM

    from specframe.convert.gguf_source import read_gguf

    source = read_gguf(path)
    ours = {name: load() for name, load in source.tensors.items()}
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    theirs = reference.state_dict()
    assert set(ours) == set(theirs) == set(weights)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    return source, ours, reference


# K-quants: 256 values per super-block.
#   Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks of 32, 128 bytes
#        of 4-bit quants; value = d * scale_j * q - dmin * min_j.
#   Q6_K (210 bytes): 128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8 scales (sub-blocks of 16), f16 d;
#        value = d * scale_j * (q - 32).
KQUANT_BYTES = {"Q4_K": 144, "Q6_K": 210}


def random_kquant(rows: int, cols: int, kind: str, seed: int) -> np.ndarray:
    """Valid ``kind`` super-blocks with random quants and scales (``[rows, cols / 256 * bytes]`` uint8)."""
    assert cols % 256 == 0
    rng = np.random.default_rng(seed)
    blocks = rows * cols // 256
    data = rng.integers(0, 256, size=(blocks, KQUANT_BYTES[kind]), dtype=np.uint8)
    if kind == "Q4_K":  # d * scale * q - dmin * min, centred by dmin = 7.5 d (q averages 7.5); up to about 0.3
        d = rng.uniform(1e-4, 3e-4, blocks)
        data[:, 0:2] = _f16_bytes(d)
        data[:, 2:4] = _f16_bytes(7.5 * d)
    else:  # d * scale * (q - 32): |value| up to about 0.3
        data[:, 208:210] = _f16_bytes(rng.uniform(2e-5, 7e-5, blocks))
    return data.reshape(rows, -1)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype("<f2").view(np.uint8).reshape(-1, 2)


def reference_dequantize(data: np.ndarray, kind: str) -> np.ndarray:
    """Decode K-quant super-blocks, written from the block layouts above."""
    rows = data.shape[0]
    blocks = data.reshape(-1, KQUANT_BYTES[kind])
    if kind == "Q4_K":
        d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # [n, 1]
        dmin = blocks[:, 2:4].copy().view("<f2").astype(np.float32)
        packed = blocks[:, 4:16].astype(np.int32)
        scales, mins = np.zeros((len(blocks), 8), np.int32), np.zeros((len(blocks), 8), np.int32)
        for j in range(8):
            if j < 4:
                scales[:, j] = packed[:, j] & 63
                mins[:, j] = packed[:, j + 4] & 63
            else:
                scales[:, j] = (packed[:, j + 4] & 0x0F) | ((packed[:, j - 4] >> 6) << 4)
                mins[:, j] = (packed[:, j + 4] >> 4) | ((packed[:, j] >> 6) << 4)
        qs = blocks[:, 16:144].astype(np.int32)
        out = np.zeros((len(blocks), 256), np.float32)
        for chunk in range(4):  # 64 values per 32 bytes: low nibbles, then high nibbles
            q = qs[:, 32 * chunk : 32 * (chunk + 1)]
            for part, values in enumerate((q & 0x0F, q >> 4)):
                j = 2 * chunk + part
                out[:, 32 * j : 32 * (j + 1)] = (
                    d * scales[:, j : j + 1].astype(np.float32) * values - dmin * mins[:, j : j + 1]
                )
        return out.reshape(rows, -1)
    low, high = blocks[:, 0:128].astype(np.int32), blocks[:, 128:192].astype(np.int32)
    scales = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
    d = blocks[:, 208:210].copy().view("<f2").astype(np.float32)
    out = np.zeros((len(blocks), 256), np.float32)
    for half in range(2):  # 128 values from 64 low bytes and 32 high bytes
        ql, qh = low[:, 64 * half : 64 * (half + 1)], high[:, 32 * half : 32 * (half + 1)]
        quarters = (
            (ql[:, :32] & 0x0F) | ((qh & 3) << 4),
            (ql[:, 32:] & 0x0F) | (((qh >> 2) & 3) << 4),
            (ql[:, :32] >> 4) | (((qh >> 4) & 3) << 4),
            (ql[:, 32:] >> 4) | (((qh >> 6) & 3) << 4),
        )
        for quarter, q in enumerate(quarters):
            for sixteen in range(2):  # one scale per 16 values
                scale = scales[:, 8 * half + 2 * quarter + sixteen : 8 * half + 2 * quarter + sixteen + 1]
                start = 128 * half + 32 * quarter + 16 * sixteen
                out[:, start : start + 16] = d * scale * (q[:, 16 * sixteen : 16 * (sixteen + 1)] - 32)
    return out.reshape(rows, -1)
