"""Converting transformers Llama / Mistral / Qwen2 / Qwen3 checkpoints: the converted model is the source model.

The sources are tiny random models that transformers itself writes (``save_pretrained``); the oracle is
transformers running them in float64.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from convert_helpers import PROMPTS, SPECIALS, TEXTS, reference_greedy, specframe_outputs, special_id, tokenizer
from safetensors.torch import load_file

from specframe.convert import convert
from specframe.convert.hf_source import read_transformers
from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.models.weights import open_weights

SOURCES = ["llama", "llama-tied", "llama-sharded", "mistral", "qwen2", "qwen2-tied", "qwen3", "qwen3-tied"]
LENGTH = 12


def _converted_tensors(folder) -> dict[str, torch.Tensor]:
    source = open_weights(folder, stem="model")
    return {name: source.load(name) for name in source.names()}


def _expected_names(source_name: str) -> list[str]:
    if source_name == "lm_head.weight":
        return ["diffusion_head.weight"]
    return ["encoder." + source_name.removeprefix("model.")]


@pytest.mark.parametrize("name", SOURCES)
def test_every_weight_is_written_unchanged_under_the_family_names(converted, name):
    item = converted(name)
    source = {k: v for k, v in item.model.state_dict().items() if not k.endswith("inv_freq")}
    written = _converted_tensors(item.folder)
    expected = {}
    for source_name, tensor in source.items():
        if item.tied and source_name == "lm_head.weight":
            continue  # tied: the same storage as the embedding
        for target in _expected_names(source_name):
            expected[target] = tensor
    # the diffusion head starts as the AR output layer: the LM head, or the embedding when tied
    expected["diffusion_head.weight"] = source["lm_head.weight"]
    assert set(written) == set(expected)
    for key, tensor in expected.items():
        assert written[key].dtype == torch.float32, key
        assert torch.equal(written[key], tensor), key
    config = json.loads((item.folder / "config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == item.model.config.rope_parameters["rope_theta"] == 25000.0
    assert config["head_dim"] == item.model.config.head_dim
    assert config.get("qk_norm", False) is name.startswith("qwen3")
    assert config.get("qkv_bias", False) is name.startswith("qwen2")
    biases = [key for key in written if key.endswith("_proj.bias")]
    assert len(biases) == (3 * item.model.config.num_hidden_layers if name.startswith("qwen2") else 0)
    assert config["torch_dtype"] == "float32"
    assert config["specframe_conversion"]["architecture"] == item.model.config.architectures[0]


def test_a_sharded_source_is_read_whole(converted):
    item = converted("llama-sharded")
    index = json.loads((item.source / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # the save really was sharded
    assert not (item.source / "model.safetensors").exists()
    assert set(read_transformers(item.source).tensors) == set(index["weight_map"])


def test_tied_sources_have_no_separate_head(converted):
    for name in ("llama-tied", "qwen3-tied"):
        item = converted(name)
        config = json.loads((item.source / "config.json").read_text())
        assert config["tie_word_embeddings"] is True
        assert "lm_head.weight" not in read_transformers(item.source).tensors
    written = load_file(str(converted("llama-tied").folder / "model.safetensors"))
    assert torch.equal(written["diffusion_head.weight"], written["encoder.embed_tokens.weight"])
    written = load_file(str(converted("qwen3-tied").folder / "model.safetensors"))
    assert torch.equal(written["diffusion_head.weight"], written["encoder.embed_tokens.weight"])


@pytest.mark.parametrize("name", SOURCES)
def test_forward_logits_equal_transformers(converted, name):
    """One causal forward: every row's next-token logits are transformers' (float64).

    transformers computes RMSNorm (and RoPE's angles) in float32 even for a float64 model, so the two agree to
    about 1e-6, not to float64 precision; a wrong weight or RoPE layout is off by O(1).
    """
    item = converted(name)
    model = load_model(item.folder, dtype="float64")
    ids = PROMPTS[2]
    with torch.no_grad():
        expected = item.model.double()(torch.tensor([ids])).logits[0]
    rows = len(ids)
    got = model.forward(
        model.new_cache(16),
        ModelCall(torch.tensor(ids), torch.arange(rows), torch.ones(rows, rows, dtype=torch.bool).tril()),
    )
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-5
    assert expected.abs().max() > 1  # logits large enough for the tolerance to mean something


@pytest.mark.parametrize("name", SOURCES)
def test_ar_greedy_equals_transformers_and_every_schedule_equals_ar(converted, name):
    item = converted(name)
    model = load_model(item.folder, dtype="float64")
    for prompt in PROMPTS:
        expected = reference_greedy(item.model, prompt, LENGTH)
        assert len(set(expected)) > 3  # not a degenerate repetition
        outputs = specframe_outputs(model, prompt, LENGTH)
        assert outputs == {"ar": expected, "packed": expected, "linear": expected}, prompt


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_tokenizer_and_special_tokens(converted, name):
    item = converted(name)
    model = load_model(item.folder, dtype="float64")
    original = tokenizer()
    for text in TEXTS:
        assert model.tokenizer.encode(text) == original.encode(text).ids
    assert set(model.eos_token_ids) == {special_id("<|endoftext|>"), special_id("<|im_end|>")}
    # the highest control token that is neither EOS nor used by the chat template
    assert model.mask_token_id == special_id("<|unused|>") != max(special_id(t) for t in SPECIALS)
    settings = json.loads((item.folder / "tokenizer_config.json").read_text())
    assert settings["mask_token"] == "<|unused|>"
    assert settings["eos_token"] == "<|endoftext|>"


def test_mistral_sliding_window_caps_the_context(tmp_path, converted):
    item = converted("mistral")
    config = json.loads((item.source / "config.json").read_text())
    config["sliding_window"] = 64
    (item.source.parent / "windowed").mkdir()
    windowed = item.source.parent / "windowed"
    for path in item.source.iterdir():
        (windowed / path.name).write_bytes(path.read_bytes())
    (windowed / "config.json").write_text(json.dumps(config))
    assert read_transformers(item.source).config["max_position_embeddings"] == 256
    assert read_transformers(windowed).config["max_position_embeddings"] == 64


@pytest.mark.parametrize("bos", [None, "<|im_start|>"])
@pytest.mark.parametrize("template", [False, True])
def test_prompts_get_a_bos_exactly_when_the_source_tokenizer_adds_one(converted, tmp_path, bos, template):
    """The converted model prepends its config.json BOS to every prompt; the source tokenizer may not (SmolLM2
    names a BOS in config.json but never adds it), so the BOS is kept only where transformers adds one."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    source = Path(shutil.copytree(converted("llama").source, tmp_path / "source"))
    config = json.loads((source / "config.json").read_text())
    config["bos_token_id"] = None if bos is None else special_id(bos)
    (source / "config.json").write_text(json.dumps(config))
    if template:
        adding = tokenizer()
        start = "<|im_start|>"
        adding.post_processor = processors.TemplateProcessing(
            single=f"{start} $A", pair=f"{start} $A {start} $B", special_tokens=[(start, special_id(start))]
        )
        adding.save(str(source / "tokenizer.json"))
    model = load_model(convert(read_transformers(source), tmp_path / "out", dtype="float32"), dtype="float64")
    expected = AutoTokenizer.from_pretrained(source)
    for text in TEXTS:
        assert model.encode_prompt(text) == expected(text)["input_ids"], text
    # the template's first token is the BOS, whether or not config.json names one
    assert model.bos_token_id == (special_id("<|im_start|>") if template else None)
    assert (model.encode_prompt(TEXTS[0])[0] == special_id("<|im_start|>")) is template
