"""Qwen2 / Qwen2.5 (query, key and value biases): converted from transformers and from GGUF, the bias runs on
every CPU path (specframe's kernels, torch's, the plain one, the compiled graph) and beside quantized weights.

The oracle is transformers: its own random Qwen2 checkpoint (biases drawn at random, not transformers' zeros),
and its own loading of the GGUF file.
"""

from __future__ import annotations

import json

import pytest
import torch
from convert_helpers import (
    PROMPTS,
    random_weights,
    read_gguf_beside_transformers,
    reference_greedy,
    specframe_outputs,
    write_gguf,
)
from safetensors import safe_open

from specframe import kernels
from specframe.convert import convert
from specframe.convert.gguf_source import read_gguf
from specframe.convert.hf_source import read_transformers
from specframe.models import load_model
from specframe.models.base import ModelCall

LENGTH = 12
needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"no kernels: {kernels.unavailable_reason()}")


def _causal_logits(model, ids: list[int]) -> torch.Tensor:
    rows = len(ids)
    call = ModelCall(torch.tensor(ids), torch.arange(rows), torch.ones(rows, rows, dtype=torch.bool).tril())
    return model.forward(model.new_cache(16), call)


def _source_copy(model, *, biases: bool, quant: str | None = None):
    """A float32 copy of a transformers model: without its biases unless ``biases``, and with its projections'
    ``quant`` values (quantized and decoded again) when ``quant`` is given."""
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    copy = copy.float()
    with torch.no_grad():
        for name, parameter in copy.named_parameters():
            if quant is not None and (name.endswith("_proj.weight") or name == "lm_head.weight"):
                parameter.copy_(kernels.dequantize(kernels.quantize(parameter, quant), quant))
            elif name.endswith(".bias") and not biases:
                parameter.zero_()
    return copy


def _load(folder, path: str, monkeypatch) -> object:
    """The converted model in float32 on one CPU path."""
    if path == "torch":
        monkeypatch.setenv(kernels.SWITCH, "0")
    model = load_model(folder, dtype="float32", cpu_tuning=path != "plain")
    if path == "compiled":
        model.enable_compiled(backend="aot_eager")  # the graph inductor would compile, run without code generation
    return model


@pytest.mark.parametrize(
    "path",
    [pytest.param("kernels", marks=needs_kernels), "torch", "plain", pytest.param("compiled", marks=needs_kernels)],
)
def test_float32_greedy_equals_transformers_on_every_cpu_path(converted, monkeypatch, path):
    item = converted("qwen2")
    model = _load(item.folder, path, monkeypatch)
    assert model.kernel_report()["invariant"] is (path in ("kernels", "compiled"))
    for prompt in PROMPTS:
        expected = reference_greedy(item.model, prompt, LENGTH, dtype=torch.float32)
        assert len(set(expected)) > 3  # not a degenerate repetition
        assert specframe_outputs(model, prompt, LENGTH) == {"ar": expected, "packed": expected, "linear": expected}
    if path == "compiled":
        assert model.compiled.graph_calls > 0  # the graph, not only the eager fallback, answered calls


def test_the_biases_matter_and_are_written_float(converted):
    """Without its biases the source model's logits are far from what the converted model gives."""
    item = converted("qwen2")
    with safe_open(str(item.folder / "model.safetensors"), framework="pt") as handle:
        bias = handle.get_tensor("encoder.layers.1.self_attn.k_proj.bias")
    assert torch.equal(bias, item.model.model.layers[1].self_attn.k_proj.bias.detach().float())
    config = json.loads((item.folder / "config.json").read_text())
    assert config["qkv_bias"] is True and config["attention_bias"] is False
    ids = PROMPTS[2]
    model = load_model(item.folder, dtype="float64")
    with torch.no_grad():
        expected = _source_copy(item.model, biases=True).double()(torch.tensor([ids])).logits[0]
        unbiased = _source_copy(item.model, biases=False).double()(torch.tensor([ids])).logits[0]
    got = _causal_logits(model, ids)
    assert (got - expected).abs().max() < 1e-5
    assert (unbiased - expected).abs().max() > 1.0


@needs_kernels
@pytest.mark.parametrize("quant", ["q8_0", "q4_0", "q4_1"])
def test_quantized_projections_keep_float_biases(converted, tmp_path, quant):
    """``--quant``: the matrices are stored in blocks, the biases stay float and are added to the kernels' rows.

    The logits are transformers' with the matrices' quantized values, up to the kernels' rounding (they
    quantize activations too), and far from the same without biases; every schedule's output is AR's.
    """
    item = converted("qwen2")
    folder = convert(read_transformers(item.source), tmp_path / quant, dtype="float32", quant=quant)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        assert handle.get_tensor("encoder.layers.0.self_attn.q_proj.bias").dtype == torch.float32
    assert f"encoder.layers.0.self_attn.q_proj.weight.{quant}" in names
    assert not any(name.endswith(f"bias.{quant}") for name in names)
    model = load_model(folder, dtype="float32")
    assert model.kernel_report()["weights"] == [quant]
    ids = PROMPTS[2]
    got = _causal_logits(model, ids)
    with torch.no_grad():
        expected = _source_copy(item.model, biases=True, quant=quant)(torch.tensor([ids])).logits[0]
        unbiased = _source_copy(item.model, biases=False, quant=quant)(torch.tensor([ids])).logits[0]
    scale = float(expected.abs().max())
    error, without = float((got - expected).abs().max()), float((got - unbiased).abs().max())
    assert error < 0.1 * scale and without > 0.5 * scale, (error, without, scale)  # ~0.05 and ~0.8 of the scale
    outputs = specframe_outputs(model, PROMPTS[0], LENGTH)
    assert outputs["packed"] == outputs["linear"] == outputs["ar"]


def test_gguf_qwen2_reads_its_biases_and_equals_transformers(tmp_path):
    """llama.cpp's qwen2 architecture: q/k rows in transformers' order (NeoX RoPE), biases as F32 vectors."""
    weights = random_weights(seed=7, qkv_bias=True)
    path = write_gguf(tmp_path / "qwen2.gguf", weights, qtype="Q8_0", arch="qwen2")
    source, ours, reference = read_gguf_beside_transformers(path, weights)
    assert source.architecture == "Qwen2ForCausalLM" and source.config["qkv_bias"] is True
    assert torch.equal(
        ours["model.layers.1.self_attn.v_proj.bias"], torch.from_numpy(weights["model.layers.1.self_attn.v_proj.bias"])
    )
    model = load_model(convert(source, tmp_path / "out", dtype="float32"), dtype="float64")
    for prompt in PROMPTS:
        expected = reference_greedy(reference, prompt, LENGTH)
        assert len(set(expected)) > 3
        assert specframe_outputs(model, prompt, LENGTH) == {"ar": expected, "packed": expected, "linear": expected}


def test_gguf_biases_belong_to_qwen2_only(tmp_path):
    """A Llama GGUF with bias tensors is refused (llama.cpp's llama biases are not converted), naming them."""
    from specframe.errors import CheckpointError

    path = write_gguf(tmp_path / "llama.gguf", random_weights(seed=7, qkv_bias=True))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) for a llama model: blk\.0\.attn_q\.bias"):
        read_gguf(path)


def test_a_missing_bias_is_named(tmp_path):
    from specframe.errors import CheckpointError

    weights = random_weights(seed=7, qkv_bias=True)
    del weights["model.layers.1.self_attn.k_proj.bias"]
    path = write_gguf(tmp_path / "qwen2.gguf", weights, arch="qwen2")
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias are missing"):
        read_gguf(path)
