"""Testing a plugin distribution the way users get it: installed, and found through its entry point.

:func:`install_distribution` pip-installs a distribution (without dependencies) into a private folder, not
into the running environment; :func:`run_with` runs Python in a subprocess that sees that folder, so the
subprocess's specframe discovers the plugin exactly as after ``pip install``::

    site = install_distribution("plugins/specframe-ablation-orders", tmp_path / "site")
    result = run_with(site, ["-m", "specframe.cli", "plugins"])
    assert "lowest-confidence" in result.stdout

:func:`registered_fixture` makes a pytest fixture that keeps a plugin registered for a whole test session
(or module), so that module- and session-scoped fixtures (a loaded model of a backend plugin) can use it too;
:func:`torch_threads` runs a block (a test session) with a given number of torch threads. Random model
checkpoints for tests come from :mod:`specframe.testing.models`, and the exact plain-AR distribution that a
sampling test compares outputs with from :mod:`specframe.testing.reference`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from specframe.plugins import LOAD_ENV, plugin_registered


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


def registered_fixture(
    plugin: object, name: str, *, scope: str = "session", autouse: bool = True, fixture_name: str | None = None
) -> Callable[..., Any]:
    """A pytest fixture that keeps ``plugin`` registered for ``scope`` (default: the whole session).

    A function-scoped fixture around :func:`~specframe.plugins.plugin_registered` registers the plugin only
    after pytest has set up the module- and session-scoped fixtures (higher scopes come first), so a
    module-scoped fixture that loads a model of a backend plugin, or composes a decoder with a plugin
    schedule, would not find it. Assign the result to a name in ``conftest.py``::

        import my_plugin
        from specframe.testing.plugins import registered_fixture

        my_plugin_registered = registered_fixture(my_plugin, "my_plugin")

    As with :func:`~specframe.plugins.plugin_registered`, a plugin whose entry point is already loaded is
    left as it is.

    Args:
        plugin: The plugin object (module or instance).
        name: The name to register it under (its entry-point name).
        scope: ``"session"``, ``"package"``, ``"module"``, ``"class"`` or ``"function"``.
        autouse: Whether every test in the fixture's reach uses it without asking.
        fixture_name: The fixture's name (default: ``<name>_registered``, with ``-`` and ``.`` made ``_``).

    Raises:
        ImportError: Without pytest.
    """
    import pytest

    fixture_name = fixture_name or name.replace("-", "_").replace(".", "_") + "_registered"

    def registered() -> Iterator[None]:
        with plugin_registered(plugin, name):
            yield

    registered.__name__ = fixture_name
    registered.__doc__ = f"The plugin {name!r}, registered for the {scope} (specframe.testing.plugins)."
    return pytest.fixture(scope=scope, autouse=autouse, name=fixture_name)(registered)
