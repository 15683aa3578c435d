"""Every way a checkpoint or a call can be wrong gives an error that names the problem."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from zoo_helpers import causal, run

from specframe.errors import CheckpointError, ConfigError, InputError, NonFiniteWeightsError
from specframe.models import load_model
from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint


@pytest.fixture
def nemotron_copy(tmp_path, nemotron_dir):
    return shutil.copytree(nemotron_dir, tmp_path / "copy")


def _edit_weights(folder, edit) -> None:
    weights = load_file(str(folder / "model.safetensors"))
    edit(weights)
    save_file(weights, str(folder / "model.safetensors"))


def _edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda w: w.pop("encoder.layers.1.mlp.up_proj.weight"),
            r"missing tensor\(s\) encoder\.layers\.1\.mlp\.up_proj\.weight",
        ),
        (
            lambda w: w.update({"encoder.layers.0.self_attn.q_proj.bias": torch.zeros(128)}),
            r"unexpected tensor\(s\) encoder\.layers\.0\.self_attn\.q_proj\.bias",
        ),
        (
            lambda w: w.update({"encoder.norm.weight": torch.ones(63)}),
            r"encoder\.norm\.weight has shape \[63\], expected \[64\]",
        ),
    ],
    ids=["missing", "unexpected", "misshaped"],
)
def test_tensor_mismatches_are_named(nemotron_copy, edit, message):
    _edit_weights(nemotron_copy, edit)
    with pytest.raises(CheckpointError, match=message):
        load_model(nemotron_copy)


def test_setdlm_unknown_tensor_is_named(tmp_path):
    folder = write_random_checkpoint(SETDLM, tmp_path)
    _edit_weights(folder, lambda w: w.update({"backbone.model.model.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"backbone\.model\.model\.extra\.weight"):
        load_model(folder)


def test_tied_head_of_the_wrong_shape(tmp_path):
    folder = write_random_checkpoint(SETDLM, tmp_path)
    _edit_weights(folder, lambda w: w.update({"backbone.model.lm_head.weight": torch.zeros(3, 64)}))
    with pytest.raises(CheckpointError, match=r"tied output layer backbone\.model\.lm_head\.weight"):
        load_model(folder)


def test_truncated_safetensors(nemotron_copy):
    path = nemotron_copy / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="model.safetensors is not a readable safetensors file.*truncated"):
        load_model(nemotron_copy)


def test_truncated_bin(tmp_path):
    folder = write_random_checkpoint(NEMOTRON, tmp_path, weights_format="bin")
    path = folder / "pytorch_model.bin"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="pytorch_model.bin is not a readable PyTorch weight file"):
        load_model(folder)


def test_index_naming_a_missing_shard(tmp_path):
    folder = write_random_checkpoint(NEMOTRON, tmp_path, shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors.*incomplete"):
        load_model(folder)


def test_no_weights(nemotron_copy):
    (nemotron_copy / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights in .*expected model.safetensors"):
        load_model(nemotron_copy)


def test_a_weight_file_that_cannot_be_read_is_not_called_missing(nemotron_copy):
    path = nemotron_copy / "model.safetensors"
    path.unlink()
    path.symlink_to(path.name)  # a link to itself: reading it fails with ELOOP, and is_file() is False
    with pytest.raises(CheckpointError, match=f"{path} is a symbolic link loop; restore or re-download"):
        load_model(nemotron_copy)
    path.unlink()
    path.symlink_to("blobs/gone")  # as a Hub cache whose blob was deleted
    with pytest.raises(CheckpointError, match=f"{path} is a symbolic link to blobs/gone, which does not exist"):
        load_model(nemotron_copy)
    path.unlink()
    path.mkdir()
    with pytest.raises(CheckpointError, match=f"{path} is a folder, not a weight file"):
        load_model(nemotron_copy)


def test_unknown_model_type_lists_known_ones(nemotron_copy):
    _edit_config(nemotron_copy, model_type="llama")
    with pytest.raises(CheckpointError, match=r"model_type 'llama'.*'bd3lm'.*'nemotron_labs_diffusion'") as info:
        load_model(nemotron_copy)
    # a command-line user has no family= to pass: the way forward there is `specframe convert`
    assert f"`specframe convert {nemotron_copy} --out NEW-FOLDER`" in str(info.value)
    assert "from Python, pass family=..." in str(info.value)


def test_missing_config_fields_are_all_named(nemotron_copy):
    _edit_config(nemotron_copy, hidden_size=None, mask_token_id=None)
    with pytest.raises(CheckpointError, match=r"missing field\(s\) hidden_size, mask_token_id"):
        load_model(nemotron_copy)


def test_missing_config_json(nemotron_copy):
    (nemotron_copy / "config.json").unlink()
    with pytest.raises(CheckpointError, match="model config not found"):
        load_model(nemotron_copy)


def test_unsupported_rope_type(nemotron_copy):
    _edit_config(nemotron_copy, rope_parameters={"rope_type": "longrope", "rope_theta": 1e6})
    with pytest.raises(CheckpointError, match="rope type 'longrope'"):
        load_model(nemotron_copy)


@pytest.mark.parametrize("nested", [False, True])
def test_partial_rotary_is_refused(nemotron_copy, nested):
    config = json.loads((nemotron_copy / "config.json").read_text())
    (config["rope_parameters"] if nested else config)["partial_rotary_factor"] = 0.5
    (nemotron_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"partial_rotary_factor=0\.5 \(.*specframe needs full rotary"):
        load_model(nemotron_copy)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("where", "key", "value", "message"),
    [
        (None, "rms_norm_eps", NAN, "rms_norm_eps=nan"),
        (None, "rms_norm_eps", INF, "rms_norm_eps=inf"),
        ("rope_parameters", "mscale", NAN, "rope mscale=nan"),
        ("rope_parameters", "factor", INF, "rope factor=inf"),
        ("rope_parameters", "rope_theta", NAN, "rope_theta=nan"),
        ("rope_parameters", "rope_theta", INF, "rope_theta=inf"),
        ("rope_parameters", "beta_fast", NAN, "rope beta_fast=nan"),
        ("rope_parameters", "llama_4_scaling_beta", NAN, "rope llama_4_scaling_beta=nan"),
    ],
)
def test_non_finite_config_numbers_are_refused(nemotron_copy, where, key, value, message):
    # json writes NaN and Infinity, and Python's json reads them back: they must not load and decode garbage
    config = json.loads((nemotron_copy / "config.json").read_text())
    (config[where] if where else config)[key] = value
    (nemotron_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"config\.json: unsupported value\(s\) {message} \(.*expected a finite"):
        load_model(nemotron_copy)


@pytest.mark.parametrize("value", [NAN, INF])
def test_non_finite_setdlm_backbone_rope_theta_is_refused(tmp_path, value):
    folder = write_random_checkpoint(SETDLM, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["backbone_config"]["rope_theta"] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"rope_theta={value!r} \(expected a finite number > 1\)"):
        load_model(folder)


def test_rope_scaling_alias_and_top_level_theta(nemotron_copy, nemotron_dir):
    config = json.loads((nemotron_copy / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = {"type": rope.pop("rope_type"), **rope}
    (nemotron_copy / "config.json").write_text(json.dumps(config))
    models = [load_model(nemotron_copy), load_model(nemotron_dir)]
    assert torch.equal(*[run(m, m.new_cache(4), [5, 6], [80, 81], causal(2)) for m in models])


def test_setdlm_backbone_sizes_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    folder = write_random_checkpoint(SETDLM, tmp_path / "ckpt", backbone_config="none")
    expected = r"missing field\(s\) hidden_size, .*vocab_size.*backbone_config\.json.*Qwen/Qwen3-1\.7B-Base"
    with pytest.raises(CheckpointError, match=expected):
        load_model(folder)


def test_tokenizer_larger_than_the_model(tmp_path, nemotron_dir):
    folder = write_random_checkpoint(NEMOTRON, tmp_path, vocab_size=400)
    shutil.copy(nemotron_dir / "tokenizer.json", folder / "tokenizer.json")  # a 512-token tokenizer
    with pytest.raises(CheckpointError, match="tokenizer .* produces ids up to 511 .* only 400 entries"):
        load_model(folder)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1}', "is JSON but not a tokenizer.json (no 'model' object"),
        ("[1, 2]", "is JSON but not a tokenizer.json"),
        ('{"version": "1.0", "model": {"type": "BPE"}}', "is not a valid tokenizer.json (Missing vocab/merges"),
        ('{"model": ', "is not valid JSON (Expecting value"),
    ],
)
def test_a_tokenizer_json_that_is_not_a_tokenizer_says_so(nemotron_copy, text, message):
    # tokenizers words each of these as a JSON syntax error ('{"a": 1}': "expected `,` or `}` at line 1 column 5")
    (nemotron_copy / "tokenizer.json").write_text(text)
    with pytest.raises(CheckpointError, match=re.escape(message)) as info:
        load_model(nemotron_copy)
    assert str(nemotron_copy / "tokenizer.json") in str(info.value) and "re-download" in str(info.value)


def test_special_id_outside_the_vocabulary(nemotron_copy):
    _edit_config(nemotron_copy, mask_token_id=600)
    with pytest.raises(CheckpointError, match="mask_token_id=600 outside the model vocabulary of 512"):
        load_model(nemotron_copy)


def test_missing_folder_and_file_instead_of_folder(tmp_path, nemotron_dir):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "absent")
    with pytest.raises(CheckpointError, match="is a file"):
        load_model(nemotron_dir / "config.json")


def test_the_current_folder_is_named_not_dot(tmp_path, nemotron_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)  # holds no config.json: the message said only "config.json does not exist"
    with pytest.raises(CheckpointError, match=f"model config not found: {tmp_path / 'config.json'} does not exist"):
        load_model(".")
    shutil.copytree(nemotron_dir, tmp_path / "m")
    monkeypatch.chdir(tmp_path / "m")
    assert load_model(".").name == str(tmp_path / "m")
    assert load_model("../m").name == "../m"  # a path that names the folder is kept as typed


def test_prompt_beyond_the_context(nemotron64):
    cache = nemotron64.new_cache(4)
    run(nemotron64, cache, [5, 6], [254, 255], causal(2))  # the last position is fine
    with pytest.raises(InputError, match="position id 256 is beyond the model's context of 256 positions"):
        run(nemotron64, cache, [5, 6], [255, 256], causal(2))
    with pytest.raises(InputError, match="position id -1 is negative"):
        run(nemotron64, cache, [5], [-1], causal(1))


def test_token_outside_the_vocabulary(model64):
    with pytest.raises(InputError, match="token id 512 is outside the model's vocabulary"):
        run(model64, model64.new_cache(4), [5, 512], [0, 1], causal(2))


def test_malformed_calls(nemotron64, setdlm64):
    cache = nemotron64.new_cache(4)
    with pytest.raises(InputError, match=r"attention must be a \[2, 2\] bool tensor"):
        run(nemotron64, cache, [5, 6], [0, 1], torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(InputError, match="position_ids shape"):
        run(nemotron64, cache, [5, 6], [0], causal(2))
    with pytest.raises(InputError, match="attend to nothing"):
        run(nemotron64, cache, [5, 6], [0, 1], torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(InputError, match="KV cache .* was not made for this model"):
        run(nemotron64, nemotron64.new_cache(4).__class__(3, 2, 32, 4, torch.float64, "cpu"), [5], [0], causal(1))
    with pytest.raises(InputError, match="output_rows must index"):
        run(nemotron64, cache, [5, 6], [0, 1], causal(2), output_rows=torch.tensor([2]))


def test_unavailable_device(nemotron_dir):
    device = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    with pytest.raises(ConfigError, match=f"'{device}' is unavailable"):
        load_model(nemotron_dir, device=device)


def test_invalid_device(nemotron_dir):
    with pytest.raises(ConfigError, match="invalid device 'gpu0'"):
        load_model(nemotron_dir, device="gpu0")


@pytest.mark.parametrize("dtype", ["int8", "float8", torch.int64, torch.complex64])
def test_unsupported_dtype(nemotron_dir, dtype):
    with pytest.raises(ConfigError, match="unsupported dtype"):
        load_model(nemotron_dir, dtype=dtype)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_named_at_load(nemotron_copy, value):
    name = "encoder.layers.1.mlp.down_proj.weight"

    def poison(weights):
        weights[name] = weights[name].clone()
        weights[name][3, 5] = value

    _edit_weights(nemotron_copy, poison)
    kind = "1 NaN and 0 infinite" if value != value else "0 NaN and 1 infinite"
    with pytest.raises(NonFiniteWeightsError, match=rf"weight\(s\) {name} \({kind} of \d+ values\).*damaged"):
        load_model(nemotron_copy)


def test_weights_that_overflow_the_requested_dtype_say_so(nemotron_copy):
    name = "encoder.norm.weight"
    _edit_weights(nemotron_copy, lambda w: w.update({name: torch.full_like(w[name], 1e6)}))
    assert load_model(nemotron_copy).dtype == torch.float32  # finite in float32: loads
    with pytest.raises(NonFiniteWeightsError, match=rf"{name} \(0 NaN and 64 infinite.*do not fit float16"):
        load_model(nemotron_copy, dtype="float16")


def test_a_large_but_finite_sum_is_not_an_error(nemotron_copy):
    name = "encoder.norm.weight"  # 64 values of 6e4 fit float16, their sum (3.8e6) does not
    _edit_weights(nemotron_copy, lambda w: w.update({name: torch.full_like(w[name], 6e4)}))
    model = load_model(nemotron_copy, dtype="float16")
    assert torch.isinf(model.network.body.norm.weight.sum()) and torch.isfinite(model.network.body.norm.weight).all()


@pytest.mark.parametrize("saved", ["int8", "bfloat_16", "auto"])
def test_an_unknown_saved_dtype_is_refused_on_the_cpu(nemotron_copy, saved):
    _edit_config(nemotron_copy, torch_dtype=saved)
    with pytest.raises(CheckpointError, match=f"config.json has torch_dtype '{saved}'.*--dtype"):
        load_model(nemotron_copy)
    assert load_model(nemotron_copy, dtype="float32").dtype == torch.float32  # an explicit dtype decides


@pytest.mark.parametrize("saved", ["bfloat16", "torch.float16", "Float32"])
def test_known_saved_dtypes_load(nemotron_copy, saved):
    _edit_config(nemotron_copy, torch_dtype=saved)
    assert load_model(nemotron_copy).dtype == torch.float32  # the CPU default
