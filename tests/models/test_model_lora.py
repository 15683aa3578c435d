"""The proposal-only LoRA changes exactly the rows it is applied to."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from zoo_helpers import causal, run

from oracles import network_logits
from specframe import kernels
from specframe.errors import CheckpointError, ConfigError, NonFiniteWeightsError
from specframe.models import load_model
from specframe.models.lora import read_adapter_config

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


# -- an adapter on o_proj and down_proj ----------------------------------------------------------------------
PROPOSAL = torch.tensor([False] * 4 + [True] * 4)


@pytest.mark.parametrize(
    ("dtype", "kernels_on"), [("float64", False), ("float32", True), ("float32", False)], ids=["f64", "f32-ours", "f32"]
)
def test_both_targets_change_only_the_marked_rows(nemotron_dir, nemotron_mlp_dir, dtype, kernels_on, monkeypatch):
    if not kernels_on:
        monkeypatch.setenv(kernels.SWITCH, "0")
    both = load_model(nemotron_mlp_dir, dtype=dtype, adapter=True)
    attention_only = load_model(nemotron_dir, dtype=dtype, adapter=True)
    base = load_model(nemotron_mlp_dir, dtype=dtype, adapter=False)
    invariant = kernels_on and dtype == "float32" and kernels.available()
    assert both.inference.weights.invariant == invariant  # the fused adapter operator runs exactly then
    layers = both.network.body.layers
    assert all(layer.mlp.down_lora is not None and layer.self_attn.o_lora is not None for layer in layers)
    assert layers[0].mlp.down_lora.lora_A.shape == (6, layers[0].mlp.down_proj.in_features)  # rank_pattern
    plain = _packed_call(base, None)
    got = _packed_call(both, PROPOSAL)
    assert torch.equal(got[:4], plain[:4])  # verifier rows: bit for bit the model without an adapter
    assert not torch.allclose(got[4:], plain[4:])
    assert not torch.allclose(got[4:], _packed_call(attention_only, PROPOSAL)[4:])  # down_proj's adapter acts
    assert torch.equal(_packed_call(both, None), plain)
    assert torch.equal(_packed_call(both, torch.zeros(8, dtype=torch.bool)), plain)


def test_both_targets_equal_merged_weights(nemotron_mlp_dir):
    adapted = load_model(nemotron_mlp_dir, dtype="float64", adapter=True)
    config = json.loads((nemotron_mlp_dir / "linear_spec_lora" / "adapter_config.json").read_text())
    scales = {
        "self_attn.o_proj": config["lora_alpha"] / config["r"],
        "mlp.down_proj": config["alpha_pattern"]["down_proj"] / config["rank_pattern"]["down_proj"],
    }
    assert scales["self_attn.o_proj"] != scales["mlp.down_proj"] or config["r"] != config["rank_pattern"]["down_proj"]
    lora = load_file(str(nemotron_mlp_dir / "linear_spec_lora" / "adapter_model.safetensors"))
    merged = load_model(nemotron_mlp_dir, dtype="float64")
    for i, layer in enumerate(merged.network.body.layers):
        for module, scale in scales.items():
            key = f"base_model.model.encoder.layers.{i}.{module}"
            delta = lora[f"{key}.lora_B.weight"].double() @ lora[f"{key}.lora_A.weight"].double()
            layer.get_submodule(module).weight += scale * delta
    expected = _packed_call(merged, None, prefill=adapted)[4:]
    torch.testing.assert_close(_packed_call(adapted, PROPOSAL)[4:], expected, rtol=0, atol=1e-10)


def test_the_module_path_applies_down_proj_to_the_marked_rows_only(nemotron_mlp_dir):
    both = load_model(nemotron_mlp_dir, dtype="float64", adapter=True)
    base = load_model(nemotron_mlp_dir, dtype="float64")
    ids = torch.tensor([1, 40, 41, 42, 43, 44, both.mask_token_id, both.mask_token_id])
    positions = torch.arange(8)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    mask[6:, 6:] = True
    rows = torch.tensor([False] * 6 + [True] * 2)
    got, plain = network_logits(both, ids, positions, mask, rows), network_logits(base, ids, positions, mask)
    assert torch.equal(got[:6], plain[:6])
    assert not torch.allclose(got[6:], plain[6:])
    for layer in both.network.body.layers:  # without the MLP adapter the marked rows change less
        layer.mlp.down_lora = None
    assert not torch.allclose(network_logits(both, ids, positions, mask, rows)[6:], got[6:])


def test_a_down_proj_only_adapter_loads(nemotron_mlp_dir, tmp_path):
    folder = _adapter_copy(nemotron_mlp_dir, tmp_path / "down", drop="self_attn.o_proj")
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["down_proj"]}))
    model = load_model(nemotron_mlp_dir, dtype="float64", adapter=folder)
    layers = model.network.body.layers
    assert all(layer.self_attn.o_lora is None and layer.mlp.down_lora is not None for layer in layers)
    base = load_model(nemotron_mlp_dir, dtype="float64")
    got, plain = _packed_call(model, PROPOSAL), _packed_call(base, None)
    assert torch.equal(got[:4], plain[:4]) and not torch.allclose(got[4:], plain[4:])


def _adapter_copy(model_dir, folder, drop=None, change=None):
    """The model's adapter copied to ``folder``, its tensors whose name holds ``drop`` left out, ``change`` applied."""
    from safetensors.torch import save_file

    source = model_dir / "linear_spec_lora"
    folder.mkdir()
    (folder / "adapter_config.json").write_text((source / "adapter_config.json").read_text())
    tensors = load_file(str(source / "adapter_model.safetensors"))
    tensors = {k: v for k, v in tensors.items() if not drop or drop not in k}
    save_file(change(tensors) if change else tensors, str(folder / "adapter_model.safetensors"))
    return folder


DOWN = "base_model.model.encoder.layers.1.mlp.down_proj"


@pytest.mark.parametrize(
    ("drop", "change", "config", "message"),
    [
        (f"{DOWN}.lora_B", None, {}, "layer 1 down_proj has no lora_B"),
        (
            None,
            lambda t: {**t, f"{DOWN}.lora_A.weight": t[f"{DOWN}.lora_A.weight"][:5]},
            {},
            rf"{DOWN}.lora_A.weight has shape \[5, 128\], expected \[6, 128\] \(rank_pattern\['down_proj'\]=6\)",
        ),
        (None, None, {"rank_pattern": {}}, r"has shape \[6, 128\], expected \[4, 128\] \(r=4\)"),
        (None, None, {"target_modules": ["o_proj", "gate_proj"]}, "target_modules entry 'gate_proj'"),
        (None, None, {"target_modules": ["o_proj"]}, "down_proj LoRA tensors but target_modules does not name"),
        ("mlp.down_proj", None, {}, "target_modules names down_proj but there are no down_proj LoRA tensors"),
        (
            None,
            lambda t: {**t, "base_model.model.encoder.layers.0.mlp.gate_proj.lora_A.weight": torch.zeros(6, 64)},
            {},
            "unexpected tensor.*gate_proj",
        ),
        (None, None, {"rank_pattern": {"down_proj": 0}}, r"rank_pattern entries \{'down_proj': 0\}"),
        (None, None, {"alpha_pattern": ["down_proj"]}, "alpha_pattern=.*expected a dict"),
    ],
    ids=["missing-half", "wrong-rank", "no-pattern", "gate-target", "undeclared", "absent", "gate-tensor", "rank-0"]
    + ["list"],
)
def test_bad_two_target_adapters_are_refused(nemotron_mlp_dir, tmp_path, drop, change, config, message):
    folder = _adapter_copy(nemotron_mlp_dir, tmp_path / "bad", drop, change)
    stored = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**stored, **config}))
    with pytest.raises(CheckpointError, match=message):
        load_model(nemotron_mlp_dir, dtype="float64", adapter=folder)


def test_rank_and_alpha_patterns_are_matched_as_peft_matches_them():
    config = {"r": 8, "lora_alpha": 16, "target_modules": ["o_proj", "down_proj"]}
    config |= {"rank_pattern": {"down_proj": 4, "encoder.layers.1.mlp.down_proj": 2}, "alpha_pattern": {"o_proj": 4}}
    read = read_adapter_config(config, "here")
    assert read.targets == ("o_proj", "down_proj")
    assert read.module("encoder.layers.0.self_attn.o_proj") == (8, 0.5, "r=8")
    assert read.module("encoder.layers.0.mlp.down_proj") == (4, 4.0, "rank_pattern['down_proj']=4")
    exact = read.module("encoder.layers.1.mlp.down_proj")  # the full name wins over the shorter pattern
    assert exact == (2, 8.0, "rank_pattern['encoder.layers.1.mlp.down_proj']=2")
    assert read.module("encoder.layers.0.mlp.xdown_proj")[0] == 8  # a pattern matches after a dot only
    rs = read_adapter_config({**config, "use_rslora": True}, "here")
    assert rs.module("encoder.layers.0.mlp.down_proj")[1] == pytest.approx(16 / 2)
    regex = read_adapter_config({**config, "target_modules": r".*\.(o_proj|down_proj)"}, "here", "encoder")
    assert regex.targets == ("o_proj", "down_proj")
    assert read_adapter_config({**config, "target_modules": "o_proj"}, "here").targets == ("o_proj",)
    with pytest.raises(CheckpointError, match=r"target_modules entry '.\*q_proj'"):
        read_adapter_config({**config, "target_modules": ".*q_proj"}, "here")


def _with_acceptance(nemotron_dir, tmp_path, content: str):
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(nemotron_dir, folder)
    (folder / "linear_spec_lora" / "specframe_acceptance.json").write_text(content, encoding="utf-8")
    return folder


def test_a_drafter_s_measured_acceptance_loads_with_it_and_becomes_width_auto_s_prior(nemotron_dir, tmp_path):
    from specframe import compose
    from specframe.auto.stats import FALLOFF, default_prior

    folder = _with_acceptance(nemotron_dir, tmp_path, '{"by_offset": [0.9, 0.7, 0.35]}')
    assert load_model(folder, dtype="float64", adapter=False).drafter_acceptance is None  # not without its adapter
    model = load_model(folder, dtype="float64", adapter=True)
    assert model.drafter_acceptance == (0.9, 0.7, 0.35)
    cost = {"tau": 1.0, "delta": 0.03}
    decoder = compose({"model": model, "schedule": "packed", "width": "auto", "max_new_tokens": 4, "cost": cost})
    decoder.generate(prompt_ids=PREFIX)
    base = decoder.schedule.learned.base_prior
    assert base[1:4] == [0.9, 0.7, 0.35] and base[4] == pytest.approx(FALLOFF * 0.35)
    neutral = compose({"model": load_model(nemotron_dir, dtype="float64", adapter=True), "schedule": "packed",
                       "width": "auto", "max_new_tokens": 4, "cost": cost})  # fmt: skip
    neutral.generate(prompt_ids=PREFIX)
    assert neutral.schedule.learned.base_prior is None
    assert neutral.schedule.learned.stats.base == default_prior(neutral.schedule.learned.size)


@pytest.mark.parametrize(
    "content", ['{"by_offset": [0.5, 1.5]}', '{"by_offset": []}', '{"by_offset": "0.5"}', '{"by_offset": [NaN]}', "{"]
)
def test_a_malformed_acceptance_file_is_refused_by_name(nemotron_dir, tmp_path, content):
    folder = _with_acceptance(nemotron_dir, tmp_path, content)
    with pytest.raises(CheckpointError, match="specframe_acceptance.json"):
        load_model(folder, dtype="float64", adapter=True)
