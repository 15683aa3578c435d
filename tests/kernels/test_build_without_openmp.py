"""A compiler without OpenMP still gets specframe's kernels: built again without it, on one thread, same bits.

The compiler here is a wrapper that refuses ``-fopenmp`` (as clang does without libomp) and otherwise runs the
machine's own; each build runs in a fresh process (one library of the operators per process).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specframe import kernels

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not kernels.available(), reason=f"no kernels: {kernels.unavailable_reason()}"),
]

_PROBE = r"""
import json, sys, torch
from specframe import kernels
from specframe.kernels.quant import quantize
assert kernels.available(), kernels.unavailable_reason()
torch.manual_seed(0)
x = torch.randn(5, 256)
dense = torch.randn(40, 256)
blocks = quantize(dense, "q4_1")  # GGUF's layout, which every variant runs
out = {
    "reason": kernels.one_thread_reason(),
    "build": kernels.build_id(),
    "dense": torch.ops.specframe_kernels.linear(x, dense, 0, 40).tolist(),
    "q4_1": torch.ops.specframe_kernels.linear(x, blocks, 4, 40).tolist(),
}
json.dump(out, open(sys.argv[1], "w"))
"""


def _wrapper(tmp_path: Path) -> tuple[Path, Path]:
    real = shutil.which(os.environ.get("CXX", "c++"))
    assert real is not None
    log = tmp_path / "calls.log"
    script = tmp_path / "cxx-without-openmp"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{log}"\n'
        'for a in "$@"; do\n'
        '  if [ "$a" = "-fopenmp" ]; then echo "error: unsupported option \'-fopenmp\'" >&2; exit 1; fi\n'
        "done\n"
        f'exec "{real}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, log


def _probe(tmp_path: Path, cxx: Path, name: str) -> tuple[dict, str]:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "CXX": str(cxx), "SPECFRAME_KERNELS_DIR": str(tmp_path / "kernels")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text()), done.stderr


def test_a_compiler_without_openmp_builds_one_thread_kernels_with_the_same_bits(tmp_path):
    from specframe.kernels.quant import quantize

    cxx, log = _wrapper(tmp_path)
    first, stderr = _probe(tmp_path, cxx, "first")
    assert "-fopenmp" in log.read_text()  # it tried OpenMP first
    assert first["reason"] is not None and "without OpenMP" in first["reason"] and "-fopenmp" in first["reason"]
    assert "one thread" in stderr and "libomp" in stderr  # the user is told, with what to do
    assert first["build"] != kernels.build_id()  # its own build, so cost tables are not shared with this one

    torch.manual_seed(0)
    x = torch.randn(5, 256)
    dense = torch.randn(40, 256)
    blocks = quantize(dense, "q4_1")
    assert first["dense"] == torch.ops.specframe_kernels.linear(x, dense, 0, 40).tolist()
    assert first["q4_1"] == torch.ops.specframe_kernels.linear(x, blocks, 4, 40).tolist()

    log.write_text("")
    second, stderr = _probe(tmp_path, cxx, "second")
    assert "-fopenmp" not in log.read_text()  # the failure is remembered: no second failing build
    assert second["reason"] == first["reason"] and second["dense"] == first["dense"]
