"""Bad inputs to `specframe train` (issue 12): refused with a one-line error before anything is written.

Settings and work folders are checked before the corpus is prepared.
"""

from __future__ import annotations

import json
import re

import pytest
from specframe_training.trainer import preset

from specframe.cli import build_parser, main
from specframe.models.threads import machine_cores


def _cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_more_threads_than_cores_is_refused_before_torch_is_asked(capsys, tmp_path):
    """torch.set_num_threads(10**6) ends the process (OpenMP cannot create the threads): refuse it first."""
    too_many = str(machine_cores() + 1)
    work = tmp_path / "train"
    for value, message in ((too_many, f"--threads {too_many} is more than the"), ("0", "--threads must be a positive")):
        code, _, err = _cli(capsys, "train", "setdlm", "--work-dir", str(work), "--threads", value, "--steps", "1")
        assert code == 1 and message in err, err
    assert not work.exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"steps": 0}, "steps must be an integer >= 1, got 0"),
        ({"hidden_size": "abc"}, "hidden_size must be an integer >= 1, got 'abc'"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"rope_theta": float("nan")}, "rope_theta must be a finite number >= 0"),
        ({"bf16": "yes"}, "bf16 must be true or false"),
        ({"objective": 3}, "objective must be a JSON object"),
        ({"num_key_value_heads": 3}, "num_attention_heads=4 must be a multiple of num_key_value_heads=3"),
        ({"vocab_size": 10}, r"vocab_size must be at least 534 for setdlm .*, got 10"),
        ({"objective": {"span": -1}}, "objective.span must be an integer >= 0, got -1"),
        ({"objective": {"span": "abc"}}, "objective.span must be an integer >= 0, got 'abc'"),
        ({"objective": {"ltr_prob": 1.5}}, "objective.ltr_prob must be between 0 and 1, got 1.5"),
        ({"objective": {"max_block": 9}}, r"unknown option\(s\) max_block for setdlm \(its objective's options: span"),
        ({"objective": {"mask_id": 3}}, r"unknown option\(s\) mask_id for setdlm"),
    ],
)
def test_training_settings_are_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        preset("setdlm", **overrides)
    assert preset("setdlm", seed=0, warmup=0).warmup == 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vocab_size": 639}, r"vocab_size must be at least 640 for nemotron-labs-diffusion .*, got 639"),
        ({"objective": {"span": 8}}, r"unknown option\(s\) span for nemotron-labs-diffusion"),
        ({"objective": {"min_block": 4, "max_block": 3}}, "objective.max_block must be an integer >= 4, got 3"),
        ({"objective": {"diffusion_weight": float("inf")}}, "objective.diffusion_weight must be a finite number"),
        ({"objective": {"max_period": 1}}, "objective.max_period must be an integer >= 2, got 1"),
    ],
)
def test_nemotron_training_settings_are_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        preset("nemotron", **overrides)


def test_the_objective_examples_of_train_help_are_valid_settings():
    train = build_parser(["train"]).subcommands["train"]
    text = " ".join(next(a.help for a in train._actions if "--set" in a.option_strings).split())
    examples = re.findall(r"objective=(\{[^}]*\}) for (\w+)", text)
    assert {family for _, family in examples} == {"nemotron", "setdlm"}, text
    for value, family in examples:
        assert preset(family, objective=json.loads(value)).objective == json.loads(value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--set", "hidden_size=abc"], "hidden_size must be an integer >= 1, got 'abc'"),
        (["--set", "hiden_size=64"], "unknown training setting(s) hiden_size; settings: vocab_size, hidden_size"),
        (["--steps", "0"], "steps must be an integer >= 1, got 0"),
        (["--set", "vocab_size=10"], "vocab_size must be at least 534 for setdlm"),
        (["--set", 'objective={"span": -1}'], "objective.span must be an integer >= 0, got -1"),
        (["--set", 'objective={"span": "abc"}'], "objective.span must be an integer >= 0, got 'abc'"),
    ],
)
def test_train_refuses_bad_settings_before_writing_anything(capsys, tmp_path, extra, message):
    work = tmp_path / "run"
    code, _, err = _cli(capsys, "train", "setdlm", "--work-dir", str(work), *extra)
    assert code == 1 and message in err and "internal error" not in err, err
    assert not work.exists()


def test_train_refuses_another_familys_objective_option_before_writing_anything(capsys, tmp_path):
    work = tmp_path / "run"  # span is SetDLM's: `train --help` gave it as the example for every family
    code, _, err = _cli(capsys, "train", "nemotron", "--work-dir", str(work), "--set", 'objective={"span": 8}')
    assert code == 1 and "unknown option(s) span for nemotron-labs-diffusion" in err and "max_block" in err, err
    assert "internal error" not in err and not work.exists()


def test_train_refuses_a_work_folder_that_cannot_be_one(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    for work, message in [(tmp_path / "file", "is an existing file"), (tmp_path / "file" / "sub", "cannot be used")]:
        code, _, err = _cli(capsys, "train", "setdlm", "--work-dir", str(work), "--steps", "1")
        assert code == 1 and f"--work-dir {work} {message}" in err and "internal error" not in err, err


@pytest.mark.parametrize("option", ["--work-dir", "--ship", "--records"])
def test_train_refuses_an_empty_folder_path_instead_of_using_the_current_folder(capsys, tmp_path, monkeypatch, option):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "setdlm", "--steps", "1", "--work-dir", str(tmp_path / "run"), option, ""]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and f"argument {option}: the path is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["--ship", "--records"])
def test_train_refuses_an_unusable_ship_or_records_folder_before_training(capsys, tmp_path, option):
    work = tmp_path / "run"
    code, _, err = _cli(capsys, "train", "setdlm", "--steps", "1", "--work-dir", str(work), option, "/proc/specframe")
    assert code == 1 and f"{option} /proc/specframe cannot be used" in err and "internal error" not in err, err
    assert not work.exists()


@pytest.mark.parametrize(("option", "inside"), [("--ship", "hub"), ("--records", "")])
def test_train_refuses_to_copy_the_run_onto_itself(capsys, tmp_path, option, inside):
    work = tmp_path / "run"
    target = work / inside if inside else work
    code, _, err = _cli(capsys, "train", "setdlm", "--steps", "1", "--work-dir", str(work), option, str(target))
    assert code == 1 and f"{option} {target} is where the run writes those files itself" in err, err
