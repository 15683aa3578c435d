"""Testing a plugin distribution the way users get it: installed, and found through its entry point.

:func:`install_distribution` pip-installs a distribution (without dependencies) into a private folder, not
into the running environment; :func:`run_with` runs Python in a subprocess that sees that folder, so the
subprocess's specframe discovers the plugin exactly as after ``pip install``::

    site = install_distribution("plugins/specframe-ablation-orders", tmp_path / "site")
    result = run_with(site, ["-m", "specframe.cli", "plugins"])
    assert "lowest-confidence" in result.stdout

:func:`torch_threads` runs a block (a test session) with a given number of torch threads. Random model
checkpoints for tests come from :mod:`specframe.models.testing`, and the exact plain-AR distribution that a
sampling test compares outputs with from :mod:`specframe.ar_reference`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from specframe.plugins import LOAD_ENV


def install_distribution(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Install the distribution at ``source`` (a project folder) into ``target``, without its dependencies.

    Raises:
        subprocess.CalledProcessError: If pip fails (its output is on the exception).
    """
    target = Path(target)
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*command, "--target", str(target), os.fspath(source)], check=True, capture_output=True)
    return target


def run_with(
    site: str | os.PathLike[str], args: Sequence[str], *, load: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` with ``site`` on the import path and the output captured as text.

    Args:
        site: A folder from :func:`install_distribution`.
        args: The interpreter's arguments (``["-m", "specframe.cli", "plugins"]``, ``["-c", code]``).
        load: The ``SPECFRAME_LOAD_PLUGINS`` selection; ``None`` leaves it unset (every entry point loads).
        timeout: Seconds before the subprocess is stopped.
    """
    env = {k: v for k, v in os.environ.items() if k != LOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join([os.fspath(site), env.get("PYTHONPATH", "")])
    if load is not None:
        env[LOAD_ENV] = load
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch threads, then restore the setting.

    Tiny test models run fastest on one thread; several threads on a busy machine are many times slower.
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
