import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

from specframe.acceptance.greedy import GreedyAcceptance
from specframe.bench import BenchSettings, merge_runs, run_bench
from specframe.bench.records import lock_folder, read_records, record_key
from specframe.bench.runner import select_examples, turn_order
from specframe.bench.settings import Method
from specframe.errors import InputError, OutputError, SpecframeError


def settings(**overrides):
    values = dict(
        task="smoke",
        schedules=["ar", "linear", "packed"],
        widths=[2],
        max_new_tokens=6,
        limit=3,
        warmup=0,
        resamples=200,
    )
    values.update(overrides)
    return BenchSettings(**values)


def outputs(folder):
    return {record_key(r): r["output_ids"] for r in read_records(folder / "records.jsonl")}


def run(folder, model, **overrides):
    plots = overrides.pop("plots", False)
    return run_bench(settings(**overrides), folder, model=model, progress=False, log=lambda _: None, plots=plots)


def test_turn_order_rotates_and_selection_shards():
    methods = [Method("ar"), Method("linear", 2), Method("packed", 2)]
    assert turn_order(methods, 0) == methods
    assert turn_order(methods, 1)[0] == methods[1] and turn_order(methods, 5)[0] == methods[2]
    examples = list(range(10))
    from specframe.bench.tasks import get_task

    examples = get_task("smoke").load()
    chosen = select_examples(examples, settings(limit=7, shard=(1, 3)))
    assert [e.index for e in chosen] == [1, 4]


def test_records_hold_every_response_interleaved(tmp_path, tiny_setdlm):
    summary, report = run(tmp_path, tiny_setdlm, plots=True)
    records = read_records(tmp_path / "records.jsonl")
    assert len(records) == 3 * 3
    assert [r["method"] for r in records[:3]] == ["ar", "linear/w2", "packed/w2"]
    assert [r["method"] for r in records[3:6]] == ["linear/w2", "packed/w2", "ar"]  # rotated for prompt 1
    first = records[0]
    for key in (
        "task",
        "prompt_index",
        "repeat",
        "schedule",
        "width",
        "order",
        "temperature",
        "seed",
        "output_ids",
        "text",
        "metrics",
        "correct",
    ):
        assert key in first
    assert first["metrics"]["nfe"] >= 1 and first["metrics"]["generated_tokens"] == len(first["output_ids"])
    by_prompt = {}
    for r in records:  # greedy speculative decoding is lossless: every schedule gives AR's tokens
        by_prompt.setdefault(r["prompt_index"], set()).add(tuple(r["output_ids"]))
    assert all(len(v) == 1 for v in by_prompt.values())
    assert summary["prompts"] == 3 and len(summary["comparisons"]) == 2
    assert "linear/w2" in report and (tmp_path / "summary.json").exists() and (tmp_path / "comparison.png").exists()


def test_rerun_adds_nothing_and_gives_the_same_summary(tmp_path, tiny_setdlm):
    first, _ = run(tmp_path, tiny_setdlm)
    lines = (tmp_path / "records.jsonl").read_text()
    second, _ = run(tmp_path, tiny_setdlm)
    assert (tmp_path / "records.jsonl").read_text() == lines
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_interrupted_run_resumes_where_it_stopped(tmp_path, tiny_setdlm):
    full, partial = tmp_path / "full", tmp_path / "partial"
    run(full, tiny_setdlm)
    partial.mkdir()
    shutil.copy(full / "run.json", partial / "run.json")
    lines = (full / "records.jsonl").read_text().splitlines(keepends=True)
    # four complete records and a torn fifth, as left by a process killed while writing
    (partial / "records.jsonl").write_text("".join(lines[:4]) + lines[4][:25])
    run(partial, tiny_setdlm)
    resumed = read_records(partial / "records.jsonl")
    assert len(resumed) == len(lines)
    assert outputs(partial) == outputs(full)


def test_resume_refuses_different_settings(tmp_path, tiny_setdlm):
    run(tmp_path, tiny_setdlm)
    with pytest.raises(SpecframeError, match="max_new_tokens: 6 -> 7"):
        run(tmp_path, tiny_setdlm, max_new_tokens=7)
    with pytest.raises(SpecframeError, match="schedules"):
        run(tmp_path, tiny_setdlm, schedules=["ar", "packed"])
    run(tmp_path, tiny_setdlm, limit=4)  # a larger --limit only extends the run
    assert len(read_records(tmp_path / "records.jsonl")) == 4 * 3


def test_two_shards_merged_equal_one_unsharded_run(tmp_path, tiny_setdlm):
    whole, a, b, merged = (tmp_path / n for n in ("whole", "a", "b", "merged"))
    run(whole, tiny_setdlm, limit=5)
    run(a, tiny_setdlm, limit=5, shard=(0, 2))
    run(b, tiny_setdlm, limit=5, shard=(1, 2))
    assert {k[0] for k in outputs(a)} == {0, 2, 4} and {k[0] for k in outputs(b)} == {1, 3}
    summary, _ = merge_runs([a, b], merged, log=lambda _: None, plots=False)
    assert outputs(merged) == outputs(whole)
    assert summary["prompts"] == 5 and (merged / "summary.json").exists()
    with pytest.raises(SpecframeError, match="already holds records"):
        merge_runs([a, b], merged, log=lambda _: None, plots=False)


def test_merge_refuses_runs_with_different_settings(tmp_path, tiny_setdlm):
    run(tmp_path / "a", tiny_setdlm, shard=(0, 2))
    run(tmp_path / "b", tiny_setdlm, shard=(1, 2), max_new_tokens=5)
    with pytest.raises(SpecframeError, match="max_new_tokens.*only shards of one run can be merged"):
        merge_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "m", log=lambda _: None)
    with pytest.raises(SpecframeError, match="are the same folder; name each shard folder once"):
        merge_runs([tmp_path / "a", tmp_path / "x" / ".." / "a"], tmp_path / "m", log=lambda _: None)
    assert not (tmp_path / "m").exists()


def test_sampling_repeats_use_distinct_seeds(tmp_path, tiny_setdlm):
    summary, _ = run(
        tmp_path,
        tiny_setdlm,
        schedules=["linear", "packed"],
        limit=2,
        repeats=2,
        acceptance={"name": "rejection", "temperature": 1.0},
    )
    records = read_records(tmp_path / "records.jsonl")
    assert len(records) == 2 * 2 * 2
    assert {r["seed"] for r in records} == {0, 1, 1000, 1001}
    assert all(r["temperature"] == 1.0 for r in records)
    assert summary["responses_per_method"] == 4


def test_prompt_template_wraps_every_prompt(tmp_path, tiny_setdlm):
    template = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    run(tmp_path / "raw", tiny_setdlm, limit=1, schedules=["ar"])
    run(tmp_path / "chat", tiny_setdlm, limit=1, schedules=["ar"], prompt_template=template)
    raw, chat = (read_records(tmp_path / n / "records.jsonl")[0] for n in ("raw", "chat"))
    assert chat["prompt_tokens"] > raw["prompt_tokens"]
    with pytest.raises(SpecframeError, match="prompt_template"):
        run(tmp_path / "raw", tiny_setdlm, limit=1, schedules=["ar"], prompt_template=template)
    with pytest.raises(SpecframeError, match="must contain"):
        run(tmp_path / "bad", tiny_setdlm, prompt_template="no placeholder")


def test_interrupted_by_the_user_then_resumed(tmp_path, tiny_setdlm, monkeypatch):
    from specframe.bench.tasks.smoke import Smoke

    full, cut = tmp_path / "full", tmp_path / "cut"
    run(full, tiny_setdlm)
    calls = {"n": 0}
    original = Smoke.grade

    def grade_then_stop(self, example, response):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original(self, example, response)

    monkeypatch.setattr(Smoke, "grade", grade_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run(cut, tiny_setdlm)
    assert len(read_records(cut / "records.jsonl")) == 4
    monkeypatch.setattr(Smoke, "grade", original)
    run(cut, tiny_setdlm)
    assert outputs(cut) == outputs(full)


def test_automatic_widths_are_methods_with_their_choices_and_cost_model_reported(tmp_path, tiny_setdlm):
    summary, report = run(tmp_path, tiny_setdlm, schedules=["ar", "packed", "auto"], widths=["auto", 2])
    records = read_records(tmp_path / "records.jsonl")
    assert {r["method"] for r in records} == {"ar", "packed/wauto", "packed/w2", "auto/wauto", "auto/w2"}
    assert len({tuple(r["output_ids"]) for r in records if r["prompt_index"] == 0}) == 1  # still lossless
    methods = {m["method"]: m for m in summary["methods"]}
    for label, stats in methods.items():
        calls = sum(r["metrics"]["nfe"] for r in records if r["method"] == label)
        assert sum(stats["widths"].values()) == sum(stats["schedules"].values()) == calls
    assert set(methods["packed/w2"]["schedules"]) == {"packed"} and set(methods["packed/w2"]["widths"]) == {"2"}
    assert all(label == "ar" or label.startswith("packed/w") for label in methods["packed/wauto"]["schedules"])
    assert all(label == "ar" or label.endswith("/w2") for label in methods["auto/w2"]["schedules"])
    cost = summary["cost_model"]
    assert cost["source"] in ("calibrated", "cache") and cost["table"] and cost["key"]["family"] == "setdlm"
    assert "packed/wauto" in report
    again, _ = run(tmp_path, tiny_setdlm, schedules=["ar", "packed", "auto"], widths=["auto", 2])
    assert again["cost_model"] == cost  # a resumed run reports the cost model the responses were made with


def test_prompts_too_long_for_the_context_fail_before_the_first_prompt(tmp_path, tiny_setdlm):
    context = tiny_setdlm.max_positions + 1
    fits = "def f(x):"
    long = " ".join(["x"] * context)  # far more tokens than the context
    task_file = tmp_path / "prompts.jsonl"
    task_file.write_text("".join(json.dumps({"id": n, "prompt": p}) + "\n" for n, p in [("a", fits), ("b", long)]))
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        run(out, tiny_setdlm, task_file=str(task_file), limit=None, max_new_tokens=4)
    message = str(info.value)
    tokens = len(tiny_setdlm.encode_prompt(long))
    assert "1 of 2 prompt(s) do not fit the context of model" in message and f"({context} positions)" in message
    assert f"prompt 1 (b) has {tokens} tokens; nothing was run" in message and "prompt 0" not in message
    assert not (out / "records.jsonl").exists() and not (out / "run.json").exists()

    words = context
    while len(tiny_setdlm.encode_prompt(" ".join(["x"] * words))) > context - 10:
        words -= 5
    near = " ".join(["x"] * words)  # fits with a short output only
    task_file.write_text(json.dumps({"id": "c", "prompt": near}) + "\n")
    cap = context - len(tiny_setdlm.encode_prompt(near))
    with pytest.raises(InputError, match=f"Lower --max-new-tokens to {cap} or less"):
        run(tmp_path / "out2", tiny_setdlm, task_file=str(task_file), limit=None, max_new_tokens=cap + 1)
    summary, _ = run(tmp_path / "out3", tiny_setdlm, task_file=str(task_file), limit=None, max_new_tokens=cap)
    assert summary["prompts"] == 1


def test_a_model_without_a_tokenizer_is_refused_before_the_first_prompt(tmp_path, tiny_setdlm, monkeypatch):
    monkeypatch.setattr(tiny_setdlm, "tokenizer", None)
    out = tmp_path / "out"
    with pytest.raises(InputError, match="has no tokenizer.json, and a bench task's prompts are text") as info:
        run(out, tiny_setdlm, max_new_tokens=4)
    assert "token ids" not in str(info.value)  # bench takes no token ids: the decoder's advice would mislead
    assert not (out / "records.jsonl").exists() and not (out / "run.json").exists()


def test_a_lossy_method_is_labelled_and_compared_token_for_token_with_the_baseline(tmp_path, tiny_setdlm):
    summary, report = run(tmp_path, tiny_setdlm, schedules=["ar", "native", "packed"])
    records = read_records(tmp_path / "records.jsonl")
    assert {r["method"]: r["exact"] for r in records} == {"ar": True, "native/w2": False, "packed/w2": True}
    assert all(r["stochastic"] is False for r in records)
    methods = {m["method"]: m for m in summary["methods"]}
    assert methods["native/w2"]["exact"] is False and methods["packed/w2"]["exact"] is True
    assert methods["packed/w2"]["same_as_baseline"] == {"baseline": "ar", "same": 3, "of": 3, "first_divergence": None}
    assert methods["native/w2"]["same_as_baseline"]["of"] == 3
    flagged = {c["method"]: c["flagged"] for c in summary["comparisons"]}
    assert flagged == {"native/w2": True, "packed/w2": False}
    assert "same as ar" in report and "3/3" in report
    assert "! native/w2 is not exact" in report
    native_row = next(line for line in report.splitlines() if line.startswith("native/w2 vs ar"))
    assert " !" in native_row
    from specframe.bench.plots import _groups

    assert [schedule for schedule, _ in _groups(summary, "throughput_ratio")] == ["native*", "packed"]


class _LossyGreedy(GreedyAcceptance):
    """A plugin's rule that does not sample and is declared lossy (it accepts as greedy does, for the test)."""

    exact = False


class _LossyPlugin:
    from specframe.hookspecs import hookimpl

    @hookimpl
    def register_acceptance_rules(self, register):
        register("lossy", _LossyGreedy)


def test_a_lossy_rule_is_compared_with_an_exact_ar_and_claims_no_temperature(tmp_path, tiny_setdlm):
    from specframe.plugins import plugin_registered

    notes = []
    with plugin_registered(_LossyPlugin(), "lossy_plugin"):
        summary, report = run_bench(
            settings(schedules=["ar", "packed"], acceptance="lossy"), tmp_path, model=tiny_setdlm, progress=False,
            log=notes.append, plots=False,
        )  # fmt: skip
    records = read_records(tmp_path / "records.jsonl")
    assert {r["method"]: r["exact"] for r in records} == {"ar": True, "packed/w2": False}  # ar is the exact AR
    assert all(r["temperature"] == 0 and r["stochastic"] is False for r in records)
    assert any("ar decodes with the exact rule greedy" in note for note in notes)
    methods = {m["method"]: m for m in summary["methods"]}
    assert methods["ar"]["exact"] is True and methods["packed/w2"]["exact"] is False
    assert methods["packed/w2"]["same_as_baseline"]["baseline"] == "ar"
    title = report.splitlines()[0]
    assert "T=" not in title and "acceptance lossy, which does not sample" in title, title
    assert summary["temperature"] == 0


def test_an_empty_prompt_fails_before_any_record_and_on_resume_alike(tmp_path, tiny_setdlm):
    # prompt 2 is empty: it used to fail at its turn, after prompts 0 and 1 were recorded, and on every resume
    task_file = tmp_path / "prompts.jsonl"
    rows = [("a", "def f(x):"), ("b", "x = 1"), ("c", ""), ("d", "")]
    task_file.write_text("".join(json.dumps({"id": n, "prompt": p}) + "\n" for n, p in rows))
    out = tmp_path / "out"
    for _ in range(2):
        with pytest.raises(InputError) as info:
            run(out, tiny_setdlm, task_file=str(task_file), limit=None, max_new_tokens=2)
        message = str(info.value)
        assert f"2 of 4 prompt(s) of task file {task_file} cannot be decoded" in message
        assert "prompt 2 (c): the prompt is empty; prompt 3 (d): the prompt is empty; nothing was run" in message
        assert not out.exists()
    # a template that gives the empty prompt some text makes it decodable
    summary, _ = run(
        out, tiny_setdlm, task_file=str(task_file), limit=None, max_new_tokens=2, prompt_template="Q:{prompt}"
    )
    assert summary["prompts"] == 4


def test_a_lone_surrogate_in_a_prompt_names_the_file_and_prompt_and_leaves_no_folder(tmp_path, tiny_setdlm):
    task_file = tmp_path / "prompts.jsonl"
    task_file.write_text('{"id": "a", "prompt": "def f(x):"}\n{"id": "b", "prompt": "x = \\ud800"}\n')
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        run(out, tiny_setdlm, task_file=str(task_file), limit=None, max_new_tokens=2)
    message = str(info.value)
    assert f"1 of 2 prompt(s) of task file {task_file} cannot be decoded: prompt 1 (b): " in message
    assert "lone surrogate" in message and "nothing was run" in message
    assert not out.exists()


class _DiskFullAfter:
    """A text file whose ``calls``-th write stores half its line and then fails as a full disk does."""

    def __init__(self, handle, calls):
        self._handle, self._calls = handle, calls

    def write(self, text):
        self._calls -= 1
        if self._calls == 0:
            self._handle.write(text[: len(text) // 2])
            self._handle.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._handle.write(text)

    def __getattr__(self, name):
        return getattr(self._handle, name)


def test_a_full_disk_names_the_records_file_and_the_rerun_resumes(tmp_path, tiny_setdlm, monkeypatch):
    import specframe.bench.records as records_module

    monkeypatch.setattr(records_module, "open", lambda *a, **k: _DiskFullAfter(open(*a, **k), 4), raising=False)
    out = tmp_path / "out"
    with pytest.raises(OutputError) as info:
        run(out, tiny_setdlm)
    assert str(info.value).startswith(f"cannot write {out / 'records.jsonl'} (No space left on device); ")
    assert "rerun the same command to resume" in str(info.value)
    assert len(read_records(out / "records.jsonl")) == 3  # the torn fourth line is not a record
    monkeypatch.undo()
    run(out, tiny_setdlm)
    keys = [record_key(r) for r in read_records(out / "records.jsonl")]
    assert len(keys) == len(set(keys)) == 9
    run(tmp_path / "clean", tiny_setdlm)
    assert outputs(out) == outputs(tmp_path / "clean")


def test_a_full_disk_at_the_summary_names_it_and_leaves_no_temporary_file(tmp_path, tiny_setdlm, monkeypatch):
    from pathlib import Path

    write_text = Path.write_text

    def full(self, *args, **kwargs):
        if self.name == "summary.json.tmp":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    out = tmp_path / "out"
    with pytest.raises(OutputError, match=f"cannot write {out / 'summary.json'} \\(No space left on device\\)"):
        run(out, tiny_setdlm)
    assert len(read_records(out / "records.jsonl")) == 9 and not (out / "summary.json.tmp").exists()


def test_a_second_bench_on_a_busy_folder_is_refused_and_records_nothing(tmp_path, tiny_setdlm):
    out = tmp_path / "out"
    out.mkdir()
    with lock_folder(out):  # as a bench running in another process holds it
        with pytest.raises(OutputError) as info:
            run(out, tiny_setdlm)
        assert f"--out {out} is in use: another specframe bench is running there" in str(info.value)
        assert not (out / "records.jsonl").exists() and not (out / "run.json").exists()
    run(out, tiny_setdlm)  # released: the folder is usable again
    assert len(read_records(out / "records.jsonl")) == 9


def test_the_folder_lock_ends_with_a_killed_process(tmp_path, tiny_setdlm):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputError, match="another specframe bench is running there"):
            run(out, tiny_setdlm)
    finally:
        holder.kill()  # SIGKILL: no clean-up code of the holder runs
        holder.wait()
    run(out, tiny_setdlm)
    assert len(read_records(out / "records.jsonl")) == 9


HOLD_LOCK = """
import sys, time
from pathlib import Path
from specframe.bench.records import lock_folder
with lock_folder(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(600)
"""
