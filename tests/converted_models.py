"""Tiny AR checkpoints to convert: a random transformers Llama folder and a GGUF file made from it.

Both carry a small byte-level BPE tokenizer with ChatML special tokens (``<|endoftext|>`` = 0,
``<|im_start|>`` = 1, ``<|im_end|>`` = 2, ``<|unused|>`` = 3, which the conversion picks as the mask token) and
a ChatML chat template, like the small instruct models specframe pulls.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import torch

from convert.convert_helpers import GGUF_LAYER_NAMES

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unused|>")
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
VOCAB = 300
# What the tokenizer's merges are learned from: the short chat requests (and answers) of bench's chat task.
CHAT_TASK = files("specframe.bench").joinpath("data", "chat.jsonl")
SIZES = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 256,
}


def _tokenizer_json() -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rows = [json.loads(line) for line in CHAT_TASK.read_text(encoding="utf-8").splitlines() if line.strip()]
    text = [row["prompt"] for row in rows] + [str(row.get("answer", "")) for row in rows]
    text += ["def f(x):\n    return x + 1\n", "The capital of France is Paris."]
    tokenizer.train_from_iterator(text, trainer=trainer)
    return json.loads(tokenizer.to_str())


def write_tiny_llama(folder: Path, *, seed: int = 0, chat_template: bool = True) -> Path:
    """A random ``LlamaForCausalLM`` (tied embeddings) with tokenizer.json and tokenizer_config.json."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.1,  # decisive argmaxes: no near-ties between float32 computation orders
        **SIZES,
    )
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    document = _tokenizer_json()
    assert [a["content"] for a in document["added_tokens"]] == list(SPECIALS)
    (folder / "tokenizer.json").write_text(json.dumps(document), encoding="utf-8")
    settings = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[0]}
    if chat_template:
        settings["chat_template"] = CHATML
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder


def convert_tiny_llama(llama: Path, out: Path) -> Path:
    """Convert a :func:`write_tiny_llama` folder into a float32 specframe folder."""
    from specframe.convert.hf_source import read_transformers
    from specframe.convert.writer import convert

    return convert(read_transformers(llama), out, dtype="float32")


def write_tiny_gguf(llama: Path, path: Path) -> Path:
    """The :func:`write_tiny_llama` model as an F32 GGUF file (``llama`` architecture, ``smollm`` BPE)."""
    import gguf
    from safetensors.torch import load_file

    document = json.loads((llama / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((llama / "config.json").read_text(encoding="utf-8"))
    vocab = document["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {a["id"] for a in document["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in document["model"]["merges"]]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta", 1e4))
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_chat_template(CHATML)
    for name, tensor in sorted(load_file(str(llama / "model.safetensors")).items()):
        if name == "model.embed_tokens.weight":
            target = "token_embd.weight"
        elif name == "model.norm.weight":
            target = "output_norm.weight"
        elif name == "lm_head.weight":
            continue  # tied
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            target = f"blk.{layer}.{GGUF_LAYER_NAMES[rest]}"
        writer.add_tensor(target, tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
