import json

from specframe.cli import main


def bench_args(model_dir, out, *extra):
    return [
        "bench",
        "--model",
        str(model_dir),
        "--task",
        "smoke",
        "--limit",
        "2",
        "--schedules",
        "ar,linear,packed",
        "--widths",
        "2,3",
        "--max-new-tokens",
        "6",
        "--warmup",
        "1",
        "--resamples",
        "300",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def test_bench_end_to_end_writes_table_records_summary_and_plots(tmp_path, tiny_nemotron_dir, capsys):
    out = tmp_path / "run"
    assert main(bench_args(tiny_nemotron_dir, out)) == 0
    printed = capsys.readouterr().out
    assert "tok/NFE" in printed and "packed/w3 vs linear/w3" in printed and "throughput ratio" in printed
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 5  # ar once, linear and packed at two widths
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == 2 and summary["baseline"] == "linear"
    assert [m["method"] for m in summary["methods"]] == ["ar", "linear/w2", "linear/w3", "packed/w2", "packed/w3"]
    assert summary["settings"]["max_new_tokens"] == 6 and summary["model"]["family"] == "nemotron-labs-diffusion"
    assert (out / "comparison.png").stat().st_size > 0
    assert (out / "plots" / "throughput_ratio.png").exists()
    run = json.loads((out / "run.json").read_text())
    assert run["environment"]["torch"] and "bench" in run["command"]

    merged = tmp_path / "merged"
    assert main(["bench", "merge", str(out), "--out", str(merged)]) == 0
    assert (merged / "records.jsonl").read_text().count("\n") == 10


def test_bench_errors_are_one_line(tmp_path, tiny_nemotron_dir, capsys):
    assert main(["bench", "--task", "smoke"]) == 1
    assert "--out is required" in capsys.readouterr().err
    assert main(bench_args(tiny_nemotron_dir, tmp_path / "x", "--shard", "3/2")) == 1
    assert "shard" in capsys.readouterr().err
    assert main(bench_args(tiny_nemotron_dir, tmp_path / "y", "--baseline", "quadratic")) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --baseline quadratic") and err.count("\n") == 1
    assert main(bench_args(tiny_nemotron_dir, tmp_path / "z", "--task", "nope")) == 1
    assert "unknown task" in capsys.readouterr().err


def parsed(*argv):
    from specframe.bench.cli import settings_from_args
    from specframe.cli import build_parser

    argv = ["bench", *argv]
    return settings_from_args(build_parser(argv).parse_args(argv))


def test_settings_from_the_command_line():
    s = parsed("--task", "humaneval", "--temperature", "1", "--paper-repeats", "--widths", "15,31")
    assert s.repeats == 20 and s.widths == [15, 31] and s.temperature == 1.0 and s.max_new_tokens == 512
    assert s.acceptance == {"name": "rejection", "temperature": 1.0}
    assert parsed("--task", "mbpp", "--temperature", "1", "--paper-repeats").repeats == 7
    assert parsed("--task", "humaneval", "--paper-repeats").repeats == 1  # greedy: one response is enough
    greedy = parsed("--task", "gsm8k", "--temperature", "0", "--shard", "1/4", "--max-new-tokens", "64")
    assert greedy.acceptance == "greedy" and greedy.shard == (1, 4) and greedy.max_new_tokens == 64
    assert parsed("--task", "math500").max_new_tokens == 1024 and parsed().widths == ["auto"]
    assert parsed("--widths", "auto,4").widths == ["auto", 4]


def test_equivalent_command_reproduces_the_settings():
    import shlex

    from specframe.bench.cli import equivalent_command

    original = parsed(
        "--task",
        "gsm8k",
        "--temperature",
        "0.7",
        "--top-k",
        "20",
        "--widths",
        "4,8",
        "--limit",
        "5",
        "--shard",
        "0/2",
        "--stop",
        "</s>",
        "--prompt-template",
        "Q: {prompt}\\nA:",
        "--out",
        "x",
    )
    words = shlex.split(equivalent_command(original, "x"))
    assert words[:2] == ["specframe", "bench"]
    assert parsed(*words[2:]).to_dict() == original.to_dict()


def test_a_width_that_nothing_would_use_is_refused():
    import pytest

    from specframe.errors import ConfigError

    for argv, message in [
        (["--schedules", "ar", "--widths", "4"], "--widths 4 would be unused: --schedules ar takes no"),
        (["--schedules", "ar", "--width", "4"], "--width 4 would be unused"),
        (["--widths", "4", "--width", "8"], "give --width or --widths, not both"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parsed(*argv)
    assert parsed("--schedules", "ar").widths == ["auto"]
    assert parsed("--schedules", "ar,kbranch:k=2", "--width", "4").widths == [4]


def test_a_damaged_records_line_says_how_to_resume(tmp_path):
    import pytest

    from specframe.bench.records import read_records
    from specframe.errors import SpecframeError

    path = tmp_path / "records.jsonl"
    path.write_text('{"prompt_index": 0}\n{"prompt_ind\n{"prompt_index": 1}\n', encoding="utf-8")
    with pytest.raises(SpecframeError, match=r"line 2 is not valid JSON.*delete that line to resume"):
        read_records(path)


def test_a_missing_bench_extra_is_named_before_anything_runs(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tqdm" else real(name, *a))
    assert main(["bench", "--schedules", "ar", "--limit", "1", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "specframe bench needs tqdm, which is not installed" in err and "pip install 'specframe[bench]'" in err
    assert not (tmp_path / "run").exists()


def test_max_new_tokens_zero_is_refused_not_replaced_by_the_task_cap():
    import pytest

    from specframe.errors import ConfigError

    assert parsed().max_new_tokens == 128  # no --max-new-tokens: the smoke task's own cap
    for value in ("0", "-3"):
        with pytest.raises(ConfigError, match=f"--max-new-tokens must be >= 1, got {value}"):
            parsed("--max-new-tokens", value).validate()
