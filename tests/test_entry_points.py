"""Third-party plugins: an installed distribution is discovered through the ``specframe`` entry-point group.

The example distribution in ``plugins/specframe-ablation-orders`` is installed into a private folder (not
into the test environment) and specframe is run in a subprocess that can see it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specframe.plugin_testing import install_distribution, run_with

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "plugins" / "specframe-ablation-orders"
ENTRY = {
    "kind": "order_policy",
    "name": "lowest-confidence",
    "plugin": "ablation_orders",
    "distribution": "specframe-ablation-orders",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return install_distribution(EXAMPLE, tmp_path_factory.mktemp("site"))


def test_specframe_plugins_lists_the_installed_plugin(site):
    result = run_with(site, ["-m", "specframe.cli", "plugins"])
    assert result.returncode == 0, result.stderr
    entries = json.loads(result.stdout)
    assert ENTRY in entries
    assert {
        "kind": "schedule",
        "name": "packed",
        "plugin": "specframe.schedules.packed",
        "distribution": "specframe",
    } in entries


def test_the_plugin_is_usable_by_name(site):
    code = (
        "from specframe.plugins import get_registry\n"
        "order = get_registry().get('order_policy', 'lowest-confidence').factory()\n"
        "print(order.order([5, 6, 7], {5: 0.9, 6: 0.1}))\n"
    )
    result = run_with(site, ["-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[6, 5, 7]"


def test_load_selection_env_includes_or_excludes_entry_points(site):
    none = json.loads(run_with(site, ["-m", "specframe.cli", "plugins"], load="").stdout)
    assert ENTRY not in none and any(e["name"] == "packed" for e in none)  # built-ins always load
    chosen = json.loads(run_with(site, ["-m", "specframe.cli", "plugins"], load="specframe-ablation-orders").stdout)
    assert ENTRY in chosen
