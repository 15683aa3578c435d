"""``specframe bench --concurrency``: options, records and keys, closed-loop timing, summary, report and plots.

Nothing here asserts on measured times: timing logic runs on a fake clock, summaries on synthetic records.
"""

from __future__ import annotations

import json
import shutil

import pytest

from specframe.bench import BenchSettings, merge_runs, run_bench
from specframe.bench.cli import concurrency_list, equivalent_command
from specframe.bench.closed_loop import run_closed_loop
from specframe.bench.plots import plot_comparisons, throughput_lines
from specframe.bench.records import read_records, record_key, record_method
from specframe.bench.report import format_report
from specframe.bench.settings import Method, differences
from specframe.bench.summary import pair_baseline, summarize, unbatched_reference
from specframe.cli import main
from specframe.decoder import Generation, StreamPiece
from specframe.errors import ConfigError, SpecframeError
from specframe.models import load_model

SAMPLING = {"name": "rejection", "temperature": 1.0}


@pytest.fixture(scope="module")
def tiny_nemotron(tiny_nemotron_dir):
    return load_model(tiny_nemotron_dir)  # its samples vary with the seed (the tiny SetDLM's are nearly greedy)


# -- options ------------------------------------------------------------------------------------------------


def test_concurrency_list_parses_a_single_value_and_a_comma_list():
    assert concurrency_list("1") == [1]
    assert concurrency_list("1, 4,16") == [1, 4, 16]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "--concurrency must be integers from 1 to 4096.*got 0"),
        ("-2", "--concurrency must be integers from 1 to 4096.*got -2"),
        ("1,0", "got 0 in 1,0"),
        ("1.5", "--concurrency must be comma-separated whole numbers.*got '1.5'"),
        ("four", "got 'four'"),
        ("4,1,4", "--concurrency repeats a value: 4,1,4"),
        ("1,,4", "entry 2 is empty"),
        ("", "entry 1 is empty"),
        ("5000", "from 1 to 4096"),
    ],
)
def test_bad_concurrency_values_are_refused_with_what_to_give(text, message):
    with pytest.raises(ConfigError, match=message):
        concurrency_list(text)


@pytest.mark.parametrize("values", [[], [0], [2, 2], [True], [1.0], ["4"]])
def test_settings_refuse_bad_concurrency_from_python_too(values):
    with pytest.raises(ConfigError, match="concurrency"):
        BenchSettings(task="smoke", schedules=["ar"], widths=[2], concurrency=values).validate()


def test_the_command_line_reports_a_bad_concurrency_in_one_line(tmp_path, tiny_nemotron_dir, capsys):
    base = ["bench", "--model", str(tiny_nemotron_dir), "--no-progress", "--out", str(tmp_path / "x")]
    for bad in ("0", "-1", "2.5", "1,4,1"):
        assert main([*base, "--concurrency", bad]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: --concurrency") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_help_names_the_option(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "--concurrency" in capsys.readouterr().out


def test_the_baseline_is_named_without_a_concurrency():
    bad = BenchSettings(task="smoke", schedules=["ar", "packed"], widths=[2], concurrency=[1, 4], baseline="ar@c4")
    with pytest.raises(ConfigError, match="--baseline ar@c4: name the baseline without a concurrency"):
        bad.validate()


# -- methods, labels, keys, settings ------------------------------------------------------------------------


def test_labels_keep_todays_name_at_concurrency_one_and_parse_back():
    assert Method("packed", 2).label == "packed/w2" and Method("ar").label == "ar"
    assert Method("packed", 2, 4).label == "packed/w2@c4" and Method("ar", None, 16).label == "ar@c16"
    for method in (Method("ar"), Method("packed", 2, 4), Method("ar", None, 8), Method("packed", "auto", 2)):
        assert Method.parse(method.label) == method
    assert Method("packed", 2, 4).unbatched_label == "packed/w2" and Method("packed", 2, 4).at(1) == Method("packed", 2)


def test_methods_run_per_concurrency_in_order():
    settings = BenchSettings(task="smoke", schedules=["ar", "packed"], widths=[2, 4], concurrency=[1, 4])
    assert [m.label for m in settings.methods()] == [
        "ar",
        "packed/w2",
        "packed/w4",
        "ar@c4",
        "packed/w2@c4",
        "packed/w4@c4",
    ]
    assert settings.baseline_method() == "ar" and settings.to_dict()["concurrency"] == [1, 4]
    assert BenchSettings.from_dict(settings.to_dict()).concurrency == [1, 4]
    assert "--concurrency 1,4" in equivalent_command(settings, "out")
    assert "--concurrency" not in equivalent_command(BenchSettings(task="smoke", schedules=["ar"], widths=[2]), "o")


def test_record_keys_are_todays_at_concurrency_one():
    old = {"prompt_index": 3, "repeat": 1, "schedule": "packed", "width": 2}  # a record from before --concurrency
    assert record_key(old) == (3, 1, "packed", 2) and record_method(old) == Method("packed", 2)
    assert record_key({**old, "concurrency": 1}) == (3, 1, "packed", 2)
    assert record_key({**old, "concurrency": 4}) == (3, 1, "packed", 2, 4)
    assert record_method({**old, "concurrency": 4}) == Method("packed", 2, 4)


def test_concurrency_defines_what_a_record_means_but_old_runs_meant_one():
    current = BenchSettings(task="smoke", schedules=["ar"], widths=[2]).to_dict()
    old = {k: v for k, v in current.items() if k != "concurrency"}
    assert differences(old, current) == []
    batched = {**current, "concurrency": [1, 4]}
    assert differences(old, batched) == ["concurrency: [1] -> [1, 4]"]
    assert differences(current, batched) == ["concurrency: [1] -> [1, 4]"]


# -- closed-loop timing on a fake clock ---------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_generation(ids):
    return Generation(text="", prompt_ids=[1], output_ids=list(ids), stop_reason="length")


def scripted_stream(clock, script):
    """A stream_many that yields ``(time, index, token_ids, done)`` events, setting the clock to each time."""
    seen = {}

    def stream_many(prompts, *, seeds, max_batch):
        assert max_batch == 2 and len(seeds) == len(prompts) == 3
        for time, index, ids, done in script:
            clock.now = time
            seen.setdefault(index, []).extend(ids)
            yield index, StreamPiece("", list(ids), fake_generation(seen[index]) if done else None)
        clock.now = 10.0

    return stream_many


def test_closed_loop_timing_counts_from_admission_and_spreads_a_piece_over_its_tokens():
    clock = FakeClock()
    clock.now = 1.0  # the run starts at 1.0: requests 0 and 1 are admitted then
    script = [
        (1.5, 0, [7], False),  # request 0: first token after 0.5 s
        (2.0, 1, [8, 9], False),  # request 1: first tokens after 1.0 s
        (2.5, 0, [7, 7], False),  # request 0: 2 tokens 1.0 s after its first: 0.5 s each
        (3.0, 0, [], True),  # request 0 finishes: request 2 takes its slot at 3.0
        (3.5, 1, [9], True),  # request 1: 1 token after 1.5 s, finishes
        (4.25, 2, [5], False),  # request 2: first token 1.25 s after its admission
        (4.5, 2, [], True),
    ]
    result = run_closed_loop(scripted_stream(clock, script), ["a", "b", "c"], [0, 1, 2], 2, clock=clock)
    first, second, third = result.timings
    assert first.ttft_s == pytest.approx(0.5) and first.itl_s == pytest.approx([0.5, 0.5])
    assert first.latency_s == pytest.approx(2.0)
    assert second.ttft_s == pytest.approx(1.0) and second.itl_s == pytest.approx([1.5])
    assert third.admitted == pytest.approx(3.0) and third.ttft_s == pytest.approx(1.25) and third.itl_s == []
    assert result.wall_s == pytest.approx(9.0)  # to the stream's end, where the fake clock reads 10
    assert [g.output_ids for g in result.generations] == [[7, 7, 7], [8, 9, 9], [5]]
    assert result.output_tokens == 7


def test_a_stream_that_drops_a_request_is_an_error_not_a_short_record():
    clock = FakeClock()
    script = [(0.1, 0, [1], True), (0.2, 1, [2], True)]
    with pytest.raises(SpecframeError, match=r"without finishing request\(s\) \[2\]"):
        run_closed_loop(scripted_stream(clock, script), ["a", "b", "c"], [0, 1, 2], 2, clock=clock)


def test_stream_many_decodes_what_generate_decodes_with_each_requests_seed(tiny_nemotron):
    from specframe.config import compose

    config = {"model": tiny_nemotron, "schedule": "packed", "width": 2, "max_new_tokens": 5, "acceptance": SAMPLING}
    decoder = compose(config)
    ids = [[5, 6, 7], [5, 6, 7], [8, 9]]
    pieces = list(decoder.stream_many(ids, seeds=[0, 1, 2], max_batch=2))
    done = {index: piece.generation.output_ids for index, piece in pieces if piece.done}
    alone = {i: decoder.generate(prompt_ids=p, seed=i).output_ids for i, p in enumerate(ids)}
    assert done == alone and alone[0] != alone[1]  # the seeds matter, and each request got its own


# -- summary and report on synthetic records ----------------------------------------------------------------


def record(prompt, schedule, width, concurrency, *, repeat=0, tokens=10, nfe=5, ids=None, loop=None, **timing):
    return {
        "prompt_index": prompt,
        "repeat": repeat,
        "schedule": schedule,
        "width": width,
        "concurrency": concurrency,
        "correct": None,
        "exact": True,
        "stochastic": False,
        "output_ids": list(ids if ids is not None else [prompt] * tokens),
        "metrics": {
            "generated_tokens": tokens,
            "wall_s": timing.pop("wall", 1.0),
            "model_s": 0.5,
            "nfe": nfe,
            "rows_per_call_max": 3,
            "widths": timing.pop("widths", {}),
            "acceptance": {},
        },
        "ttft_s": timing.get("ttft"),
        "itl_s": timing.get("itl", []),
        "latency_s": timing.get("latency"),
        "loop": loop,
    }


AR1, PACKED1, AR2, PACKED2 = Method("ar"), Method("packed", 2), Method("ar", None, 2), Method("packed", 2, 2)
METHODS = [AR1, PACKED1, AR2, PACKED2]


def loop(label, repeat, tokens, wall):
    return {"id": f"{label}/r{repeat}", "wall_s": wall, "requests": 2, "output_tokens": tokens}


def synthetic(repeats=1, packed2_ids=None):
    records = []
    for r in range(repeats):
        for p in range(2):
            records += [
                record(p, "ar", None, 1, repeat=r, nfe=10, wall=1.0, ttft=0.1 * (p + 1), itl=[0.01, 0.03], latency=1.0),
                record(p, "packed", 2, 1, repeat=r, nfe=5, wall=0.5, ttft=0.2, itl=[0.02], latency=0.5),
                record(
                    p,
                    "ar",
                    None,
                    2,
                    repeat=r,
                    nfe=10,
                    ttft=0.3,
                    itl=[0.05],
                    latency=0.8,
                    loop=loop("ar@c2", r, 20, 0.5 + 0.5 * r),
                    widths={"1": 10},
                ),
                record(
                    p,
                    "packed",
                    2,
                    2,
                    repeat=r,
                    nfe=5,
                    ttft=0.4,
                    itl=[0.06],
                    latency=0.6,
                    ids=packed2_ids(p) if packed2_ids else None,
                    loop=loop("packed/w2@c2", r, 20, 0.25 + 0.5 * r),
                    widths={"2": 3, "0": 1},
                ),
            ]
    return records


def test_batched_methods_are_compared_with_the_baseline_at_their_own_concurrency():
    assert pair_baseline(PACKED2, "ar", METHODS) == AR2 and pair_baseline(PACKED1, "ar", METHODS) == AR1
    assert unbatched_reference(PACKED2, METHODS) == PACKED1 and unbatched_reference(PACKED1, METHODS) is None
    assert unbatched_reference(Method("ar", None, 8), [Method("ar", None, 4), Method("ar", None, 8)]) == Method(
        "ar", None, 4
    )


def test_summary_per_method_and_concurrency_from_one_run():
    s = summarize(synthetic(), METHODS, baseline="ar", repeats=1, resamples=200)
    by = {m["method"]: m for m in s["methods"]}
    assert s["bootstrap"]["closed_loop_unit"] is None
    # concurrency 1: as always, total tokens / total decoder seconds, bootstrap over prompts
    assert by["ar"]["throughput_tok_s"] == pytest.approx(20 / 2.0) and by["ar"]["throughput_unit"] == "prompt"
    assert by["ar"]["throughput_ci"]["low"] is not None
    # concurrency 2: the closed-loop run's tokens / its wall time, one run: no interval
    assert by["ar@c2"]["throughput_tok_s"] == pytest.approx(20 / 0.5)
    assert by["packed/w2@c2"]["throughput_tok_s"] == pytest.approx(20 / 0.25)
    assert by["packed/w2@c2"]["throughput_ci"] == {"estimate": pytest.approx(80.0), "low": None, "high": None}
    assert by["packed/w2@c2"]["throughput_unit"] is None and by["packed/w2@c2"]["closed_loop_runs"] == 1
    assert by["ar@c2"]["throughput_vs_lowest"] == pytest.approx(40 / 10)
    assert by["packed/w2@c2"]["mean_wall_s"] == pytest.approx(0.6)  # request latency, not shared decoder time
    assert by["packed/w2@c2"]["time_per_nfe_ms"] is None and by["packed/w2@c2"]["non_model_share"] is None
    assert by["packed/w2@c2"]["tokens_per_nfe"] == pytest.approx(2.0)
    # latency percentiles over the pooled values (linear interpolation), mean width over planned calls
    assert by["ar"]["ttft_s"]["p50"] == pytest.approx(0.15) and by["ar"]["ttft_s"]["p99"] == pytest.approx(0.199)
    assert by["ar"]["itl_s"]["p50"] == pytest.approx(0.02) and by["ar"]["itl_s"]["p90"] == pytest.approx(0.03)
    assert set(by["ar"]["ttft_s"]) == {"p50", "p90", "p99"} and set(by["ar"]["itl_s"]) == {"p50", "p90"}
    assert by["packed/w2@c2"]["mean_width"] == pytest.approx(6 / 4) and by["ar@c2"]["mean_width"] == 1
    assert by["packed/w2"]["mean_width"] is None  # records without choices
    assert by["packed/w2@c2"]["same_as_unbatched"]["same"] == 2 and by["ar"].get("same_as_unbatched") is None
    comparisons = {c["method"]: c for c in s["comparisons"]}
    batched = comparisons["packed/w2@c2"]
    assert batched["baseline"] == "ar@c2" and batched["concurrency"] == 2 and not batched["flagged"]
    assert batched["throughput_ratio"] == {"estimate": pytest.approx(2.0), "low": None, "high": None}
    assert batched["wall_diff_s"] is None and batched["time_per_nfe_ratio"] is None
    assert batched["tokens_per_nfe_ratio"]["estimate"] == pytest.approx(2.0)
    assert batched["tokens_per_nfe_ratio"]["low"] is not None  # per-response: still over prompts
    assert comparisons["packed/w2"]["throughput_ratio"]["estimate"] == pytest.approx(20.0 / 10.0)
    report = format_report(s)
    assert "packed/w2@c2 vs ar@c2" in report and "2.000 (1 run)" in report
    assert "TTFT p50" in report and "ITL p50" in report and "same as c1" in report
    assert "a point estimate from one run, without an interval" in report and "!" not in report


def test_with_repeats_batched_throughput_has_an_interval_over_repeats():
    s = summarize(synthetic(repeats=2), METHODS, baseline="ar", repeats=2, resamples=300)
    by = {m["method"]: m for m in s["methods"]}
    assert s["bootstrap"]["closed_loop_unit"] == "repeat" and by["ar@c2"]["closed_loop_runs"] == 2
    assert by["ar@c2"]["throughput_tok_s"] == pytest.approx(40 / (0.5 + 1.0))
    ci = by["ar@c2"]["throughput_ci"]
    assert ci["low"] <= ci["estimate"] <= ci["high"] and ci["low"] < ci["high"]  # the two runs differ
    ratio = next(c for c in s["comparisons"] if c["method"] == "packed/w2@c2")["throughput_ratio"]
    assert ratio["estimate"] == pytest.approx((40 / 1.0) / (40 / 1.5)) and ratio["low"] <= ratio["high"]
    assert "intervals from a paired bootstrap over repeats" in format_report(s)


def test_batched_output_that_differs_from_unbatched_is_flagged():
    s = summarize(
        synthetic(packed2_ids=lambda p: [p] * 9 + [99] if p == 1 else None), METHODS, baseline="ar", repeats=1
    )
    packed2 = next(m for m in s["methods"] if m["method"] == "packed/w2@c2")
    assert packed2["same_as_unbatched"] == {
        "baseline": "packed/w2",
        "same": 1,
        "of": 2,
        "first_divergence": {"prompt_index": 1, "repeat": 0, "token": 9},
    }
    assert next(c for c in s["comparisons"] if c["method"] == "packed/w2@c2")["flagged"] is True
    report = format_report(s)
    assert "1/2 !" in report and "2.000 (1 run) !" in report
    assert "! packed/w2@c2: only 1/2 responses equal packed/w2's (first divergence: prompt 1, repeat 0, token 9)" in (
        report
    )


def test_a_sampled_batched_response_is_still_compared_with_unbatched():
    records = [{**r, "stochastic": True} for r in synthetic(packed2_ids=lambda p: [5])]
    methods = summarize(records, METHODS, baseline="ar", repeats=1)["methods"]
    packed2 = next(m for m in methods if m["method"] == "packed/w2@c2")
    assert packed2["same_as_baseline"] is None  # other methods may sample other tokens
    assert packed2["same_as_unbatched"]["same"] == 0  # the same method with the same seeds may not


def test_throughput_vs_concurrency_plot_only_with_several_concurrencies(tmp_path):
    s = summarize(synthetic(), METHODS, baseline="ar", repeats=1, resamples=100)
    lines = throughput_lines(s)
    assert list(lines) == ["ar", "packed/w2"] and [c for c, _ in lines["packed/w2"]] == [1, 2]
    written = plot_comparisons(s, tmp_path)
    assert tmp_path / "throughput_vs_concurrency.png" in written
    one = summarize([r for r in synthetic() if r["concurrency"] == 1], METHODS[:2], baseline="ar", repeats=1)
    assert tmp_path / "other" / "throughput_vs_concurrency.png" not in plot_comparisons(one, tmp_path / "other")


# -- end to end on the tiny model ---------------------------------------------------------------------------


def settings(**overrides):
    values = dict(
        task="smoke",
        schedules=["ar", "packed"],
        widths=[2],
        max_new_tokens=6,
        limit=3,
        warmup=1,
        resamples=200,
        concurrency=[1, 2],
        threads=1,
    )
    values.update(overrides)
    return BenchSettings(**values)


def run(folder, model, **overrides):
    plots = overrides.pop("plots", False)
    return run_bench(settings(**overrides), folder, model=model, progress=False, log=lambda _: None, plots=plots)


def by_method(folder):
    out = {}
    for r in read_records(folder / "records.jsonl"):
        out.setdefault(r["method"], {})[(r["prompt_index"], r["repeat"])] = r
    return out


def test_bench_at_concurrency_one_and_two_gives_the_same_outputs(tmp_path, tiny_setdlm):
    summary, report = run(tmp_path, tiny_setdlm, plots=True)
    records = read_records(tmp_path / "records.jsonl")
    assert len(records) == 3 * 2 * 2
    assert [r["method"] for r in records[:2]] == ["ar", "packed/w2"]  # concurrency 1 first, interleaved as always
    assert [r["concurrency"] for r in records] == [1] * 6 + [2] * 6
    methods = by_method(tmp_path)
    for name in ("ar", "packed/w2"):
        for key, r in methods[name].items():
            batched = methods[f"{name}@c2"][key]
            assert batched["output_ids"] == r["output_ids"] and batched["text"] == r["text"]
            assert batched["seed"] == r["seed"]
    batched = methods["packed/w2@c2"][(0, 0)]
    assert batched["loop"]["requests"] == 3 and batched["loop"]["wall_s"] > 0
    assert batched["loop"]["output_tokens"] == sum(len(r["output_ids"]) for r in methods["packed/w2@c2"].values())
    assert len({r["loop"]["id"] for r in methods["packed/w2@c2"].values()}) == 1
    for r in records:
        assert r["ttft_s"] is not None and r["latency_s"] >= r["ttft_s"] >= 0
        assert len(r["itl_s"]) <= len(r["output_ids"]) - 1 and all(v >= 0 for v in r["itl_s"])
        assert (r["loop"] is None) == (r["concurrency"] == 1)
    by = {m["method"]: m for m in summary["methods"]}
    assert by["packed/w2@c2"]["same_as_unbatched"]["same"] == 3 and by["ar@c2"]["same_as_unbatched"]["same"] == 3
    assert not any(c["flagged"] for c in summary["comparisons"])
    assert {c["method"]: c["baseline"] for c in summary["comparisons"]} == {
        "packed/w2": "ar",
        "packed/w2@c2": "ar@c2",
    }
    assert "packed/w2@c2 vs ar@c2" in report and "(1 run)" in report
    assert (tmp_path / "throughput_vs_concurrency.png").exists()
    run_json = json.loads((tmp_path / "run.json").read_text())
    assert run_json["settings"]["concurrency"] == [1, 2]


def test_a_batched_output_that_changed_shows_with_the_flag(tmp_path, tiny_setdlm, monkeypatch):
    import dataclasses

    from specframe.decoder import Decoder

    real = Decoder.stream_many

    def corrupting(self, prompts, **options):
        for index, piece in real(self, prompts, **options):
            if options.get("max_batch", 1) > 1 and index == 1 and piece.done:  # request 1's last token differs
                ids = [*piece.generation.output_ids[:-1], piece.generation.output_ids[-1] + 1]
                piece = dataclasses.replace(piece, generation=dataclasses.replace(piece.generation, output_ids=ids))
            yield index, piece

    monkeypatch.setattr(Decoder, "stream_many", corrupting)
    summary, report = run(tmp_path, tiny_setdlm, schedules=["ar", "packed"], warmup=0)
    packed2 = next(m for m in summary["methods"] if m["method"] == "packed/w2@c2")
    assert packed2["same_as_unbatched"]["same"] == 2 and packed2["same_as_unbatched"]["of"] == 3
    assert packed2["same_as_unbatched"]["first_divergence"] == {"prompt_index": 1, "repeat": 0, "token": 5}
    assert next(c for c in summary["comparisons"] if c["method"] == "packed/w2@c2")["flagged"]
    assert "2/3 !" in report and "! packed/w2@c2: only 2/3 responses equal packed/w2's" in report
    assert "! ar@c2: only 2/3 responses equal ar's" in report


def test_seeded_sampling_is_the_same_at_every_concurrency(tmp_path, tiny_nemotron):
    summary, _ = run(tmp_path, tiny_nemotron, schedules=["packed"], repeats=2, acceptance=SAMPLING)
    methods = by_method(tmp_path)
    assert len(methods["packed/w2@c2"]) == 3 * 2
    unbatched = {k: r["output_ids"] for k, r in methods["packed/w2"].items()}
    assert {k: r["output_ids"] for k, r in methods["packed/w2@c2"].items()} == unbatched
    assert len({tuple(ids) for ids in unbatched.values()}) > 1  # the responses do differ with the seed
    assert summary["methods"][1]["same_as_unbatched"]["same"] == 6


def test_resume_reruns_an_unfinished_closed_loop_run_and_refuses_another_concurrency(tmp_path, tiny_setdlm):
    run(tmp_path, tiny_setdlm)
    lines = (tmp_path / "records.jsonl").read_text().splitlines(keepends=True)
    full = by_method(tmp_path)
    run(tmp_path, tiny_setdlm)  # nothing to do
    assert (tmp_path / "records.jsonl").read_text() == "".join(lines)
    # a run whose last closed-loop run lost its last two records (its other records stay)
    (tmp_path / "records.jsonl").write_text("".join(lines[:-2]))
    run(tmp_path, tiny_setdlm)
    resumed = by_method(tmp_path)
    assert {k: r["output_ids"] for k, r in resumed["packed/w2@c2"].items()} == {
        k: r["output_ids"] for k, r in full["packed/w2@c2"].items()
    }
    assert len(read_records(tmp_path / "records.jsonl")) == len(lines)
    with pytest.raises(SpecframeError, match=r"concurrency: \[1, 2\] -> \[1, 4\]"):
        run(tmp_path, tiny_setdlm, concurrency=[1, 4])
    with pytest.raises(SpecframeError, match=r"concurrency: \[1, 2\] -> \[1\]"):
        run(tmp_path, tiny_setdlm, concurrency=[1])


def test_a_folder_from_before_concurrency_resumes_and_merges(tmp_path, tiny_setdlm):
    old = tmp_path / "old"
    run(old, tiny_setdlm, concurrency=[1])
    stored = json.loads((old / "run.json").read_text())
    del stored["settings"]["concurrency"]
    (old / "run.json").write_text(json.dumps(stored))
    records = read_records(old / "records.jsonl")
    legacy = [
        {k: v for k, v in r.items() if k not in ("concurrency", "ttft_s", "itl_s", "latency_s", "loop")}
        for r in records
    ]
    (old / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in legacy[:-1]))  # and one short
    summary, report = run(old, tiny_setdlm, concurrency=[1])
    assert len(read_records(old / "records.jsonl")) == len(records)  # only the missing response ran
    assert summary["prompts"] == 3 and "TTFT" in report  # the new record has timings; old ones have none
    copy = tmp_path / "copy"
    shutil.copytree(old, copy)
    merged, _ = merge_runs([old, copy], tmp_path / "merged", log=lambda _: None, plots=False)
    assert merged["responses_per_method"] == 3


def test_shards_with_concurrency_merge(tmp_path, tiny_setdlm):
    a, b = tmp_path / "a", tmp_path / "b"
    run(a, tiny_setdlm, limit=4, shard=(0, 2), schedules=["ar"], warmup=0)
    run(b, tiny_setdlm, limit=4, shard=(1, 2), schedules=["ar"], warmup=0)
    summary, _ = merge_runs([a, b], tmp_path / "m", log=lambda _: None, plots=False)
    batched = next(m for m in summary["methods"] if m["method"] == "ar@c2")
    assert summary["prompts"] == 4 and batched["closed_loop_runs"] == 1  # one repeat, run in two shards
    shard_runs = [by_method(f)["ar@c2"] for f in (a, b)]
    tokens = sum(next(iter(r.values()))["loop"]["output_tokens"] for r in shard_runs)
    wall = sum(next(iter(r.values()))["loop"]["wall_s"] for r in shard_runs)
    assert batched["throughput_tok_s"] == pytest.approx(tokens / wall)
    assert batched["same_as_unbatched"]["same"] == 4


def test_the_command_line_runs_two_concurrencies(tmp_path, tiny_nemotron_dir, capsys):
    out = tmp_path / "run"
    args = ["bench", "--model", str(tiny_nemotron_dir), "--limit", "2", "--schedules", "ar,packed", "--widths", "2"]
    args += ["--max-new-tokens", "5", "--concurrency", "1,2", "--threads", "1", "--resamples", "100"]
    assert main([*args, "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "packed/w2@c2 vs ar@c2" in printed and "TTFT p50" in printed and "same as c1" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [m["method"] for m in summary["methods"]] == ["ar", "packed/w2", "ar@c2", "packed/w2@c2"]
    assert summary["settings"]["concurrency"] == [1, 2]
    assert "--concurrency 1,2" in json.loads((out / "run.json").read_text())["command"]
