"""Composing decoders from plain configs: every bad value gets an error naming what is wrong and what to do."""

from __future__ import annotations

import pytest

from decoding_helpers import NEMOTRON, SETDLM, eos_ids, generate, tiny_model
from specframe import DecoderConfig, compose
from specframe.errors import ConfigError, InputError, UnknownPluginError


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfg")
    return {f: tiny_model(f, root / f, vocab=24, seed=1, dtype="float32") for f in (NEMOTRON, SETDLM)}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"widht": 8}, "unknown config key(s) 'widht' (did you mean 'width'?); valid keys: model, schedule"),
        ({"colour": 1}, "unknown config key(s) 'colour'; valid keys: model, schedule"),
        ({"width": 0}, "width must be >= 1, got 0"),
        ({"width": "8"}, "width must be an integer or \"auto\", got '8'"),
        ({"width": "wide"}, "width must be an integer or \"auto\", got 'wide'"),
        ({"cost": 0.007}, "cost must be None (measure this machine), a CostModel or a mapping"),
        ({"cost": {"tau": 0.007}}, "cost model needs 'delta'"),
        ({"cost": {"tau": -1, "delta": 0.1}}, "cost model tau must be a number >= 0"),
        ({"cost": {"tau": float("nan"), "delta": 0.1}}, "cost model tau must be a number >= 0 and finite"),
        ({"cost": {"tau": 0.1, "delta": float("inf")}}, "cost model delta must be a number >= 0 and finite"),
        ({"threads": 10**6}, "threads 1000000 is more than the"),
        ({"threads": "2"}, "threads must be a positive integer, got '2'"),
        ({"cost": {"tau": 0.1, "delta": 0.1, "rho": 1}}, "cost model: unknown key(s) rho"),
        ({"width": True}, "width must be an integer"),
        ({"max_new_tokens": -1}, "max_new_tokens must be >= 1"),
        ({"seed": -2}, "seed must lie in [0, 2**64 - 1]"),
        ({"schedule": ""}, "schedule is an empty string"),
        ({"schedule": {"threshold": 0.9}}, "schedule mapping needs a 'name' key"),
        ({"acceptance": 3}, "acceptance must be a name or a mapping"),
        ({"stop": "###"}, "stop must be a list"),
        ({"stop": [[]]}, "stop entries must be non-empty"),
        ({"adapter": "yes"}, "adapter must be true, false or null"),
        ({"device": "cpu"}, "device only apply when specframe loads the model"),
    ],
)
def test_bad_values_are_named(models, overrides, message):
    with pytest.raises(ConfigError) as info:
        compose({"model": models[NEMOTRON], **overrides})
    assert message in str(info.value)


def test_unknown_plugins_list_the_known_ones(models):
    with pytest.raises(UnknownPluginError, match=r"unknown schedule 'pakced'; known schedules: .*packed"):
        compose({"model": models[NEMOTRON], "schedule": "pakced"})
    with pytest.raises(UnknownPluginError, match=r"unknown order policy 'random'; known order policies: .*ltr"):
        compose({"model": models[SETDLM], "order": "random"})
    with pytest.raises(UnknownPluginError, match="unknown acceptance rule 'typical'"):
        compose({"model": models[SETDLM], "acceptance": "typical"})


def test_plugin_options_are_validated_against_the_factory(models):
    with pytest.raises(
        ConfigError, match=r"schedule 'packed' does not take option\(s\) 'threshold'; it takes: no options"
    ):
        compose({"model": models[NEMOTRON], "schedule": {"name": "packed", "threshold": 0.5}})
    with pytest.raises(ConfigError, match="greedy acceptance takes no options.*belong to the 'rejection' rule"):
        compose({"model": models[NEMOTRON], "acceptance": {"name": "greedy", "temperature": 1.0}})
    with pytest.raises(ConfigError, match="temperature must be a number > 0"):
        compose({"model": models[NEMOTRON], "acceptance": {"name": "rejection", "temperature": 0}})
    with pytest.raises(ConfigError, match=r"threshold must be a number in \(0, 1\]"):
        compose({"model": models[SETDLM], "schedule": {"name": "native", "threshold": 2}})


def test_the_command_line_option_form_in_a_configuration_says_to_use_a_mapping():
    with pytest.raises(ConfigError, match=r"command line's NAME:key=value form.*\{'name': 'kbranch', 'key'"):
        compose({"schedule": "kbranch:k=3"})  # refused before any model is loaded


def test_dataclass_and_overrides(models):
    config = DecoderConfig(model=models[SETDLM], schedule="linear", width=3, max_new_tokens=5)
    decoder = compose(config, schedule="packed")
    assert decoder.schedule.name == "packed" and decoder.width == 3 and config.schedule == "linear"
    assert decoder.describe()["acceptance"] == {"name": "greedy"}


def test_native_is_each_familys_own_decoder(models):
    for family, expected in ((NEMOTRON, "BlockDiffusionSchedule"), (SETDLM, "SlidingWindowSchedule")):
        decoder = compose({"model": models[family], "schedule": {"name": "native", "threshold": 0.5}})
        assert type(decoder.schedule).__name__ == expected
        with eos_ids(models[family], ()):
            result = decoder.generate(prompt_ids=[3, 4, 5], max_new_tokens=12)
        assert len(result.output_ids) == 12 and result.metrics.nfe >= 3


def test_native_commits_every_confident_slot_in_one_call(models):
    """Threshold 1e-9 commits every slot at once: a block costs one diffusion call plus one causal call."""
    with eos_ids(models[NEMOTRON], ()):
        result = generate(models[NEMOTRON], {"name": "native", "threshold": 1e-9}, [3, 4, 5], 9, width=4)
    # prompt call (seed 1), diffusion call (4 slots), causal commit call (next seed), diffusion call (last 3)
    assert result.metrics.nfe == 4
    assert result.metrics.accept_lengths == [1, 4, 1, 3]
    assert result.metrics.rows_per_call == [3, 5, 5, 4]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "no prompt given"),
        ({"prompt_ids": []}, "the prompt is empty"),
        ({"prompt_ids": [1, 99]}, "outside the model's vocabulary"),
        ({"prompt_ids": [1], "max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
        ({"prompt_ids": [1] * 250, "max_new_tokens": 10}, "exceeds the model's context of 256 positions"),
        ({"prompt": "x"}, "has no tokenizer.json"),
    ],
)
def test_bad_requests_are_named(models, kwargs, message):
    decoder = compose({"model": models[NEMOTRON]})
    with pytest.raises(InputError, match=message):
        decoder.generate(**kwargs)
