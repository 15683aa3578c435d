"""Plugin options on the command line (``NAME:key=value,...``) for generate and bench (issue 12, item 2)."""

from __future__ import annotations

import json

import pytest

from specframe.bench.settings import Method
from specframe.cli import build_parser, decoder_config, main
from specframe.errors import ConfigError
from specframe.hookspecs import hookimpl
from specframe.plugins import plugin_registered
from specframe.schedules.packed import PackedSchedule
from specframe.specs import format_spec, parse_spec, split_specs


class _Tunable(PackedSchedule):
    """Packed-SS with options that only show up in describe() (enough to see them arrive)."""

    def __init__(self, patience: int = 3, label: str = "x", eager: bool = False) -> None:
        self.options = {"patience": patience, "label": label, "eager": eager}

    def describe(self):
        return {"name": "tunable", **self.options}


class _Plugin:
    @hookimpl
    def register_schedules(self, register):
        register("tunable", _Tunable)


@pytest.fixture(autouse=True)
def tunable_registered():
    with plugin_registered(_Plugin(), "tunable_plugin"):
        yield


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("packed", "packed"),
        ("tunable:patience=2", {"name": "tunable", "patience": 2}),
        (
            "tunable:patience=2,label=fast,eager=true",
            {"name": "tunable", "patience": 2, "label": "fast", "eager": True},
        ),
        ('tunable:label="7"', {"name": "tunable", "label": "7"}),
        (
            "rejection:temperature=0.7,top_k=20,top_p=null",
            {"name": "rejection", "temperature": 0.7, "top_k": 20, "top_p": None},
        ),
    ],
)
def test_specs_parse_json_scalars(text, value):
    assert parse_spec(text) == value
    assert parse_spec(format_spec(value)) == value


@pytest.mark.parametrize(
    "text", [":patience=2", "tunable:patience", "tunable:2=3", "tunable:a=1,a=2", "tunable:name=x"]
)
def test_malformed_specs(text):
    with pytest.raises(ConfigError):
        parse_spec(text)


def test_split_specs_keeps_options_with_their_schedule():
    assert split_specs("ar,tunable:patience=2,label=a,packed") == ["ar", "tunable:patience=2,label=a", "packed"]
    with pytest.raises(ConfigError, match="follows no NAME:key=value"):
        split_specs("ar,patience=2")


def test_generate_passes_schedule_and_acceptance_options(capsys):
    code = main(["generate", "def f(x):", "--schedule", "tunable:patience=5,label=go", "--width", "3",
                 "--max-new-tokens", "3", "--acceptance", "rejection:temperature=0.5,top_k=3", "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(json.loads(out)["output_ids"]) == 3
    args = build_parser(["generate"]).parse_args(
        [
            "generate",
            "x",
            "--schedule",
            "tunable:patience=5",
            "--acceptance",
            "rejection:top_k=3",
            "--temperature",
            "0.5",
        ]
    )
    config = decoder_config(args)
    assert config["schedule"] == {"name": "tunable", "patience": 5}
    assert config["acceptance"] == {"name": "rejection", "top_k": 3, "temperature": 0.5}


def test_an_unknown_option_names_the_plugin_and_its_options(capsys):
    code = main(["generate", "x", "--schedule", "tunable:patiense=5", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 1
    assert "schedule 'tunable' does not take option(s) 'patiense'; it takes: patience, label, eager" in err
    assert "(plugin 'tunable_plugin', distribution '<local>')" in err


def test_a_builtin_without_options_says_so(capsys):
    assert main(["generate", "x", "--order", "ltr:depth=2", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "order 'ltr' does not take option(s) 'depth'; it takes: no options" in err
    assert "distribution" not in err  # a built-in needs no origin


def test_bench_methods_and_records_carry_the_options(capsys, tmp_path):
    out = tmp_path / "run"
    code = main(["bench", "--schedules", "ar,tunable:patience=2,label=a,tunable:patience=4", "--widths", "2",
                 "--limit", "1", "--max-new-tokens", "3", "--warmup", "0", "--resamples", "50", "--no-progress",
                 "--baseline", "tunable:patience=4/w2", "--out", str(out)])  # fmt: skip
    printed, err = capsys.readouterr()
    assert code == 0, err
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    methods = {r["method"]: r for r in records}
    assert set(methods) == {"ar", "tunable:label=a,patience=2/w2", "tunable:patience=4/w2"}
    assert methods["tunable:label=a,patience=2/w2"]["schedule_options"] == {"label": "a", "patience": 2}
    assert methods["tunable:label=a,patience=2/w2"]["schedule_name"] == "tunable"
    # describe(), the schedule's own account of itself (defaults included), is in every record
    described = {"name": "tunable", "patience": 2, "label": "a", "eager": False}
    assert methods["tunable:label=a,patience=2/w2"]["schedule_description"] == described
    assert methods["ar"]["schedule_description"] == {"name": "ar"}
    assert "tunable:label=a,patience=2/w2 vs tunable:patience=4/w2" in printed
    # Rerunning the same command resumes: the stored settings hold the same canonical specs.
    assert main(["bench", "--schedules", "ar,tunable:label=a,patience=2,tunable:patience=4", "--widths", "2",
                 "--limit", "1", "--max-new-tokens", "3", "--warmup", "0", "--resamples", "50", "--no-progress",
                 "--baseline", "tunable:patience=4/w2", "--out", str(out)]) == 0  # fmt: skip
    assert "nothing to run" in capsys.readouterr().err


def test_method_labels_parse_back():
    method = Method.parse("tunable:patience=2,label=a/w8")
    assert method == Method("tunable:label=a,patience=2", 8)
    assert method.name == "tunable" and method.options == {"label": "a", "patience": 2}
    assert Method.parse(method.label) == method
