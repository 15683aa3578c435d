"""width "auto" with a plugin schedule: no cost model chooses its width, so it is declared or refused."""

from __future__ import annotations

import pytest

from decoding_helpers import SETDLM, SYNTHETIC_COST, tiny_model
from specframe import compose, hookimpl
from specframe.errors import ConfigError
from specframe.plugins import plugin_registered
from specframe.schedules.packed import PackedSchedule


class _MyPacked(PackedSchedule):
    """A plugin schedule (a subclass: its calls are not the built-in kind that "auto" chooses among)."""


class _Declared(PackedSchedule):
    auto_width = 5


class _BadDeclaration(PackedSchedule):
    auto_width = 0


class _Plugin:
    @hookimpl
    def register_schedules(self, register):
        register("my-packed", _MyPacked)
        register("declared", _Declared)
        register("bad-declaration", _BadDeclaration)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(SETDLM, tmp_path_factory.mktemp("width"), vocab=24, seed=1)


@pytest.fixture(autouse=True)
def _registered():
    with plugin_registered(_Plugin(), "width_test"):
        yield


def test_auto_is_refused_for_a_plugin_schedule_that_declares_no_width(model):
    for config in ({}, {"width": "auto"}):
        with pytest.raises(ConfigError, match=r"schedule 'my-packed' cannot have its width chosen.*--width 8"):
            compose({"model": model, "schedule": "my-packed", **config})


def test_a_given_width_or_a_declared_one_is_used(model):
    assert compose({"model": model, "schedule": "my-packed", "width": 4}).width == 4
    assert compose({"model": model, "schedule": "declared"}).width == 5
    assert compose({"model": model, "schedule": "declared", "width": 3}).width == 3
    with pytest.raises(ConfigError, match="auto_width=0"):
        compose({"model": model, "schedule": "bad-declaration"})


def test_built_in_schedules_keep_their_auto(model):
    assert compose({"model": model, "schedule": "native"}).width == 8  # native declares 8
    assert compose({"model": model, "schedule": "packed", "cost": SYNTHETIC_COST}).schedule.name == "packed"
    assert compose({"model": model, "schedule": "ar"}).width == 1
