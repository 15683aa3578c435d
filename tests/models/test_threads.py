"""The thread policy: explicit choice, then OMP_NUM_THREADS, then model size against the free cores."""

from __future__ import annotations

import warnings

import pytest
import torch

from specframe import compose
from specframe.errors import ConfigError
from specframe.models.threads import (
    PARAMETERS_PER_THREAD,
    apply_threads,
    choose_threads,
    default_threads,
    model_parameters,
)


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_small_models_get_one_thread_and_large_ones_the_free_cores():
    assert default_threads(PARAMETERS_PER_THREAD - 1, cores=16, busy=0) == 1
    assert default_threads(4_200_000, cores=16, busy=0) == 2  # the bundled models: two threads pay since the team
    assert default_threads(2 * PARAMETERS_PER_THREAD, cores=2, busy=0) == 2
    assert default_threads(2 * PARAMETERS_PER_THREAD, cores=2, busy=1) == 1  # a busy neighbour keeps its core
    assert default_threads(100 * PARAMETERS_PER_THREAD, cores=8, busy=3) == 5
    assert default_threads(100 * PARAMETERS_PER_THREAD, cores=2, busy=9) == 1


def test_explicit_threads_win_and_omp_num_threads_is_respected(monkeypatch):
    monkeypatch.setattr("specframe.models.threads.machine_cores", lambda: 4)
    assert choose_threads(3, 10) == 3
    with pytest.raises(ConfigError, match="threads 5 is more than the 4 CPU core"):
        choose_threads(5, 10)  # thousands of threads would make OpenMP end the process
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads(None, 10**10) is None
    assert choose_threads(1, 10**10) == 1
    with pytest.raises(ConfigError, match="positive integer"):
        choose_threads(0, 10)


@pytest.mark.parametrize("value", ["0", "abc", "-2", " ", "1.5", ",2"])
def test_a_malformed_omp_num_threads_is_refused_not_left_to_openmp(monkeypatch, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with pytest.raises(ConfigError, match=f"OMP_NUM_THREADS={value!r} is not a positive thread count"):
        choose_threads(None, 10)
    assert choose_threads(1, 10) == 1  # an explicit count does not read it


@pytest.mark.parametrize("value", ["1", "2", "3,1"])
def test_well_formed_omp_num_threads_is_left_to_torch(monkeypatch, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert choose_threads(None, 10) is None


def test_the_policy_decides_once_per_model():
    class Backend:
        num_parameters = PARAMETERS_PER_THREAD - 1  # one thread on any machine
        threads = None

    backend = Backend()
    torch.set_num_threads(2)
    assert apply_threads(backend, None) == 1
    assert backend.threads == 1
    torch.set_num_threads(2)
    assert apply_threads(backend, None) == 1  # remembered, not re-derived from the load average
    assert apply_threads(backend, 2) == 2


def test_compose_sets_threads_and_rejects_bad_values(tmp_path, monkeypatch):
    from decoding_helpers import tiny_model

    monkeypatch.setattr("specframe.models.threads.machine_cores", lambda: 2)  # also on a one-core machine

    model = tiny_model("setdlm", tmp_path / "m", vocab=24, seed=1)
    compose({"model": model, "schedule": "ar", "threads": 2})
    assert torch.get_num_threads() == 2
    with pytest.raises(ConfigError, match="threads"):
        compose({"model": model, "schedule": "ar", "threads": 0})


def test_num_parameters_is_part_of_the_backend_interface():
    from specframe.models.base import ModelBackend

    assert ModelBackend.num_parameters is None  # documented; None means "count it"
    assert "num_parameters" in ModelBackend.__doc__


def test_a_backend_without_num_parameters_is_sized_by_the_modules_it_holds(monkeypatch):
    from specframe.models.base import ModelBackend

    monkeypatch.setattr("specframe.models.threads.PARAMETERS_PER_THREAD", 100)
    monkeypatch.setattr("specframe.models.threads.machine_cores", lambda: 4)
    monkeypatch.setattr("specframe.models.threads.busy_cores", lambda: 0)

    class Held(ModelBackend):
        def __init__(self):
            self.network = torch.nn.Linear(20, 10)  # 210 parameters
            self.head = self.network  # shared: counted once

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(30, 10)  # 310 parameters

    assert model_parameters(Held()) == 210
    assert model_parameters(Module()) == 310
    torch.set_num_threads(1)
    assert apply_threads(Held(), None) == 2  # 210 // 100, not torch's count left alone


def test_a_backend_with_nothing_to_count_runs_on_one_thread_and_is_told_once(monkeypatch):
    from specframe.models.base import ModelBackend

    monkeypatch.setattr("specframe.models.threads.machine_cores", lambda: 2)
    monkeypatch.setattr("specframe.models.threads.busy_cores", lambda: 0)

    class Remote(ModelBackend):
        pass

    torch.set_num_threads(2)
    with pytest.warns(UserWarning, match="Remote sets no num_parameters"):
        assert apply_threads(Remote(), None) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model_parameters(Remote()) == 0  # once per backend class
        declared = Remote()
        declared.num_parameters = 10**9
        assert model_parameters(declared) == 10**9


def test_busy_cores_reads_what_other_processes_use_now_not_the_load_average(monkeypatch):
    """The load average lags a minute: right after `pip install` ended it still said one core of two was busy,
    and an idle machine ran a 135M model on one thread (half speed). /proc/stat over a short window says what
    other processes use now; this process's own CPU time in the window is not a neighbour's."""
    from specframe.models import threads

    readings = iter([(1000, 4000, 2), (1150, 4200, 2)])  # 150 of 200 ticks busy on 2 CPUs: 1.5 cores
    monkeypatch.setattr(threads, "_cpu_ticks", lambda: next(readings))
    clock = iter([10.0, 10.05])  # this process used 0.05 s of CPU in the 0.1 s window: half a core
    monkeypatch.setattr(threads.time, "process_time", lambda: next(clock))
    monkeypatch.setattr(threads.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    monkeypatch.setattr(threads, "_busy_sample", None)
    assert threads.busy_cores() == 1  # 1.5 - 0.5, not the load average's 5
    assert threads.busy_cores() == 1  # reused: /proc/stat is not read again (the readings are used up)


def test_busy_cores_falls_back_to_the_load_average_without_proc_stat(monkeypatch):
    from specframe.models import threads

    def unreadable():
        raise OSError("no /proc here")

    monkeypatch.setattr(threads, "_cpu_ticks", unreadable)
    monkeypatch.setattr(threads.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.4, 0.0, 0.0))
    monkeypatch.setattr(threads, "_busy_sample", None)
    assert threads.busy_cores() == 1
