"""The command line contract: `specframe plugins`, `specframe generate --json`, one-line errors."""

from __future__ import annotations

import json

import pytest

from specframe.cli import main
from specframe.testing.models import write_random_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    return {
        "nemotron": str(write_random_checkpoint("nemotron-labs-diffusion", root / "nemotron", seed=2)),
        "setdlm": str(write_random_checkpoint("setdlm", root / "setdlm", seed=2)),
    }


def _run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plugins_prints_every_builtin_as_json(capsys):
    code, out, _ = _run(capsys, "plugins")
    entries = json.loads(out)
    assert code == 0
    assert all({"kind", "name", "plugin", "distribution"} <= set(e) for e in entries)
    names = {(e["kind"], e["name"]) for e in entries}
    for schedule in ("ar", "linear", "quadratic", "packed", "native"):
        assert ("schedule", schedule) in names
    assert ("model_backend", "setdlm") in names and ("order_policy", "confidence") in names


@pytest.mark.parametrize(("family", "order"), [("nemotron", "ltr"), ("setdlm", "ltr"), ("setdlm", "confidence")])
@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed", "native"])
def test_generate_json_contract(capsys, checkpoints, family, order, schedule):
    width = [] if schedule == "ar" else ["--width", "3"]  # ar takes no width
    code, out, err = _run(
        capsys, "generate", "def f(x):", "--model", checkpoints[family], "--schedule", schedule,
        "--order", order, *width, "--max-new-tokens", "6", "--json",
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert {"text", "prompt_ids", "output_ids", "metrics"} <= set(result)
    metrics = result["metrics"]
    for key in ("nfe", "generated_tokens", "tokens_per_nfe", "rows_per_call_max", "accept_lengths", "wall_s"):
        assert key in metrics
    assert metrics["model_s"] + metrics["non_model_s"] == pytest.approx(metrics["wall_s"], abs=1e-6)
    assert metrics["generated_tokens"] == len(result["output_ids"]) <= 6
    assert isinstance(result["text"], str) and result["prompt_ids"]


def test_prompt_ids_take_ascii_integers_with_spaces_and_a_plus_sign(capsys, checkpoints):
    args = ["generate", "--prompt-ids", " 5, +6 ,7", "--model", checkpoints["nemotron"], "--schedule", "ar"]
    code, out, err = _run(capsys, *args, "--max-new-tokens", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["prompt_ids"] == [5, 6, 7]


def test_generate_with_prompt_ids_sampling_and_confidence_order(capsys, checkpoints):
    args = ["generate", "--prompt-ids", "5,6,7", "--model", checkpoints["setdlm"], "--order", "confidence"]
    args += ["--max-new-tokens", "8"]
    code, out, err = _run(capsys, *args, "--temperature", "1.0", "--top-k", "5", "--seed", "3", "--json")
    assert code == 0, err
    first = json.loads(out)
    assert first["prompt_ids"] == [5, 6, 7]
    _, again, _ = _run(capsys, *args, "--temperature", "1.0", "--top-k", "5", "--seed", "3", "--json")
    assert json.loads(again)["output_ids"] == first["output_ids"]  # a seed makes sampling reproducible


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--schedule", "pakced"], "unknown schedule 'pakced'; known schedules:"),
        (["--width", "0"], "width must be >= 1"),
        (["--schedule", "ar", "--width", "4"], "schedule 'ar' takes no width: it verifies one token per call"),
        (["--order", "confidence"], "verifies left to right only"),
        (["--acceptance", "greedy", "--temperature", "1"], "greedy acceptance takes no options"),
        (["--threshold", "0.9"], "schedule 'packed' does not take option(s) 'threshold'"),
        (["--device", "cuda:7"], "cuda"),
        (["--dtype", "float8"], "float8"),
    ],
)
def test_errors_are_one_line_without_traceback(capsys, checkpoints, args, message):
    code, out, err = _run(capsys, "generate", "x", "--model", checkpoints["nemotron"], *args)
    assert code != 0 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "--prompt-ids", "1,x"], "--prompt-ids must be comma-separated integers"),
        (
            ["generate", "--prompt-ids", "\u0661,\u0662"],
            "--prompt-ids must be comma-separated integers",
        ),  # Arabic-Indic
        (["generate", "--prompt-ids", "1_0"], "--prompt-ids must be comma-separated integers"),
        (["generate"], "no prompt"),
        (["generate", "x", "--prompt-ids", "1"], "not both"),
        (["generate", "x", "--model", "/no/such/folder"], "does not exist"),
    ],
)
def test_input_errors_are_one_line(capsys, args, message):
    code, _, err = _run(capsys, *args)
    assert code != 0 and err.startswith("error: ") and err.count("\n") == 1
    assert message in err


def test_a_closed_pipe_ends_quietly_with_the_sigpipe_status():
    """`specframe plugins | head -c 10`: no "internal error" line, status 141, like a shell tool."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written: every write fails
    script = "import sys; from specframe.cli import main; sys.exit(main(['plugins']))"
    try:
        proc = subprocess.run([sys.executable, "-c", script], stdout=write_end, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    assert proc.returncode == 141, err
    assert "internal error" not in err and "Traceback" not in err and "Exception ignored" not in err


def _help(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_says_what_each_command_does_and_the_defaults_that_apply(capsys):
    from specframe.plugins import get_registry

    text = _help(capsys)
    commands = get_registry().entries("command")
    assert {"plugins", "generate", "bench", "calibrate", "convert", "pull"} <= {e.name for e in commands}
    for entry in commands:
        assert f"{entry.name} {entry.extras['help']}" in text
    assert "see `specframe" not in text and "COMMAND --help" in text
    assert "output length limit (default 256)" in _help(capsys, "generate")
    bench = _help(capsys, "bench")  # bench's length default is the task's cap, not generate's 256
    assert "default 256" not in bench and "the task's own cap: smoke 128, chat 128, humaneval 512" in bench


def test_a_command_that_no_plugin_registers_says_how_a_plugin_command_is_installed(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["imaginary", "--help"])
    err = " ".join(capsys.readouterr().err.split())
    assert exit_info.value.code == 2 and err.startswith("error: unknown command 'imaginary'; known commands: ")
    assert "bench" in err and "pip install ./plugins/DISTRIBUTION" in err and "`specframe plugins` lists it" in err


def test_the_core_names_no_plugin_command():
    """A plugin's commands reach the CLI through its register_commands hook alone, never through a table in core."""
    from pathlib import Path

    from specframe import commands

    core = Path(commands.__file__).parent
    plugin_commands = {"train", "train-drafter", "ablation-order"}
    for path in [core / "commands.py", core / "cli.py"]:
        text = path.read_text(encoding="utf-8")
        named = {name for name in plugin_commands if f'"{name}"' in text or f"``{name}``" in text}
        assert not named, f"{path.name} names the plugin command(s) {sorted(named)}"
    assert {name for name, _, _ in commands.COMMANDS}.isdisjoint(plugin_commands)


def test_calibrate_takes_the_thread_count_its_cost_model_is_kept_by(capsys, checkpoints, tmp_path, monkeypatch):
    """A cost model is cached per thread count: `calibrate --threads` must reach the one `generate --threads` uses."""
    from specframe.auto import costs

    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path))
    quick = costs.calibrate
    monkeypatch.setattr(costs, "calibrate", lambda *a, **k: quick(*a, **{**k, "budget_s": 0.05, "limit_s": 0.2}))
    code, out, err = _run(capsys, "calibrate", "--model", checkpoints["setdlm"], "--threads", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["key"]["threads"] == 1 and json.loads(out)["key"]["path"] == "eager"
    code, _, err = _run(capsys, "calibrate", "--model", checkpoints["setdlm"], "--threads", "0")
    assert code == 1 and "threads must be a positive integer" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "x", "--width", "wide"], "argument --width: expected an integer or 'auto', got 'wide'"),
        (["generate", "x", "--max-new-tokens", "1e3"], "argument --max-new-tokens: invalid int value: '1e3'"),
        (["generate", "x", "--widht", "4"], "unrecognized arguments: --widht 4; see `specframe generate --help`"),
        (["bench", "--limit", "two"], "see `specframe bench --help`"),
        (["frobnicate"], "unknown command 'frobnicate'; known commands: "),
        # options match whole: a prefix of --prompt-ids or --schedules is not taken for it
        (["generate", "--prompt", "hi"], "--prompt (prompt is given without a flag: specframe generate ... PROMPT)"),
        (["generate", "x", "--prompt-id", "1,2"], "unrecognized arguments: --prompt-id 1,2"),
        (["bench", "--schedule=ar"], "unrecognized arguments: --schedule=ar"),
        # a misspelt option's value is not taken for bench's one subcommand (merge): the option is named
        (["bench", "--schedule", "ar"], "unrecognized arguments: --schedule;"),
        (["bench", "--limt", "2"], "unrecognized arguments: --limt;"),
    ],
)
def test_a_malformed_command_line_is_one_line_naming_the_help(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err and "usage:" not in err


def test_the_summary_line_says_what_planned_the_calls_when_it_was_chosen_per_call():
    from specframe.cli import summary_line
    from specframe.metrics import Metrics

    m = Metrics(nfe=5, generated_tokens=6, wall_s=0.5, model_s=0.4)
    m.choices = [("ar", 0), ("packed/w2", 2), ("ar", 0), ("ar", 0), ("packed/w2", 2)]
    line = summary_line("packed", m)
    assert line == "[packed] 6 tokens, 5 NFE, 1.20 tokens/NFE, 0.500 s (20% non-model); calls: 3 ar, 2 packed/w2"
    m.choices = [("packed", 4)] * 5  # a fixed width: nothing to add
    assert summary_line("packed", m).endswith("(20% non-model)")


def test_generate_prints_the_summary_line(capsys, checkpoints):
    code, out, err = _run(
        capsys, "generate", "def f(x):", "--model", checkpoints["nemotron"], "--schedule", "packed", "--width", "2",
        "--max-new-tokens", "6",
    )  # fmt: skip
    assert code == 0 and out.endswith("\n")
    assert err.startswith("[packed] 6 tokens, ") and err.rstrip().endswith("non-model)"), err


def test_generate_without_a_tokenizer_prints_the_output_ids(capsys, tmp_path):
    folder = str(write_random_checkpoint("setdlm", tmp_path / "bare", seed=2, tokenizer=False))
    args = ["generate", "--prompt-ids", "5,6,7", "--model", folder, "--schedule", "ar", "--max-new-tokens", "4"]
    code, out, err = _run(capsys, *args)
    assert code == 0, err
    _, as_json, _ = _run(capsys, *args, "--json")
    assert out.strip() == ",".join(map(str, json.loads(as_json)["output_ids"]))  # not an empty line
    assert "has no tokenizer, so these are the output token ids" in err
