"""The models shipped in specframe/assets/models: their Hub layout, loading by name and the default model.

How good they are (held-out perplexity, acceptance of their drafts) is measured by the tests of the
specframe-training plugin that trains them (plugins/specframe-training/tests/test_bundled_models.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from specframe.cli import main
from specframe.models import load_model
from specframe.models.hub import DEFAULT_MODEL, bundled_model
from specframe.testing.models import NEMOTRON, SETDLM

BUNDLED = {NEMOTRON: "nemotron-stdlib-tiny", SETDLM: "setdlm-stdlib-tiny"}
FAMILIES = (NEMOTRON, SETDLM)


def test_default_model_is_the_nemotron_one():
    assert DEFAULT_MODEL == BUNDLED[NEMOTRON]
    model = load_model(None)
    assert model.family == NEMOTRON
    assert model.name == str(bundled_model())


@pytest.mark.parametrize("family", FAMILIES)
def test_hub_layout(family):
    folder = bundled_model(BUNDLED[family])
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        names = set(handle.keys())
        dtypes = {handle.get_tensor(name).dtype for name in names}
    assert dtypes == {torch.bfloat16}
    if family == NEMOTRON:
        assert config["model_type"] == "nemotron_labs_diffusion"
        assert config["architectures"] == ["NemotronLabsDiffusionModel"]
        assert config["rope_parameters"]["rope_type"] == "yarn"
        assert (config["bos_token_id"], config["eos_token_id"], config["mask_token_id"]) == (1, 11, 100)
        assert {"encoder.embed_tokens.weight", "encoder.norm.weight", "diffusion_head.weight"} <= names
        assert "encoder.layers.0.self_attn.q_proj.weight" in names
        assert all(n.startswith(("encoder.", "diffusion_head.")) for n in names)
    else:
        assert config["model_type"] == "bd3lm"
        assert config["backbone_config"]["model_type"] == "qwen3"
        assert all(n.startswith("backbone.model.model.") for n in names)
        assert "backbone.model.model.layers.0.self_attn.k_norm.weight" in names
    model = load_model(folder)
    assert model.family == family
    assert model.tokenizer is not None and model.tokenizer.vocab_size <= model.vocab_size


def test_cli_generates_with_the_default_model(capsys):
    assert main(["generate", "def fib(n):", "--max-new-tokens", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["output_ids"]) == 16
    assert out["text"]
