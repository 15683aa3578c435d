"""specframe.testing.plugins.registered_fixture: a plugin registered for a session, seen by module-scoped fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import specframe

PLUGIN = """
from specframe import hookimpl
from specframe.orders.ltr import LeftToRight


class Plugin:
    @hookimpl
    def register_order_policies(self, register):
        register("my-order", LeftToRight)


plugin = Plugin()
"""

TESTS = """
import pytest

from specframe.plugins import get_registry


@pytest.fixture(scope="module")
def order():  # like a module-scoped model fixture of a backend plugin
    return get_registry().get("order_policy", "my-order").factory()


def test_one(order):
    assert order.left_to_right


def test_two(order):
    assert get_registry().get("order_policy", "my-order")
"""

CONFTESTS = {
    "function-scoped": """
import pytest
from my_plugin import plugin
from specframe.plugins import plugin_registered


@pytest.fixture(autouse=True)
def registered():
    with plugin_registered(plugin, "my_plugin"):
        yield
""",
    "registered_fixture": """
from my_plugin import plugin
from specframe.testing.plugins import registered_fixture

my_plugin_registered = registered_fixture(plugin, "my_plugin")
""",
    "module-scoped": """
from my_plugin import plugin
from specframe.testing.plugins import registered_fixture

registered = registered_fixture(plugin, "my_plugin", scope="module", fixture_name="registered")
""",
}


def run_suite(folder: Path, conftest: str) -> subprocess.CompletedProcess[str]:
    folder.mkdir()
    (folder / "my_plugin.py").write_text(textwrap.dedent(PLUGIN), encoding="utf-8")
    (folder / "conftest.py").write_text(textwrap.dedent(conftest), encoding="utf-8")
    (folder / "test_suite.py").write_text(textwrap.dedent(TESTS), encoding="utf-8")
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    source = str(Path(specframe.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), source]), "SPECFRAME_LOAD_PLUGINS": ""}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("variant", ["registered_fixture", "module-scoped"])
def test_module_scoped_fixtures_see_a_plugin_registered_by_the_fixture(tmp_path, variant):
    result = run_suite(tmp_path / "suite", CONFTESTS[variant])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_a_function_scoped_registration_comes_too_late_for_them(tmp_path):
    # Why the fixture exists: pytest sets up module-scoped fixtures before function-scoped ones.
    result = run_suite(tmp_path / "suite", CONFTESTS["function-scoped"])
    assert result.returncode != 0
    assert "unknown order policy 'my-order'" in result.stdout
