"""The written folder: weight dtypes and the writer's own sharding."""

from __future__ import annotations

import json

import pytest
import torch

from specframe.convert import convert, writer
from specframe.convert.hf_source import read_transformers
from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.models.weights import open_weights


def _tensors(folder) -> dict[str, torch.Tensor]:
    source = open_weights(folder, stem="model")
    return {name: source.load(name) for name in source.names()}


@pytest.mark.parametrize(("dtype", "torch_dtype"), [(None, torch.bfloat16), ("float16", torch.float16)])
def test_weights_are_rounded_to_the_written_dtype(converted, tmp_path, dtype, torch_dtype):
    item = converted("llama")
    source = read_transformers(item.source)
    folder = convert(source, tmp_path / "out", **({} if dtype is None else {"dtype": dtype}))  # default bfloat16
    written = _tensors(folder)
    full = _tensors(item.folder)  # the float32 conversion
    assert set(written) == set(full)
    for name, tensor in written.items():
        assert tensor.dtype == torch_dtype, name
        assert torch.equal(tensor, full[name].to(torch_dtype)), name
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == str(torch_dtype).removeprefix("torch.")


def test_large_models_are_written_in_shards_that_load_as_one(converted, tmp_path, monkeypatch):
    item = converted("llama-tied")
    monkeypatch.setattr(writer, "SHARD_BYTES", 40_000)
    folder = convert(read_transformers(item.source), tmp_path / "out", dtype="float32")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and not (folder / "model.safetensors").exists()
    assert shards == sorted(p.name for p in folder.glob("model-*-of-*.safetensors"))
    written = _tensors(folder)
    assert written.keys() == _tensors(item.folder).keys() == index["weight_map"].keys()
    assert all(torch.equal(written[name], tensor) for name, tensor in _tensors(item.folder).items())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in written.values())
    ids = torch.tensor([5, 17, 42])
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    one, many = load_model(item.folder, dtype="float64"), load_model(folder, dtype="float64")
    assert torch.equal(
        one.forward(one.new_cache(4), ModelCall(ids, torch.arange(3), causal)),
        many.forward(many.new_cache(4), ModelCall(ids, torch.arange(3), causal)),
    )
