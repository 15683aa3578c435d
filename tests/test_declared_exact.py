"""Exactness is declared by acceptance rules and schedules, and shown wherever an output is reported."""

from __future__ import annotations

import json

import pytest

from specframe import compose
from specframe.acceptance.base import AcceptanceRule
from specframe.acceptance.greedy import GreedyAcceptance
from specframe.cli import main
from specframe.exactness import declared_exact, inexact_reason, is_exact
from specframe.schedules.native import NativeSchedule
from specframe.schedules.packed import PackedSchedule


class _Typical(GreedyAcceptance):
    """A plugin's lossy rule that subclasses the greedy one and says nothing."""


class _SaysExact(GreedyAcceptance):
    exact = True


class _SaysLossy(AcceptanceRule):
    exact = False

    def propose(self, logits, generator):  # pragma: no cover - never called
        raise NotImplementedError

    def verify(self, drafts, logits, generator):  # pragma: no cover - never called
        raise NotImplementedError


class _MyNative(NativeSchedule):  # a plugin's lossy schedule inherits the lossy declaration's meaning
    pass


def test_builtins_declare_and_plugins_that_say_nothing_are_not_assumed_exact():
    assert declared_exact(GreedyAcceptance()) is True
    assert declared_exact(PackedSchedule) is True
    assert declared_exact(NativeSchedule) is False
    assert declared_exact(_Typical()) is None  # a subclass of a built-in inherits no declaration
    assert declared_exact(_SaysExact()) is True
    assert declared_exact(_SaysLossy()) is False
    assert declared_exact(_MyNative) is None
    assert is_exact(GreedyAcceptance(), PackedSchedule())
    assert not is_exact(_Typical(), PackedSchedule())
    assert "acceptance rule" in inexact_reason(_Typical(), PackedSchedule())


@pytest.mark.parametrize("model", ["setdlm-stdlib-tiny", "nemotron-stdlib-tiny"])
def test_a_generation_says_whether_it_is_exact(model):
    config = {"model": model, "max_new_tokens": 4, "width": 4}
    assert compose(config, schedule="packed").generate("def f(").exact is True
    native = compose(config, schedule="native")
    assert native.exact is False and native.describe()["exact"] is False
    assert native.generate("def f(").to_dict()["exact"] is False


def test_generate_json_and_its_stderr_say_not_exact(capsys):
    common = ["generate", "--model", "setdlm-stdlib-tiny", "--max-new-tokens", "4", "--json", "def f("]
    assert main([*common[:-1], "--schedule", "native", common[-1]]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["exact"] is False
    assert "not exact: schedule 'native' declares exact = False" in err
    assert main(common) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["exact"] is True and "not exact" not in err


def test_plugins_lists_each_native_with_its_family_options_and_exactness(capsys):
    assert main(["plugins"]) == 0
    entries = json.loads(capsys.readouterr().out)
    natives = sorted((e for e in entries if e["name"] == "native"), key=lambda e: e["family"])
    assert [e["family"] for e in natives] == ["nemotron-labs-diffusion", "setdlm"]
    assert all(e["options"] == {"threshold": 0.9} and e["exact"] is False for e in natives)
    packed = next(e for e in entries if e["kind"] == "schedule" and e["name"] == "packed")
    assert packed["exact"] is True and packed["family"] is None
    rejection = next(e for e in entries if e["name"] == "rejection")
    assert rejection["exact"] is True and rejection["options"]["temperature"] == 1.0


class _TypicalPlugin:
    from specframe.hookspecs import hookimpl

    @hookimpl
    def register_acceptance_rules(self, register):
        register("typical", _Typical)


def test_a_plugin_rule_that_says_nothing_is_labelled_and_its_width_auto_reads_no_timing():
    from specframe.plugins import plugin_registered

    with plugin_registered(_TypicalPlugin(), "typical_plugin"):
        decoder = compose({"model": "setdlm-stdlib-tiny", "acceptance": "typical", "max_new_tokens": 4})
        assert decoder.exact is False and decoder.schedule.deterministic
        assert decoder.generate("def f(").exact is False


def test_the_not_exact_note_names_a_plugin_rule_by_its_registered_name(capsys):
    from specframe.plugins import plugin_registered

    args = ["generate", "--model", "setdlm-stdlib-tiny", "--max-new-tokens", "2", "--width", "2", "--json", "def f("]
    with plugin_registered(_TypicalPlugin(), "typical_plugin"):
        assert main([*args[:-1], "--acceptance", "typical", args[-1]]) == 0
    err = capsys.readouterr().err
    assert "not exact: acceptance rule 'typical' does not declare exact = True" in err, err  # not the class _Typical
