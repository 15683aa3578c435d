"""width "auto" with a plugin schedule: chosen per call when it declares width candidates, else declared or refused."""

from __future__ import annotations

import pytest

from decoding_helpers import SETDLM, SYNTHETIC_COST, eos_ids, tiny_model
from specframe import compose, hookimpl
from specframe.errors import ConfigError
from specframe.plan import DraftGroup
from specframe.plugins import plugin_registered
from specframe.schedules.ar import ARSchedule
from specframe.schedules.base import Schedule, store_group, verification_window, verify_planned_chain, window_plan
from specframe.schedules.packed import PackedSchedule


class _MyPacked(PackedSchedule):
    """A plugin subclass of a built-in schedule: it inherits Packed-SS's rate model and width candidates."""


class _OwnPacked(Schedule):
    """A plugin schedule of its own (Packed-SS written from the base class) that declares its widths."""

    name = "own-packed"
    exact = True
    rate_model = "packed"

    def width_candidates(self, maximum):
        return tuple(w for w in (3, 5) if w <= maximum)

    def plan(self, state):
        window = verification_window(state)
        targets = tuple(p for p in state.window(after=window.order[: window.num_verify]))
        return window_plan(state, window, (DraftGroup(context=0, targets=targets),))

    def update(self, state, plan, result):
        verdict = verify_planned_chain(state, plan, result)
        store_group(state, plan, result)
        return verdict


class _Fixed(ARSchedule):  # declares no rate model: its width is not chosen
    name = "fixed"
    exact = True
    takes_width = True


class _Declared(_Fixed):
    auto_width = 5


class _BadDeclaration(_Fixed):
    auto_width = 0


class _BadModel(_Fixed):
    rate_model = "telepathy"


class _Plugin:
    @hookimpl
    def register_schedules(self, register):
        register("my-packed", _MyPacked)
        register("own-packed", _OwnPacked)
        register("fixed", _Fixed)
        register("declared", _Declared)
        register("bad-declaration", _BadDeclaration)
        register("bad-model", _BadModel)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(SETDLM, tmp_path_factory.mktemp("width"), vocab=24, seed=1)


@pytest.fixture(autouse=True)
def _registered():
    with plugin_registered(_Plugin(), "width_test"):
        yield


def _labels(decoder, model):
    with eos_ids(model, ()):
        result = decoder.generate(prompt_ids=[3, 5, 7])
    return result, {label for label, _ in result.metrics.choices[1:]}


def test_a_plugin_subclass_of_a_built_in_schedule_has_its_width_chosen(model):
    reference = compose({"model": model, "schedule": "ar", "max_new_tokens": 40})
    decoder = compose(
        {"model": model, "schedule": "my-packed", "cost": {"tau": 0.01, "delta": 0.0}, "max_new_tokens": 40}
    )
    assert decoder.schedule.schedules[0].__class__ is _MyPacked and decoder.width == 16
    result, labels = _labels(decoder, model)
    assert labels and all(label.startswith("packed/w") for label in labels)  # rows are free: it drafts
    assert result.output_ids == _labels(reference, model)[0].output_ids
    assert not result.exact  # a plugin subclass declared no exactness of its own: the choice claims none


def test_a_plugin_schedule_declaring_its_own_widths_is_chosen_among_them(model):
    reference = compose({"model": model, "schedule": "ar", "max_new_tokens": 40})
    decoder = compose(
        {"model": model, "schedule": "own-packed", "cost": {"tau": 0.01, "delta": 0.0}, "max_new_tokens": 40}
    )
    result, labels = _labels(decoder, model)
    assert labels <= {"own-packed/w3", "own-packed/w5"} and "own-packed/w5" in labels
    assert result.output_ids == _labels(reference, model)[0].output_ids and result.exact


def test_auto_is_refused_for_a_plugin_schedule_that_declares_no_width(model):
    for config in ({}, {"width": "auto"}):
        with pytest.raises(ConfigError, match=r"schedule 'fixed' cannot have its width chosen.*--width 8"):
            compose({"model": model, "schedule": "fixed", **config})
    with pytest.raises(ConfigError, match="rate_model='telepathy'.*'packed'"):
        compose({"model": model, "schedule": "bad-model"})


def test_a_given_width_or_a_declared_one_is_used(model):
    assert compose({"model": model, "schedule": "my-packed", "width": 4}).width == 4
    assert compose({"model": model, "schedule": "fixed", "width": 4}).width == 4
    assert compose({"model": model, "schedule": "declared"}).width == 5
    assert compose({"model": model, "schedule": "declared", "width": 3}).width == 3
    with pytest.raises(ConfigError, match="auto_width=0"):
        compose({"model": model, "schedule": "bad-declaration"})


def test_built_in_schedules_keep_their_auto(model):
    assert compose({"model": model, "schedule": "native"}).width == 8  # native declares 8
    assert compose({"model": model, "schedule": "packed", "cost": SYNTHETIC_COST}).schedule.name == "packed"
    assert compose({"model": model, "schedule": "ar"}).width == 1
