"""Run generated Python programs in a separate, resource-limited process.

Generated code is never executed in the benchmark's own process. :func:`run_program` writes the program into
a fresh temporary folder and runs it there with a new interpreter (``python -I -B``: isolated mode, no user
site, no bytecode files) in its own session, with

* a wall-clock timeout (the whole process group is killed when it expires),
* CPU-time, address-space, file-size and open-file limits set through :mod:`resource` (by a short launcher
  in the sandbox interpreter) before the program starts,
* a minimal environment (no inherited variables beyond ``PATH``; ``HOME`` and ``TMPDIR`` point at the folder),
* standard input closed and the output captured (truncated to a few kilobytes).

This contains runaway or accidentally destructive completions (infinite loops, huge allocations, stray file
writes in the working folder). It is not a security boundary against deliberately malicious code: run models
you do not trust inside a container or VM. Nothing here assumes network access, and nothing blocks it either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 1024
_OUTPUT_LIMIT = 4000


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did.

    Attributes:
        passed: Exit status 0 within the time limit.
        status: ``"passed"``, ``"failed"`` (non-zero exit) or ``"timeout"``.
        returncode: The exit status (negative: killed by that signal); ``None`` after a timeout.
        output: The tail of standard output and error, for diagnosis.
        pid: Process id of the sandbox process (never this process's id).
    """

    passed: bool
    status: str
    returncode: int | None
    output: str
    pid: int


# Runs first in the sandbox interpreter: set the limits, then execute the program as __main__.
_LAUNCHER = """
import resource, runpy, sys
def cap(kind, value):
    try:
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass  # some platforms (macOS for RLIMIT_AS) refuse a limit; the wall-clock timeout still applies
cpu_s, memory_mb = int(sys.argv[2]), int(sys.argv[3])
cap(resource.RLIMIT_CPU, cpu_s)
cap(resource.RLIMIT_AS, memory_mb * 1024 * 1024)
cap(resource.RLIMIT_FSIZE, 16 * 1024 * 1024)
cap(resource.RLIMIT_NOFILE, 64)
cap(resource.RLIMIT_CORE, 0)
program = sys.argv[1]
sys.argv = [program]
del cap, cpu_s, memory_mb, resource
runpy.run_path(program, run_name="__main__")
"""


def run_program(
    source: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB
) -> SandboxResult:
    """Execute a Python program in a separate, limited process and report whether it exited cleanly.

    Args:
        source: The complete program (solution plus tests); a failing assertion makes it exit non-zero.
        timeout_s: Wall-clock limit in seconds. The CPU-time limit is one second more (rounded up), so the
            wall clock normally fires first; a program stopped by the CPU limit (``SIGXCPU``) also counts as a
            timeout.
        memory_mb: Address-space limit in MiB.

    Returns:
        The outcome; ``passed`` is true only for exit status 0 within the time limit.
    """
    with tempfile.TemporaryDirectory(prefix="specframe-sandbox-") as folder:
        program = Path(folder) / "program.py"
        program.write_text(source, encoding="utf-8")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": folder,
            "TMPDIR": folder,
            "PYTHONHASHSEED": "0",
            "PYTHONIOENCODING": "utf-8",
        }
        posix = os.name == "posix"
        cpu_s = max(1, int(timeout_s + 0.999)) + 1
        command = [sys.executable, "-I", "-B", str(program)]
        if posix:
            command = [sys.executable, "-I", "-B", "-c", _LAUNCHER, str(program), str(cpu_s), str(memory_mb)]
        process = subprocess.Popen(
            command,
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=posix,
        )
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(process, posix)
            output, _ = process.communicate()
            return SandboxResult(False, "timeout", None, _tail(output), process.pid)
        if posix and process.returncode == -signal.SIGXCPU:
            return SandboxResult(False, "timeout", process.returncode, _tail(output), process.pid)
        passed = process.returncode == 0
        return SandboxResult(passed, "passed" if passed else "failed", process.returncode, _tail(output), process.pid)


def _kill(process: subprocess.Popen[bytes], posix: bool) -> None:
    """Kill the sandbox process and everything it started."""
    try:
        if posix:
            os.killpg(process.pid, signal.SIGKILL)
        else:  # pragma: no cover
            process.kill()
    except ProcessLookupError:
        pass


def _tail(output: bytes | None) -> str:
    text = (output or b"").decode("utf-8", errors="replace")
    return text[-_OUTPUT_LIMIT:]
