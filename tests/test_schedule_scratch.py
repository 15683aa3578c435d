"""DecodeState.scratch: where a plugin schedule keeps per-request state (one schedule serves every request)."""

from __future__ import annotations

import pytest

from decoding_helpers import SETDLM, tiny_model
from specframe import compose, hookimpl
from specframe.plugins import plugin_registered
from specframe.schedules.packed import PackedSchedule

SEEN: list[tuple[str, int]] = []


class _CountsCalls(PackedSchedule):
    """Packed-SS that counts its calls per request in the scratch and records what it found there."""

    def plan(self, state):
        count = state.scratch.get("counts-calls", 0)
        SEEN.append((tuple(state.prompt), count))
        state.scratch["counts-calls"] = count + 1
        return super().plan(state)


class _Plugin:
    @hookimpl
    def register_schedules(self, register):
        register("counts-calls", _CountsCalls)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model = tiny_model(SETDLM, tmp_path_factory.mktemp("scratch"), vocab=24, seed=1)
    model.eos_token_ids = ()
    return model


@pytest.fixture(autouse=True)
def _registered():
    SEEN.clear()
    with plugin_registered(_Plugin(), "scratch_test"):
        yield


def test_every_request_starts_with_an_empty_scratch(model):
    decoder = compose({"model": model, "schedule": "counts-calls", "width": 3, "max_new_tokens": 8})
    first = decoder.generate(prompt_ids=[1, 2, 3])
    second = decoder.generate(prompt_ids=[1, 2, 3])
    assert [count for _, count in SEEN] == [*range(first.metrics.nfe), *range(second.metrics.nfe)]


def test_interleaved_streams_keep_their_own_scratch(model):
    decoder = compose({"model": model, "schedule": "counts-calls", "width": 3, "max_new_tokens": 8})
    a, b = decoder.stream(prompt_ids=[4, 5]), decoder.stream(prompt_ids=[6, 7, 8])
    for _ in range(3):  # the two requests' calls alternate on one schedule object
        next(a), next(b)
    for stream in (a, b):
        for _ in stream:
            pass
    for prompt in ((4, 5), (6, 7, 8)):
        counts = [count for seen, count in SEEN if seen == prompt]
        assert counts == list(range(len(counts))) and len(counts) >= 3
