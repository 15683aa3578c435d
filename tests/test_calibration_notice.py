"""A calibration announces itself with one line on stderr; a cached cost model is used silently."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specframe.auto import costs
from specframe.auto.costs import CostModel, cost_model_for


@pytest.fixture
def fake_calibration(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path))
    calls = []

    def calibrate(model, host_s=None):
        calls.append(model)
        return CostModel.from_mapping({"tau": 0.001, "delta": 0.0001})

    monkeypatch.setattr(costs, "calibrate", calibrate)
    monkeypatch.setattr(costs, "model_key", lambda model: {"model": model.name})
    monkeypatch.setattr(costs, "save", lambda cost: None)
    return calls


MODEL = SimpleNamespace(name="tiny-model")


def test_a_calibration_says_what_why_how_long_and_where_it_is_cached(fake_calibration, capsys, tmp_path):
    cost_model_for(MODEL)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fake_calibration == [MODEL]
    for words in ("measuring what a model call of 'tiny-model' costs", "not measured on this machine yet",
                  'width/schedule "auto"', "a few seconds, once", f"cached in {tmp_path / 'costs'}",
                  "`specframe calibrate`"):  # fmt: skip
        assert words in err, err
    cost_model_for(MODEL, refresh=True)
    assert "asked to measure again" in capsys.readouterr().err


def test_a_cached_cost_model_is_used_silently_and_announce_false_is_quiet(fake_calibration, capsys, monkeypatch):
    cached = CostModel.from_mapping({"tau": 0.002, "delta": 0.0001})
    monkeypatch.setattr(costs, "load_cached", lambda key: cached)
    monkeypatch.setattr(costs, "shape_drift", lambda model, cost: 1.0)
    monkeypatch.setattr(costs, "_CHECKED", set())
    assert cost_model_for(MODEL) is cached
    assert capsys.readouterr().err == "" and not fake_calibration
    cost_model_for(MODEL, refresh=True, announce=False)
    assert capsys.readouterr().err == "" and fake_calibration == [MODEL]


def test_generate_calibrates_before_the_request_so_its_seconds_are_not_the_requests(monkeypatch, tmp_path, capsys):
    """A first calibration's time is not charged to the request's wall or non-model time (a fake clock)."""
    import time

    from specframe.auto import setup
    from specframe.cli import main

    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path))
    real, skipped = time.perf_counter, []
    monkeypatch.setattr(time, "perf_counter", lambda: real() + sum(skipped))

    def calibrating(model):
        skipped.append(1000.0)  # what a calibration costs, on the clock the decoder reads
        return CostModel.from_mapping({"tau": 0.001, "delta": 0.0001})

    monkeypatch.setattr(setup, "cost_model_for", calibrating)
    args = ["generate", "--model", "setdlm-stdlib-tiny", "--max-new-tokens", "4", "--json", "def f("]
    assert main(args) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert skipped == [1000.0] and metrics["wall_s"] < 100, metrics["wall_s"]
