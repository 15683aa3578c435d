"""Loading checkpoints in the Hub layout: local folders, the Hub cache offline, formats, dtypes, families."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from zoo_helpers import causal, run

from specframe.errors import CheckpointError, UnknownPluginError
from specframe.models import ModelBackend, load_model
from specframe.models.hub import DEFAULT_MODEL, bundled_model, bundled_model_names, model_display_name
from specframe.testing.models import NEMOTRON, SETDLM, small_vocabulary, write_random_checkpoint

TOKENS = [5, 17, 300, 42, 7]


def _logits(model: ModelBackend) -> torch.Tensor:
    return run(model, model.new_cache(8), TOKENS, range(5), causal(5))


def test_nemotron_local_folder(nemotron64):
    assert nemotron64.family == NEMOTRON
    assert (nemotron64.mask_token_id, nemotron64.eos_token_ids, nemotron64.bos_token_id) == (100, (11,), 1)
    assert (nemotron64.num_layers, nemotron64.num_kv_heads, nemotron64.head_dim) == (2, 2, 32)
    assert nemotron64.max_positions == 255
    assert nemotron64.dtype == torch.float64 and not nemotron64.has_adapter
    ids = nemotron64.encode_prompt("Hello world")
    assert ids[0] == 1 and nemotron64.decode(ids[1:]) == "Hello world"


def test_setdlm_local_folder(setdlm64):
    tokenizer = setdlm64.tokenizer
    assert setdlm64.family == SETDLM
    assert setdlm64.mask_token_id == tokenizer.token_to_id("<|fim_middle|>")
    assert set(setdlm64.eos_token_ids) == {tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")}
    assert setdlm64.bos_token_id is None
    assert setdlm64.encode_prompt("Hi there") == tokenizer.encode("Hi there")


@pytest.mark.parametrize(("shards", "weights_format"), [(3, "safetensors"), (1, "bin"), (2, "bin")])
@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
def test_weight_formats_load_identically(tmp_path, family, shards, weights_format):
    single = load_model(write_random_checkpoint(family, tmp_path / "single", seed=3), dtype="float64")
    folder = write_random_checkpoint(family, tmp_path / "other", seed=3, shards=shards, weights_format=weights_format)
    other = load_model(folder, dtype="float64")
    assert torch.equal(_logits(single), _logits(other))


def test_setdlm_backbone_sizes_from_backbone_config_json(tmp_path, setdlm64):
    folder = write_random_checkpoint(SETDLM, tmp_path, seed=2, backbone_config="file")
    assert "hidden_size" not in json.loads((folder / "config.json").read_text())["backbone_config"]
    assert torch.equal(_logits(load_model(folder, dtype="float64")), _logits(setdlm64))


def test_setdlm_keep_bottom_n_layers(tmp_path):
    folder = write_random_checkpoint(SETDLM, tmp_path, seed=2, num_hidden_layers=3)
    config = json.loads((folder / "config.json").read_text())
    config["backbone_config"]["keep_bottom_n_layers"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    weights = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if ".layers.2." not in k}
    save_file(weights, str(folder / "model.safetensors"))
    assert load_model(folder).num_layers == 2


def test_setdlm_tied_head_and_buffers_are_accepted(tmp_path, setdlm64):
    folder = write_random_checkpoint(SETDLM, tmp_path, seed=2)
    weights = load_file(str(folder / "model.safetensors"))
    weights["backbone.model.lm_head.weight"] = weights["backbone.model.model.embed_tokens.weight"].clone()
    weights["backbone.static_attention_mask"] = torch.ones(4, 4)
    weights["backbone.model.model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(16)
    save_file(weights, str(folder / "model.safetensors"))
    assert torch.equal(_logits(load_model(folder, dtype="float64")), _logits(setdlm64))


def test_plain_qwen3_layout_loads_as_setdlm_when_asked(tmp_path, setdlm64, setdlm_dir):
    """A transformers-style Qwen3 folder (``model.*``, model_type qwen3) loads with ``family="setdlm"``."""
    bd3lm = json.loads((setdlm_dir / "config.json").read_text())
    config = {k: v for k, v in bd3lm["backbone_config"].items() if not k.startswith("_")}
    config.update(model_type="qwen3", mask_token_id=bd3lm["mask_token_id"], eos_token_id=bd3lm["eos_token_id"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = load_file(str(setdlm_dir / "model.safetensors"))
    save_file({k.replace("backbone.model.", "", 1): v for k, v in weights.items()}, str(tmp_path / "model.safetensors"))
    shutil.copy(setdlm_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    with pytest.raises(CheckpointError, match="family="):
        load_model(tmp_path)
    assert torch.equal(_logits(load_model(tmp_path, dtype="float64", family="setdlm")), _logits(setdlm64))


def test_setdlm_special_ids_fall_back_to_the_tokenizer(tmp_path, setdlm64):
    folder = write_random_checkpoint(SETDLM, tmp_path, seed=2, mask_token_id=None, eos_token_id=None)
    model = load_model(folder)
    assert model.mask_token_id == setdlm64.mask_token_id
    assert set(model.eos_token_ids) == set(setdlm64.eos_token_ids)


@pytest.mark.parametrize(("family", "backbone_config"), [(NEMOTRON, "inline"), (SETDLM, "inline"), (SETDLM, "file")])
def test_a_small_vocabulary_loads_with_its_documented_special_ids(tmp_path, family, backbone_config):
    """The last id is the mask token, the one before it EOS (SetDLM's EOS used to land in backbone_config)."""
    vocabulary = small_vocabulary(family, 24)
    folder = write_random_checkpoint(family, tmp_path, tokenizer=False, backbone_config=backbone_config, **vocabulary)
    model = load_model(folder)
    assert (model.vocab_size, model.mask_token_id, model.eos_token_ids) == (24, 23, (22,))
    if family == SETDLM:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        assert config["eos_token_id"] == 22


def _hub_cache(tmp_path: Path, source: Path, repo_id: str, revision: str) -> Path:
    cache = tmp_path / "hub"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(source, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return cache


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
def test_load_by_repo_id_from_the_hub_cache_offline(tmp_path, monkeypatch, family, nemotron_dir, setdlm_dir):
    source = nemotron_dir if family == NEMOTRON else setdlm_dir
    revision = "0123456789abcdef0123456789abcdef01234567"
    cache = _hub_cache(tmp_path, source, "specframe-test/tiny", revision)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = load_model("specframe-test/tiny", dtype="float64")
    assert model.name == "specframe-test/tiny" and model.family == family
    local = load_model(source, dtype="float64")
    assert torch.equal(_logits(model), _logits(local))
    assert load_model("specframe-test/tiny", revision=revision).family == family
    if family == NEMOTRON:
        assert load_model("specframe-test/tiny", adapter=True).has_adapter


def test_offline_repo_missing_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        load_model("specframe-test/absent")


def test_default_dtypes(nemotron_dir):
    assert load_model(nemotron_dir).dtype == torch.float32
    bf16 = load_model(nemotron_dir, dtype="bf16")
    assert bf16.network.body.embed_tokens.weight.dtype == torch.bfloat16
    assert _logits(bf16).dtype == torch.float32  # half-precision models return float32 logits
    assert load_model(nemotron_dir, dtype=torch.float16).dtype == torch.float16


def test_weights_are_not_left_on_the_meta_device(nemotron64):
    tensors = [*nemotron64.network.parameters(), *nemotron64.network.buffers()]
    assert all(t.device.type == "cpu" and not t.requires_grad for t in tensors)


def test_family_can_be_forced_and_must_exist(nemotron_dir):
    assert load_model(nemotron_dir, family=NEMOTRON).family == NEMOTRON
    with pytest.raises(UnknownPluginError, match="no-such-family"):
        load_model(nemotron_dir, family="no-such-family")


def test_default_model_is_bundled_or_clearly_missing():
    try:
        folder = bundled_model()
    except CheckpointError as exc:
        assert "specframe/assets/models/default" in str(exc)
        with pytest.raises(CheckpointError, match="ships no bundled model"):
            load_model()
    else:
        assert (folder / "config.json").is_file()


def test_bundled_models_load_by_name_and_unknown_names_list_them(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    names = bundled_model_names()
    assert DEFAULT_MODEL in names and "setdlm-stdlib-tiny" in names
    assert load_model("setdlm-stdlib-tiny").family == SETDLM
    with pytest.raises(CheckpointError, match="bundled models: nemotron-stdlib-tiny, setdlm-stdlib-tiny"):
        load_model("setdlm-stdlib-tinny")


def test_reports_name_a_bundled_model_not_this_machines_path(tmp_path):
    assert model_display_name(str(bundled_model())) == f"{DEFAULT_MODEL} (bundled)"
    assert model_display_name("nvidia/Nemotron-Labs-Diffusion-8B") == "nvidia/Nemotron-Labs-Diffusion-8B"
    own = tmp_path / "assets" / "models" / "mine"  # a user's folder that only looks similar keeps its path
    assert model_display_name(str(own)) == str(own)


def test_script_writes_loadable_checkpoints(tmp_path):
    script = Path(__file__).parents[2] / "scripts" / "make_random_checkpoints.py"
    namespace = runpy.run_path(str(script))
    namespace["main"]([str(tmp_path), "--lora-rank", "2", "--shards", "2", "--set", "num_hidden_layers=3"])
    assert load_model(tmp_path / NEMOTRON, adapter=True).num_layers == 3
    assert load_model(tmp_path / SETDLM).num_layers == 3


def test_without_network_a_cached_repo_loads_and_a_missing_one_fails_at_once(
    tmp_path, monkeypatch, nemotron_dir, no_network
):
    cache = _hub_cache(tmp_path, nemotron_dir, "specframe-test/tiny", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert load_model("specframe-test/tiny").family == NEMOTRON  # from the cache, as offline mode would
    with pytest.raises(CheckpointError, match="not in the Hugging Face cache.*Hub at 127.0.0.1 cannot be reached"):
        load_model("specframe-test/absent")
    assert no_network == [True, True]  # the cache only: no request that huggingface_hub would retry for 30 s
