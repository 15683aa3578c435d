"""Repository scripts that only run elsewhere (a GPU machine) still run here in their quick CPU form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_quick_runs_on_the_cpu_and_reports_exactness(tmp_path):
    # The device check is run rarely and in one shot on a lent GPU; a broken script would waste that turn.
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), str(tmp_path), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    float32 = [row for row in report["correctness"] if row["dtype"] == "float32"]
    families = {row["model"] for row in float32}
    assert {"random-nemotron", "random-setdlm"} <= families
    assert {row["schedule"] for row in float32} == {"linear", "quadratic", "packed"}
    assert all(row["ok"] and row["identical"] == row["prompts"] for row in float32)
    assert report["passed"] is True
    shapes = report["memory_bound"]["call_shapes"]
    assert shapes["ar"]["rows_max"] == 1 and shapes["packed"]["rows_max"] == 2 * (shapes["packed"]["width"] + 1)
    assert (tmp_path / "gpu_check.md").read_text(encoding="utf-8").startswith("# specframe device check")
    # part (d), the performance report: transformers' greedy generate on the same weights makes the same tokens
    perf = report["perf"]
    assert "error" not in perf, perf.get("error")
    same = perf["generation"]["same_tokens_as_ar_eager"]
    assert same.get("transformers generate") is True and all(same.values())
    assert perf["floor"]["floor_ms"] > 0 and perf["calls"]["eager"]["ms_by_rows"]["1"] > 0  # JSON keys
    assert "ar [eager] / transformers" in perf["ratios"]
    markdown = (tmp_path / "gpu_check.md").read_text(encoding="utf-8")
    assert "## (d) Performance report" in markdown and "## Model calls" in markdown and "## Ratios" in markdown


def _host_profile():
    import importlib.util

    spec = importlib.util.spec_from_file_location("host_profile", ROOT / "scripts" / "host_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_host_profile_replays_the_recorded_run_and_splits_its_time(monkeypatch):
    import pytest

    from specframe.models import load_model

    host_profile = _host_profile()
    model = load_model(None)
    prompts = [model.encode_prompt("def add(a, b):")]
    sampled = {"name": "rejection", "temperature": 1.0, "top_k": 20}
    for acceptance in ("greedy", sampled):
        config = {"schedule": "packed", "width": 4, "order": "ltr", "acceptance": acceptance}
        result = host_profile.profile_method(model, prompts, {**config, "max_new_tokens": 16, "seed": 0}, 1, 0)
        parts = result["us_per_call"]
        assert result["calls_per_run"] >= 4
        assert all(parts[p] > 0 for p in host_profile.PARTS)
        assert parts["wall"] >= sum(parts[p] for p in host_profile.PARTS)
    # A replay that does not reproduce the recorded run is refused, not timed.
    record = host_profile.Replay.record

    def corrupted(self, *args):
        logits = record(self, *args)
        self.calls[-1] = -self.calls[-1]
        return logits

    monkeypatch.setattr(host_profile.Replay, "record", corrupted)
    config = {"schedule": "packed", "width": 4, "order": "ltr", "acceptance": "greedy", "max_new_tokens": 16}
    with pytest.raises(SystemExit, match="diverged"):
        host_profile.profile_method(model, prompts, {**config, "seed": 0}, 1, 0)


def _script(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_random_checkpoints_refuses_settings_it_cannot_write(tmp_path, capsys):
    import warnings

    import pytest

    script = _script("make_random_checkpoints")
    warnings.simplefilter("ignore", UserWarning)  # torch: sizes it cannot read are 0, zero-element weights
    for argv, message in [
        (["--shards", "0"], "--shards must be an integer >= 1, got '0'"),
        (["--lora-rank", "-1"], "--lora-rank must be an integer >= 0, got '-1'"),
        (["--set", "vocab_size=abc"], "cannot write a nemotron-labs-diffusion checkpoint with --set vocab_size='abc'"),
    ]:
        with pytest.raises(SystemExit) as info:
            script.main([str(tmp_path / "out"), "--family", "nemotron-labs-diffusion", *argv])
        err = capsys.readouterr().err
        assert info.value.code == 2 and message in err and "Traceback" not in err, err
    # A broken config without a tokenizer is written on purpose: the loader is what must object.
    broken = tmp_path / "broken"
    script.main([str(broken), "--family", "nemotron-labs-diffusion", "--no-tokenizer", "--set", "vocab_size=abc"])
    assert (broken / "nemotron-labs-diffusion" / "config.json").is_file()


def test_perf_report_read_floor_counts_the_cache_and_the_fastest_bandwidth_seen(capsys):
    import pytest

    from specframe.models import load_model

    perf_report = _script("perf_report")
    model = load_model("nemotron-stdlib-tiny")
    per_row = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 4  # keys and values, float32
    assert perf_report.cache_bytes(model, 127) == 128 * per_row
    result = {
        "streamed_bytes": 10_000_000,
        "cache_bytes": 2_000_000,
        "floor": {"copy_gb_s": 20.0, "read_gb_s": 30.0, "read_gb_s_between_calls": 40.0},
    }
    assert perf_report.read_floor_ms(result) == pytest.approx(12_000_000 / 40e6)  # 0.3 ms at 40 GB/s
    result["floor"]["read_gb_s_between_calls"] = 10.0  # a slower minute never raises the floor
    assert perf_report.read_floor_ms(result) == pytest.approx(12_000_000 / 30e6)
    with pytest.raises(SystemExit):
        perf_report.parse(["--context", "0"])
    assert "--context must be at least 1 cached row" in capsys.readouterr().err
