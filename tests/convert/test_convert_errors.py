"""Conversion errors: each names the problem, and nothing is left where the model would have been written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from convert_helpers import leftovers, random_weights, write_gguf
from gguf import GGUFValueType
from safetensors.torch import load_file, save_file

from specframe.convert import convert
from specframe.convert.gguf_source import read_gguf
from specframe.convert.hf_source import read_transformers
from specframe.errors import CheckpointError, ConfigError, OutputError


@pytest.fixture
def llama_source(converted, tmp_path) -> Path:
    """A writable copy of the Llama transformers checkpoint."""
    return Path(shutil.copytree(converted("llama").source, tmp_path / "source"))


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "model.gguf", random_weights(seed=5), qtype="Q8_0")


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _convert_fails(read, out: Path, error: type[Exception], match: str, **kwargs) -> None:
    """Reading and converting raise ``error`` matching ``match``; ``out`` and any staging folder are absent."""
    with pytest.raises(error, match=match):
        convert(read(), out, **{"dtype": "float32", **kwargs})
    assert leftovers(out) == []


@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "Qwen2MoeForCausalLM"])
def test_unsupported_transformers_architecture(llama_source, tmp_path, architecture):
    _edit_config(llama_source, architectures=[architecture])
    _convert_fails(lambda: read_transformers(llama_source), tmp_path / "out", CheckpointError, architecture)


@pytest.mark.parametrize(("arch", "match"), [("qwen2moe", "'qwen2moe' is not supported"), ("gpt2", "'gpt2'")])
def test_unsupported_gguf_architecture(tmp_path, arch, match):
    path = write_gguf(tmp_path / "model.gguf", random_weights(seed=5), arch=arch)
    _convert_fails(lambda: read_gguf(path), tmp_path / "out", CheckpointError, match)


def test_unsupported_quantization_fails_while_writing_and_leaves_nothing(tmp_path):
    """Q8_K (llama.cpp's intermediate type) has no dequantizer in the gguf package; the failure comes from the
    last layer's tensor, after others were staged."""
    weights = random_weights(seed=5)
    name = "model.layers.1.mlp.down_proj.weight"
    rows, cols = weights.pop(name).shape
    blocks = np.zeros((rows, cols // 256 * 292), dtype=np.uint8)  # 292 bytes per 256 values
    path = write_gguf(tmp_path / "model.gguf", weights, raw_tensors={name: (blocks, "Q8_K")})
    source = read_gguf(path)
    _convert_fails(lambda: source, tmp_path / "out", CheckpointError, r"blk\.1\.ffn_down\.weight.*Q8_K")


@pytest.mark.parametrize("keep", [0.0002, 0.05, 0.5, 0.999])  # in the header, in the vocabulary, in the tensors
def test_truncated_gguf(small_gguf, tmp_path, keep):
    data = small_gguf.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    _convert_fails(lambda: read_gguf(path), tmp_path / "out", CheckpointError, "cut.gguf")


def test_gguf_missing_a_size(tmp_path):
    path = write_gguf(tmp_path / "model.gguf", random_weights(seed=5), metadata={"llama.block_count": None})
    _convert_fails(lambda: read_gguf(path), tmp_path / "out", CheckpointError, "llama.block_count")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("llama.rope.scaling.type", "linear", "RoPE scaling 'linear'"),
        ("tokenizer.ggml.model", "t5", "tokenizer model 't5' is not supported.*from its transformers checkpoint"),
    ],
)
def test_gguf_unsupported_string_metadata(tmp_path, key, value, message):
    metadata = {key: (value, GGUFValueType.STRING)}
    path = write_gguf(tmp_path / "model.gguf", random_weights(seed=5), metadata=metadata)
    _convert_fails(lambda: read_gguf(path), tmp_path / "out", CheckpointError, message)


def test_gguf_unknown_pre_tokenizer(tmp_path):
    path = write_gguf(tmp_path / "model.gguf", random_weights(seed=5), pre="made-up")
    _convert_fails(lambda: read_gguf(path), tmp_path / "out", CheckpointError, "pre-tokenizer 'made-up'")


def test_transformers_folder_without_tokenizer(llama_source, tmp_path):
    (llama_source / "tokenizer.json").unlink()
    _convert_fails(lambda: read_transformers(llama_source), tmp_path / "out", CheckpointError, "no tokenizer.json")


def test_transformers_folder_without_weights(llama_source, tmp_path):
    (llama_source / "model.safetensors").unlink()
    _convert_fails(lambda: read_transformers(llama_source), tmp_path / "out", CheckpointError, "no safetensors")


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
    ],
)  # fmt: skip
def test_rope_scaling_is_refused(llama_source, tmp_path, scaling):
    _edit_config(llama_source, **scaling)
    kind = next(iter(scaling.values())).get("rope_type", "linear")
    _convert_fails(lambda: read_transformers(llama_source), tmp_path / "out", CheckpointError, f"RoPE scaling '{kind}'")


@pytest.mark.parametrize("field", ["attention_bias", "mlp_bias"])
def test_biases_beyond_qkv_are_refused(llama_source, tmp_path, field):
    """Llama's attention_bias puts a bias on o_proj too; only Qwen2's q/k/v biases convert."""
    _edit_config(llama_source, **{field: True})
    message = f"{field}=True .*query, key and value projections only"
    _convert_fails(lambda: read_transformers(llama_source), tmp_path / "out", CheckpointError, message)


@pytest.mark.parametrize(
    "change", [{"partial_rotary_factor": 0.5}, {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                                    "partial_rotary_factor": 0.25}}],
)  # fmt: skip
def test_partial_rotary_is_refused(llama_source, tmp_path, change):
    _edit_config(llama_source, **change)
    factor = change.get("partial_rotary_factor", 0.25)
    message = f"partial_rotary_factor={factor} .*specframe needs full rotary embeddings"
    _convert_fails(lambda: read_transformers(llama_source), tmp_path / "out", CheckpointError, message)


def test_full_rotary_factor_converts(llama_source):
    _edit_config(llama_source, partial_rotary_factor=1.0)
    assert read_transformers(llama_source).config["head_dim"] == 16


def test_gguf_partial_rotary_is_refused(tmp_path):
    metadata = {"llama.rope.dimension_count": (32, GGUFValueType.UINT32)}  # of a 64-dimension head
    path = write_gguf(tmp_path / "model.gguf", random_weights(seed=5), metadata=metadata)
    message = "llama.rope.dimension_count is 32, but a head has 64 dimensions.*specframe needs full rotary"
    _convert_fails(lambda: read_gguf(path), tmp_path / "out", CheckpointError, message)


def test_transformers_qwen2_missing_a_bias(converted, tmp_path):
    source = Path(shutil.copytree(converted("qwen2").source, tmp_path / "source"))
    tensors = load_file(str(source / "model.safetensors"))
    del tensors["model.layers.0.self_attn.v_proj.bias"]
    save_file(tensors, str(source / "model.safetensors"), metadata={"format": "pt"})
    message = r"Qwen2ForCausalLM has query, key and value biases, .*model\.layers\.0\.self_attn\.v_proj\.bias"
    _convert_fails(lambda: read_transformers(source), tmp_path / "out", CheckpointError, message)


def test_qwen_sliding_window_caps_the_context_only_when_switched_on(converted, tmp_path):
    source = Path(shutil.copytree(converted("qwen2").source, tmp_path / "source"))
    _edit_config(source, sliding_window=64, use_sliding_window=False)
    assert read_transformers(source).config["max_position_embeddings"] == 256
    _edit_config(source, use_sliding_window=True)
    assert read_transformers(source).config["max_position_embeddings"] == 64


def test_nan_weight_fails_while_writing_and_leaves_nothing(llama_source, tmp_path):
    tensors = load_file(str(llama_source / "model.safetensors"))
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
    save_file(tensors, str(llama_source / "model.safetensors"), metadata={"format": "pt"})
    source = read_transformers(llama_source)
    _convert_fails(lambda: source, tmp_path / "out", CheckpointError, r"model\.layers\.1\.mlp\.down_proj\.weight.*NaN")


def test_infinite_gguf_weight(tmp_path):
    weights = random_weights(seed=5)
    weights["model.norm.weight"][7] = np.inf
    path = write_gguf(tmp_path / "model.gguf", weights)
    _convert_fails(lambda: read_gguf(path), tmp_path / "out", CheckpointError, r"model\.norm\.weight.*infinite")


def test_existing_out_is_kept_without_overwrite(converted, tmp_path):
    source = read_transformers(converted("llama").source)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already there.*overwrite"):
        convert(source, out, dtype="float32")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    file = tmp_path / "a-file"
    file.write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="a file is already there, and a converted model is a folder") as info:
            convert(source, file, dtype="float32", overwrite=overwrite)
        assert "pass --overwrite" not in str(info.value)  # it would not help: --overwrite replaces folders only
        assert ("--overwrite replaces only a model folder" in str(info.value)) is overwrite
    assert file.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "out"]  # no staging folder either
    convert(source, out, dtype="float32", overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()


def test_mask_token_by_name(converted, tmp_path):
    source = read_transformers(converted("llama").source)
    _convert_fails(lambda: source, tmp_path / "out", ConfigError, "'<\\|nope\\|>' is not in the model's vocabulary",
                   mask_token="<|nope|>")  # fmt: skip
    folder = convert(source, tmp_path / "named", dtype="float32", mask_token="<|im_start|>")
    config = json.loads((folder / "config.json").read_text())
    ids = {a["content"]: a["id"] for a in source.tokenizer_json["added_tokens"]}
    assert config["mask_token_id"] == ids["<|im_start|>"]


def test_no_free_control_token(converted, tmp_path):
    source = read_transformers(converted("llama").source)
    source.control_tokens = [source.special["eos_token_id"]]
    _convert_fails(lambda: source, tmp_path / "out", ConfigError, "no unused control token")


def test_unknown_dtype(converted, tmp_path):
    source = read_transformers(converted("llama").source)
    _convert_fails(lambda: source, tmp_path / "out", ConfigError, "'float8'", dtype="float8")


def test_out_under_a_file_is_an_output_error(converted, tmp_path):
    source = read_transformers(converted("llama").source)
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    with pytest.raises(OutputError, match="a-file"):
        convert(source, blocker / "out", dtype="float32")
    assert blocker.read_text() == "mine"


def test_interrupted_conversion_leaves_nothing(converted, tmp_path):
    source = read_transformers(converted("llama").source)
    name = "model.layers.1.mlp.down_proj.weight"

    def interrupted():
        raise KeyboardInterrupt

    source.tensors[name] = interrupted
    with pytest.raises(KeyboardInterrupt):
        convert(source, tmp_path / "out", dtype="float32")
    assert leftovers(tmp_path / "out") == []
