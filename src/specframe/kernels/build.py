"""Building specframe's C++ kernels on first use, and saying plainly why they are absent.

The kernels are one C++ file (``csrc/kernels.cpp`` with its SIMD variants in ``csrc/simd.inc``), compiled by
``torch.utils.cpp_extension.load`` the first time a process needs them and cached under
``$SPECFRAME_KERNELS_DIR/<digest>`` (default ``~/.cache/specframe/kernels``, or under ``$XDG_CACHE_HOME``; the
digest covers the sources, torch's version, Python and the compiler), so later processes load the built
library in milliseconds. The folder is not ``$SPECFRAME_CACHE_DIR``: what is built there depends on nothing
else a cache folder holds, and a build takes a minute, so processes that move their cache keep sharing it.

This is torch's own extension route: it needs a C++ compiler and ``ninja`` (a PyPI package, installed with
specframe), and nothing at install time, so ``pip install`` stays pure Python. Where the build cannot happen
(no compiler, a failed build, not x86-64 Linux), :func:`load` returns ``None``, prints one line saying what is
missing and what to install, and :func:`unavailable_reason` keeps that line; models then run torch's kernels,
which are not row-invariant. ``SPECFRAME_KERNELS=0`` chooses torch's kernels without building anything
(read when a model is loaded).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

SWITCH = "SPECFRAME_KERNELS"
"""The environment variable that turns specframe's own kernels off (``0``) for models loaded afterwards."""

SOURCES = Path(__file__).with_name("csrc")
_FILES = ("kernels.cpp", "simd.inc")
_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c++17"]
_OPENMP = "-fopenmp"
_NO_OPENMP = "openmp-failed.txt"  # in the OpenMP build's folder: why it failed, so the retry is not repeated
# -ffp-contract=off: no a*b+c is fused unless the code says so, so that every tile of a kernel rounds alike.
# -fopenmp: at::parallel_for is a header template whose OpenMP build is a `#pragma omp parallel`; compiled
# without it the pragma is dropped and every "parallel" loop runs on the calling thread alone. The library
# links libgomp.so.1, which resolves to the copy torch has already loaded (one OpenMP runtime, one pool).
# A compiler without OpenMP (clang without libomp) gets a second build without it: the same code and the
# same bits (each output is reduced by one thread in a fixed order whichever thread it is), on one thread.

_reason: str | None = None
_one_thread: str | None = None


def compiler() -> str | None:
    """The C++ compiler torch's extension builder would call (``$CXX`` or ``c++``), if it is on the PATH."""
    return shutil.which(os.environ.get("CXX", "c++"))


def _flags(openmp: bool) -> list[str]:
    return [*_FLAGS, _OPENMP] if openmp else list(_FLAGS)


def _digest(cxx: str, openmp: bool = True) -> str:
    text = hashlib.sha256()
    for name in _FILES:
        text.update((SOURCES / name).read_bytes())
    text.update(" ".join([torch.__version__, sys.version, cxx, *_flags(openmp)]).encode())
    return text.hexdigest()[:16]


def _build(cxx: str, openmp: bool) -> ModuleType:
    """Compile (or load the cached) library with or without OpenMP; raises what the build raised."""
    from torch.utils import cpp_extension

    digest = _digest(cxx, openmp)
    folder = build_root() / digest
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / f"specframe_kernels_{digest}.so").exists():
        print(f"specframe: building its CPU kernels once ({cxx}, about a minute) in {folder}", file=sys.stderr)
    return cpp_extension.load(
        name=f"specframe_kernels_{digest}",
        sources=[str(SOURCES / "kernels.cpp")],
        extra_cflags=_flags(openmp),
        extra_ldflags=[_OPENMP] if openmp else [],
        extra_include_paths=[str(SOURCES)],
        build_directory=str(folder),
        verbose=False,
    )


def _last_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[-1] if text else type(error).__name__


@functools.cache
def load() -> ModuleType | None:
    """The built kernels' Python module (their operators registered), or ``None`` where they cannot be had.

    Builds them on first use (about a minute on 2 cores) and caches the library; the reason for ``None`` is
    :func:`unavailable_reason`.
    """
    global _reason, _one_thread
    _reason = _missing()
    if _reason is not None:
        _fall_back()
        return None
    cxx = str(compiler())
    marker = build_root() / _digest(cxx) / _NO_OPENMP
    first = marker.read_text().strip() if marker.exists() else None
    if first is None:
        try:
            return _build(cxx, openmp=True)
        except Exception as error:  # a compiler without OpenMP, a compiler error, a full disk, ...
            first = _last_line(error)
    try:
        module = _build(cxx, openmp=False)
    except Exception as error:  # the fallback still runs the model
        _reason = (
            f"building them failed ({_last_line(error)}); see {marker.parent}, and report it with your "
            "compiler's version"
        )
        _fall_back()
        return None
    if not marker.exists():
        marker.write_text(first + "\n")  # later processes go straight to this build
    _one_thread = (
        f"built without OpenMP, so they run on one thread ({cxx} failed with {_OPENMP}: {first}); install "
        f"OpenMP for it (libomp-dev for clang) or set CXX to g++, then delete {marker}"
    )
    print(f"specframe: its CPU kernels were {_one_thread}", file=sys.stderr)
    return module


def build_id() -> str | None:
    """The digest naming the kernels' build (sources, flags, torch, Python, compiler), or ``None`` without them.

    Timings taken with one build say little about another (cost tables of width ``auto`` are keyed by it).
    """
    if load() is None:
        return None
    return _digest(str(compiler()), openmp=_one_thread is None)


def build_root() -> Path:
    """Where built kernels are kept: ``$SPECFRAME_KERNELS_DIR``, else ``<XDG cache or ~/.cache>/specframe/kernels``."""
    explicit = os.environ.get("SPECFRAME_KERNELS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specframe" / "kernels"


def _missing() -> str | None:
    """What this machine lacks for the kernels (with what to install), or ``None``."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"they are built for x86-64 Linux, not {sys.platform} on {platform.machine()}"
    if compiler() is None:
        return "no C++ compiler was found: install g++ ('apt-get install g++') or set CXX to one"
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return "ninja is missing: 'pip install ninja' (specframe's own install brings it)"
    return None


def _fall_back() -> None:
    print(
        f"specframe: its CPU kernels are unavailable ({_reason}); running torch's kernels, which round calls "
        f"of different sizes differently, so outputs are not guaranteed equal to AR's ({SWITCH}=0 hides this)",
        file=sys.stderr,
    )


def one_thread_reason() -> str | None:
    """Why the loaded kernels run on one thread (built without OpenMP, with what to do), else ``None``."""
    load()
    return _one_thread


def unavailable_reason() -> str | None:
    """Why :func:`load` returned ``None`` (one line naming what is missing and what to do), else ``None``."""
    load()
    return _reason
