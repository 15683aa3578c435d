"""Every request plans with its own copy of the schedule (``Schedule.for_request``): state on ``self`` is its own."""

from __future__ import annotations

import pytest

from decoding_helpers import SETDLM, tiny_model
from specframe import compose, hookimpl
from specframe.errors import PluginError
from specframe.plugins import plugin_registered
from specframe.schedules.packed import PackedSchedule

SEEN: list[tuple[str, int]] = []


class _CountsCalls(PackedSchedule):
    """Packed-SS that counts its calls on ``self`` and records what it found there."""

    calls = 0

    def plan(self, state):
        SEEN.append((tuple(state.prompt), self.calls))
        self.calls += 1
        return super().plan(state)


class _Plugin:
    @hookimpl
    def register_schedules(self, register):
        register("counts-calls", _CountsCalls)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model = tiny_model(SETDLM, tmp_path_factory.mktemp("per_request"), vocab=24, seed=1)
    model.eos_token_ids = ()
    return model


@pytest.fixture(autouse=True)
def _registered():
    SEEN.clear()
    with plugin_registered(_Plugin(), "per_request_test"):
        yield


def test_every_request_starts_from_the_template_schedule(model):
    decoder = compose({"model": model, "schedule": "counts-calls", "width": 3, "max_new_tokens": 8})
    first = decoder.generate(prompt_ids=[1, 2, 3])
    second = decoder.generate(prompt_ids=[1, 2, 3])
    assert [count for _, count in SEEN] == [*range(first.metrics.nfe), *range(second.metrics.nfe)]


def _two_interleaved_streams_count_their_own_calls(decoder):
    a, b = decoder.stream(prompt_ids=[4, 5]), decoder.stream(prompt_ids=[6, 7, 8])
    for _ in range(3):  # the two requests' calls alternate
        next(a), next(b)
    for stream in (a, b):
        for _ in stream:
            pass
    for prompt in ((4, 5), (6, 7, 8)):
        counts = [count for seen, count in SEEN if seen == prompt]
        assert counts == list(range(len(counts))) and len(counts) >= 3


def test_interleaved_streams_keep_their_own_state(model):
    decoder = compose({"model": model, "schedule": "counts-calls", "width": 3, "max_new_tokens": 8})
    _two_interleaved_streams_count_their_own_calls(decoder)


def test_batched_and_stepped_requests_plan_with_their_own_copies(model):
    decoder = compose({"model": model, "schedule": "counts-calls", "width": 3, "max_new_tokens": 8})
    decoder.generate_many([[4, 5], [6, 7, 8], [9]], max_batch=3)
    steppers = [decoder.stepper(prompt_ids=[1, 2]), decoder.stepper(prompt_ids=[3])]
    assert steppers[0].schedule is not steppers[1].schedule is not decoder.schedule
    while not all(s.done for s in steppers):
        for stepper in steppers:
            if (call := stepper.prepare()) is not None:
                stepper.finish(model.forward(stepper.cache, call), 0.0)
    for prompt in ((4, 5), (6, 7, 8), (9,), (1, 2), (3,)):
        counts = [count for seen, count in SEEN if seen == prompt]
        assert counts == list(range(len(counts))) and counts
    assert decoder.schedule.calls == 0  # the template itself never planned


class _NotASchedule(PackedSchedule):
    def for_request(self):
        return object()


def test_a_for_request_that_returns_no_schedule_is_named(model):
    with plugin_registered(_BadPlugin(), "bad_for_request"):
        decoder = compose({"model": model, "schedule": "bad-copy", "width": 3, "max_new_tokens": 4})
        with pytest.raises(PluginError, match="bad-copy.*for_request"):
            decoder.generate(prompt_ids=[1, 2])


class _BadPlugin:
    @hookimpl
    def register_schedules(self, register):
        register("bad-copy", _NotASchedule)


def test_under_width_auto_the_chosen_schedule_is_copied_per_request_too(model):
    """Width auto plans with the request's own copy of the plugin schedule, and costs widths on throwaway
    copies: interleaved streams each count their own calls from 0, and the template plans nothing."""
    config = {"model": model, "schedule": "counts-calls", "width": "auto", "max_new_tokens": 12}
    decoder = compose({**config, "cost": {"tau": 0.01, "delta": 0.0}})  # rows free: drafting calls
    _two_interleaved_streams_count_their_own_calls(decoder)
    assert all(count == 0 for seen, count in SEEN if seen not in ((4, 5), (6, 7, 8)))  # row counting: fresh copies
    assert decoder.schedule.schedules[0].calls == 0
