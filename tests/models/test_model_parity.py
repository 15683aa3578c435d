"""Numerical parity with transformers' reference implementations (a test-only oracle).

* SetDLM's backbone against ``Qwen3ForCausalLM``.
* Nemotron-Labs-Diffusion in AR mode (causal rows) against ``Ministral3ForCausalLM``, whose transformers 5.x
  implementation has both YaRN RoPE and the Llama-4 query scaling (``llama_4_scaling_beta``); the position
  ids are offset so that the scaling steps (every ``original_max_position_embeddings``) are crossed.

The weights come from our random checkpoints, renamed to transformers' module names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from zoo_helpers import causal, run

from specframe.models import load_model
from specframe.testing.models import NEMOTRON, write_random_checkpoint

transformers = pytest.importorskip("transformers")

PROMPT = "The quick brown fox jumps over the lazy dog; def f(x): return x"
STEPS = 10


def _hf_state(folder: Path, renames: dict[str, str]) -> dict[str, torch.Tensor]:
    state = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        for old, new in renames.items():
            if name.startswith(old):
                state[new + name[len(old) :]] = tensor
    return state


def _reference_qwen3(folder: Path):
    config = json.loads((folder / "config.json").read_text())["backbone_config"]
    fields = {
        k: v
        for k, v in config.items()
        if not k.startswith("_")
        and k
        not in (
            "automodel_cls",
            "pretrained_model_name_or_path",
            "trust_remote_code",
            "architectures",
            "model_type",
            "torch_dtype",
        )
    }
    hf_config = transformers.Qwen3Config(**fields, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    hf_config._attn_implementation = "eager"
    model = transformers.Qwen3ForCausalLM(hf_config).eval()
    state = _hf_state(folder, {"backbone.model.model.": "model."})
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model


def _reference_ministral3(folder: Path):
    config = json.loads((folder / "config.json").read_text())
    fields = {
        k: config[k]
        for k in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "max_position_embeddings",
            "rope_parameters",
            "tie_word_embeddings",
        )
    }
    hf_config = transformers.Ministral3Config(**fields)
    hf_config._attn_implementation = "eager"
    model = transformers.Ministral3ForCausalLM(hf_config).eval()
    state = _hf_state(folder, {"encoder.": "model.", "diffusion_head.": "lm_head."})
    model.load_state_dict(state, strict=True)
    return model


def _reference_logits(reference, ids: list[int], offset: int) -> torch.Tensor:
    with torch.no_grad():
        out = reference(
            input_ids=torch.tensor([ids]), position_ids=torch.arange(offset, offset + len(ids))[None], use_cache=False
        )
    return out.logits[0]


def _greedy(model, prompt: list[int], offset: int, steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation with our cache: prefill, then one committed row per step."""
    cache = model.new_cache(len(prompt) + steps)
    positions = list(range(offset, offset + len(prompt)))
    logits = run(model, cache, prompt, positions, causal(len(prompt)))
    first = logits
    cache.commit(list(range(len(prompt))))
    tokens = []
    for step in range(steps):
        token = int(logits[-1].argmax())
        tokens.append(token)
        logits = run(model, cache, [token], [offset + len(prompt) + step], causal(1))
        cache.commit([0])
    return tokens, first


def _reference_greedy(reference, prompt: list[int], offset: int, steps: int, mask_id: int | None) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        logits = _reference_logits(reference, ids, offset)[-1]
        if mask_id is not None:
            logits[mask_id] = -float("inf")
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_setdlm_matches_qwen3(setdlm_dir):
    model = load_model(setdlm_dir)
    reference = _reference_qwen3(setdlm_dir)
    prompt = model.tokenizer.encode(PROMPT)
    tokens, ours = _greedy(model, prompt, 0, STEPS)
    expected = _reference_logits(reference, prompt, 0)
    keep = torch.arange(model.vocab_size) != model.mask_token_id
    torch.testing.assert_close(ours[:, keep], expected[:, keep], rtol=1e-4, atol=1e-4)
    assert (ours[:, model.mask_token_id] == -1e6).all()
    assert tokens == _reference_greedy(reference, prompt, 0, STEPS, model.mask_token_id)


@pytest.mark.parametrize(
    ("rope", "offset"),
    [
        ({}, 40),  # the published settings (mscale == mscale_all_dim), crossing position 64 and 128
        ({"mscale": 1.0, "mscale_all_dim": 0.5, "llama_4_scaling_beta": 0.3}, 100),  # attention factor != 1
    ],
)
def test_nemotron_ar_mode_matches_ministral3(tmp_path, rope, offset):
    folder = write_random_checkpoint(NEMOTRON, tmp_path, seed=5, rope_parameters=rope)
    model = load_model(folder)
    reference = _reference_ministral3(folder)
    prompt = model.encode_prompt(PROMPT)
    assert offset + len(prompt) > 64  # Llama-4 scaling active for part of the rows
    tokens, ours = _greedy(model, prompt, offset, STEPS)
    torch.testing.assert_close(ours, _reference_logits(reference, prompt, offset), rtol=1e-4, atol=1e-4)
    assert tokens == _reference_greedy(reference, prompt, offset, STEPS, None)
