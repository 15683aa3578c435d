"""``convert --quant``: a GGUF's Q8_0/Q4_0/Q4_1 blocks kept byte for byte and run as they are, and what is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from convert_helpers import random_weights, write_gguf
from safetensors import safe_open

from specframe import compose, kernels
from specframe.convert import convert
from specframe.convert.gguf_source import read_gguf
from specframe.errors import ConfigError
from specframe.models import load_model

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"no kernels: {kernels.unavailable_reason()}")


@pytest.fixture(scope="module")
def q4_1_gguf(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("q41") / "m.gguf", random_weights(tied=False, seed=5), qtype="Q4_1")


def _stored(folder) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


@needs_kernels
def test_keep_writes_the_gguf_blocks_byte_for_byte_and_the_model_runs_them(q4_1_gguf, tmp_path):
    import gguf

    folder = convert(read_gguf(q4_1_gguf), tmp_path / "kept", dtype="float32", quant="keep")
    stored = _stored(folder)
    reader = gguf.GGUFReader(str(q4_1_gguf))
    down = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    raw = np.asarray(down.data, dtype=np.uint8).reshape(int(down.shape[1]), -1)
    assert np.array_equal(stored["encoder.layers.1.mlp.down_proj.weight.q4_1"].numpy(), raw)
    assert "encoder.layers.1.mlp.down_proj.weight" not in stored  # not a float copy as well
    assert stored["encoder.embed_tokens.weight"].dtype == torch.float32  # the lookup table stays float
    model = load_model(folder)
    report = model.kernel_report()
    assert report["invariant"] and report["weights"] == ["q4_1"]
    # the blocks run as stored: the same logits as quantizing the float conversion to Q4_1 at load
    plain = convert(read_gguf(q4_1_gguf), tmp_path / "float", dtype="float32")
    quantized = load_model(plain, quant="q4_1")
    prompt = list(range(3, 12))
    kept_out = compose({"model": model, "schedule": "ar", "max_new_tokens": 12}).generate(prompt_ids=prompt)
    again = compose({"model": quantized, "schedule": "ar", "max_new_tokens": 12}).generate(prompt_ids=prompt)
    assert kept_out.output_ids == again.output_ids
    packed = compose({"model": model, "schedule": "packed", "width": 4, "max_new_tokens": 12})
    assert packed.generate(prompt_ids=prompt).output_ids == kept_out.output_ids


@needs_kernels
def test_quantizing_to_another_format_requantizes_from_the_float_values(q4_1_gguf, tmp_path):
    folder = convert(read_gguf(q4_1_gguf), tmp_path / "q8", dtype="float32", quant="q8_0")
    stored = _stored(folder)
    assert stored["encoder.layers.0.self_attn.q_proj.weight.q8_0"].dtype == torch.uint8
    expected = kernels.quantize(read_gguf(q4_1_gguf).tensors["model.layers.0.self_attn.q_proj.weight"](), "q8_0")
    assert torch.equal(stored["encoder.layers.0.self_attn.q_proj.weight.q8_0"], expected)
    assert load_model(folder).kernel_report()["weights"] == ["q8_0"]


def test_keep_without_blocks_and_unknown_formats_are_refused(tmp_path):
    f32 = write_gguf(tmp_path / "f32.gguf", random_weights(tied=False, seed=6), qtype="F32")
    with pytest.raises(ConfigError, match="holds no Q8_0, Q4_0 or Q4_1 matrices"):
        convert(read_gguf(f32), tmp_path / "out", quant="keep")
    with pytest.raises(ConfigError, match="--quant 'q5_k'"):
        convert(read_gguf(f32), tmp_path / "out", quant="q5_k")
    assert not (tmp_path / "out").exists()


def test_quantized_checkpoints_need_the_kernels_and_say_so(q4_1_gguf, tmp_path, monkeypatch):
    folder = convert(read_gguf(q4_1_gguf), tmp_path / "kept", dtype="float32", quant="keep")
    monkeypatch.setenv(kernels.SWITCH, "0")
    with pytest.raises(ConfigError, match="turned off"):
        load_model(folder)
    with pytest.raises(ConfigError, match="float32 or bfloat16 only"):
        monkeypatch.delenv(kernels.SWITCH)
        load_model(folder, dtype="float64")
    with pytest.raises(ConfigError, match="unknown quantization 'q5_k'"):
        load_model(folder, quant="q5_k")
    with pytest.raises(ConfigError, match="quant"):
        compose({"model": load_model(None, dtype="float64"), "quant": "q8_0"})


def test_a_missing_compiler_is_named_with_what_to_install(monkeypatch):
    from specframe.kernels import build

    monkeypatch.setattr(build, "compiler", lambda: None)
    assert "install g++" in build._missing()
