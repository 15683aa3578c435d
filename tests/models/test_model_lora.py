"""The proposal-only LoRA changes exactly the rows it is applied to."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from zoo_helpers import causal, run

from specframe.errors import CheckpointError, ConfigError, NonFiniteWeightsError
from specframe.models import load_model

PREFIX = [1, 40, 41, 42, 43, 44]


@pytest.fixture(scope="module")
def adapted(nemotron_dir):
    return load_model(nemotron_dir, dtype="float64", adapter=True)


def _packed_call(model, adapter_rows, prefill=None):
    """A Packed-SS-like call: 4 causal verifier rows and a 4-row MASK block that only sees the cache.

    The prefix is prefilled without adapter by ``prefill`` (default: ``model``)."""
    cache = model.new_cache(16)
    run(prefill or model, cache, PREFIX, range(6), causal(6))
    cache.commit(list(range(6)))
    attention = torch.zeros(8, 8, dtype=torch.bool)
    attention[:4, :4] = causal(4)
    attention[4:, 4:] = True
    mask = model.mask_token_id
    ids = [44, 50, 51, 52, 44, mask, mask, mask]
    positions = [5, 6, 7, 8, 5, 6, 7, 8]
    return run(model, cache, ids, positions, attention, adapter_rows=adapter_rows)


def test_adapter_applies_only_to_selected_rows(adapted, nemotron64):
    assert adapted.has_adapter
    proposal = torch.tensor([False] * 4 + [True] * 4)
    base = _packed_call(nemotron64, None)
    with_adapter = _packed_call(adapted, proposal)
    assert torch.equal(with_adapter[:4], base[:4])  # verifier rows: bit-identical to the base model
    assert not torch.allclose(with_adapter[4:], base[4:])
    assert torch.equal(_packed_call(adapted, None), base)  # no rows selected: the base model
    assert torch.equal(_packed_call(adapted, torch.zeros(8, dtype=torch.bool)), base)


def test_adapter_equals_merged_weights(adapted, nemotron_dir):
    config = json.loads((nemotron_dir / "linear_spec_lora" / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    lora = load_file(str(nemotron_dir / "linear_spec_lora" / "adapter_model.safetensors"))
    merged = load_model(nemotron_dir, dtype="float64")
    for i, layer in enumerate(merged.network.body.layers):
        key = f"base_model.model.encoder.layers.{i}.self_attn.o_proj"
        delta = lora[f"{key}.lora_B.weight"].double() @ lora[f"{key}.lora_A.weight"].double()
        layer.self_attn.o_proj.weight += scale * delta
    rows = torch.tensor([False] * 4 + [True] * 4)
    expected = _packed_call(merged, None, prefill=adapted)[4:]
    torch.testing.assert_close(_packed_call(adapted, rows)[4:], expected, rtol=0, atol=1e-10)


def test_adapter_errors(nemotron_dir, setdlm_dir, tmp_path):
    with pytest.raises(ConfigError, match="no proposal-only adapter"):
        load_model(setdlm_dir, adapter=True)
    with pytest.raises(CheckpointError, match="no adapter folder"):
        load_model(nemotron_dir, adapter=tmp_path / "absent")
    folder = tmp_path / "bad"
    folder.mkdir()
    config = json.loads((nemotron_dir / "linear_spec_lora" / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["q_proj", "o_proj"]}))
    with pytest.raises(CheckpointError, match="target_modules"):
        load_model(nemotron_dir, adapter=folder)


def test_an_adapter_with_nan_weights_is_named(nemotron_dir, tmp_path):
    from safetensors.torch import save_file

    source = nemotron_dir / "linear_spec_lora"
    folder = tmp_path / "nan"
    folder.mkdir()
    (folder / "adapter_config.json").write_text((source / "adapter_config.json").read_text())
    tensors = load_file(str(source / "adapter_model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    with pytest.raises(NonFiniteWeightsError, match=rf"adapter in {folder}: weight\(s\) {name} \(1 NaN"):
        load_model(nemotron_dir, adapter=folder)
