"""How many CPU threads torch uses for a model: an explicit choice, ``OMP_NUM_THREADS``, or a policy.

A thread that waits for a core held by another process stalls every operation it takes part in, and a
call of a tiny model is a chain of small operations, each too small to repay a synchronisation. On a machine
shared with other work, torch's default of one thread per core can make a small model's decoding many times
slower than one thread does (past measurements: ``docs/performance.md#threads`` and
``#host-side-choices``). The policy therefore is:

1. ``threads`` given (``--threads N``, config ``threads: N``): use exactly N;
2. else ``OMP_NUM_THREADS`` set: leave torch's thread count alone (torch has already read it);
3. else: one thread per :data:`PARAMETERS_PER_THREAD` parameters (at least one), but no more than the
   cores that are free -- the machine's cores minus those other processes keep busy now (:func:`busy_cores`)
   -- so that a neighbour's busy core is not also given to a spinning torch thread.

The bundled 4M-parameter models therefore run on two threads where two cores are free, as does
``smollm2-135m`` (and larger models on more, where the machine has them). Until specframe's kernels ran their
layers as one team of threads (``specframe_kernels::decode_layers``) the rule was one thread per 64M
parameters and the bundled models ran on one: their calls now take half the time on two threads.

A model's size is its backend's ``num_parameters`` (part of the
:class:`~specframe.models.base.ModelBackend` interface); a backend that leaves it unset is measured from its
``torch.nn.Module`` parameters (the backend itself, or the modules it holds as attributes), and one with no
modules at all is taken as a small model (:data:`UNKNOWN_PARAMETERS`, one thread) with a one-time warning.
"""

from __future__ import annotations

import os
import time
import warnings

import torch

from specframe.errors import ConfigError
from specframe.specs import as_integer

PARAMETERS_PER_THREAD = 2_000_000
"""Parameters one thread is given before a second one pays for its synchronisation. Measured on 2 cores: the
bundled 4.2M-parameter Nemotron's 1-row call over 128 cached rows took 0.17 ms on two threads against 0.34 on
one (its decoding 1.11x faster with ``ar``, 1.21x with Packed-SS W=4); machines with many cores are not
measured yet."""

UNKNOWN_PARAMETERS = 0
"""The size assumed for a backend whose parameters cannot be counted: a small model, so one thread."""

_WARNED: set[type] = set()


def machine_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: How long :func:`busy_cores` watches the machine, and how long its answer is reused, in seconds.
BUSY_WINDOW_S = 0.1
BUSY_REUSE_S = 30.0
_busy_sample: tuple[float, int] | None = None  # (when, cores) of the last sample


def busy_cores() -> int:
    """Cores other processes keep busy now (0 where the OS does not say).

    Read from ``/proc/stat`` over :data:`BUSY_WINDOW_S`, less this process's own CPU time, and reused for
    :data:`BUSY_REUSE_S`; elsewhere, the one-minute load average. The load average lags: right after a
    command ends (a ``pip install``, the previous decode of a script) it still counts that command's cores as
    busy for a minute, and a model got one thread on an idle machine.
    """
    global _busy_sample
    now = time.monotonic()
    if _busy_sample is not None and now - _busy_sample[0] < BUSY_REUSE_S:
        return _busy_sample[1]
    cores = _busy_now(BUSY_WINDOW_S)
    if cores is None:
        try:
            cores = int(os.getloadavg()[0] + 0.5)
        except (AttributeError, OSError):
            cores = 0
    _busy_sample = (now, cores)
    return cores


def _busy_now(window: float) -> int | None:
    """Cores busy with other processes over the next ``window`` seconds, from ``/proc/stat``; None if unreadable."""
    try:
        first, own = _cpu_ticks(), time.process_time()
        time.sleep(window)
        second, own = _cpu_ticks(), time.process_time() - own
    except (OSError, ValueError, IndexError):
        return None
    (busy0, total0, cpus), (busy1, total1, _) = first, second
    if total1 <= total0 or cpus < 1:
        return None
    others = (busy1 - busy0) / (total1 - total0) * cpus - own / window
    return max(0, int(others + 0.5))


def _cpu_ticks() -> tuple[int, int, int]:
    """(busy ticks, all ticks, CPUs) of the whole machine from ``/proc/stat``."""
    with open("/proc/stat", encoding="ascii") as handle:
        lines = handle.read().splitlines()
    fields = [int(value) for value in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    idle = fields[3] + fields[4]
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return sum(fields) - idle, sum(fields), cpus


def default_threads(parameters: int, *, cores: int | None = None, busy: int | None = None) -> int:
    """The thread count the policy picks for a model with ``parameters`` parameters (see the module docstring).

    Args:
        parameters: The model's parameter count.
        cores: Usable cores (default: :func:`machine_cores`).
        busy: Cores busy with other work (default: :func:`busy_cores`).
    """
    cores = machine_cores() if cores is None else cores
    busy = busy_cores() if busy is None else busy
    wanted = max(1, parameters // PARAMETERS_PER_THREAD)
    free = max(1, cores - busy)
    return max(1, min(wanted, free, cores))


def check_threads(threads: object, option: str = "threads") -> int:
    """An explicit thread count, checked: an integer from 1 to the cores this process may run on.

    More threads than cores only make torch's threads wait for each other, and far more (thousands) make
    OpenMP fail to create them, which ends the process.

    Raises:
        ConfigError: Naming ``option``, the value and the allowed range.
    """
    number = as_integer(threads)
    if number is None or number < 1:
        raise ConfigError(f"{option} must be a positive integer, got {threads!r}")
    threads = number  # a NumPy integer is taken as the int it is
    cores = machine_cores()
    if threads > cores:
        raise ConfigError(
            f"{option} {threads} is more than the {cores} CPU core(s) this process may use; give at most {cores} "
            "(more threads than cores only slow torch down)"
        )
    return threads


def choose_threads(threads: int | None, parameters: int) -> int | None:
    """Resolve the thread count for a model: ``threads``, else ``None`` under ``OMP_NUM_THREADS``, else the policy.

    Raises:
        ConfigError: If ``threads`` is not an integer from 1 to the machine's cores (:func:`check_threads`).
    """
    if threads is not None:
        return check_threads(threads)
    if os.environ.get("OMP_NUM_THREADS"):
        check_omp_threads(os.environ["OMP_NUM_THREADS"])
        return None
    return default_threads(parameters)


def check_omp_threads(value: str) -> int:
    """The thread count ``OMP_NUM_THREADS`` asks for, checked.

    A positive integer, or a comma-separated list of them (OpenMP's nested form, whose first entry is what
    torch uses). OpenMP ignores anything else with a one-line warning and starts one thread per core, which
    is exactly what the thread policy exists to avoid; so a malformed value is an error, not a silent default.

    Raises:
        ConfigError: Naming the value and what to set instead.
    """
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise ConfigError(
            f"OMP_NUM_THREADS={value!r} is not a positive thread count, and OpenMP would ignore it and use every "
            "core; set it to a number such as 1, or unset it to let specframe choose (or pass --threads / threads)"
        )
    return int(first)


def model_parameters(model: object) -> int:
    """The parameter count the thread policy sizes ``model`` by.

    ``model.num_parameters`` when the backend sets it (a positive integer); else the parameters of the
    backend if it is a ``torch.nn.Module``, or of the modules it holds as attributes (each tensor counted
    once); else :data:`UNKNOWN_PARAMETERS`, with a :class:`UserWarning` once per backend class that says how
    to set it.
    """
    declared = getattr(model, "num_parameters", None)
    if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0:
        return declared
    modules = [model] if isinstance(model, torch.nn.Module) else []
    modules += [v for v in getattr(model, "__dict__", {}).values() if isinstance(v, torch.nn.Module)]
    seen: dict[int, int] = {}
    for module in modules:
        for parameter in module.parameters():
            seen[id(parameter)] = parameter.numel()
    if seen:
        return sum(seen.values())
    if type(model) not in _WARNED:
        _WARNED.add(type(model))
        warnings.warn(
            f"model backend {type(model).__name__} sets no num_parameters and holds no torch.nn.Module, so the "
            "thread policy takes it for a small model and runs it on one thread; set num_parameters on the "
            "backend (or pass threads / --threads) to size it",
            stacklevel=3,
        )
    return UNKNOWN_PARAMETERS


def apply_threads(model: object, threads: int | None) -> int:
    """Set torch's intra-op thread count for ``model`` per :func:`choose_threads`; returns the count in effect.

    The policy's choice is made once per model (stored as ``model.threads``), so composing more decoders on
    a model later -- when this process's own work has raised the load average -- does not lower it. The
    model's size is :func:`model_parameters`. torch's thread count is process-wide: the last decoder
    composed decides it.

    Raises:
        ConfigError: If ``threads`` is not an integer from 1 to the machine's cores.
    """
    if threads is None:
        threads = getattr(model, "threads", None)  # the policy's earlier choice for this model
    sized = threads is None and not os.environ.get("OMP_NUM_THREADS")
    chosen = choose_threads(threads, model_parameters(model) if sized else 0)
    if chosen is not None:
        if chosen != torch.get_num_threads():
            torch.set_num_threads(chosen)
        try:
            model.threads = chosen  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return torch.get_num_threads()
