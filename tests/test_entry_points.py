"""Third-party plugins: an installed distribution is discovered through the ``specframe`` entry-point group.

The example distribution in ``plugins/specframe-ablation-orders`` is installed into a private folder (not
into the test environment) and specframe is run in a subprocess that can see it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specframe.testing.plugins import install_distribution, run_with

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "plugins" / "specframe-ablation-orders"
TRAINING = ROOT / "plugins" / "specframe-training"
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
    entries = _identities(json.loads(result.stdout))
    assert ENTRY in entries
    assert {
        "kind": "schedule",
        "name": "packed",
        "plugin": "specframe.schedules.packed",
        "distribution": "specframe",
    } in entries


def _identities(listing: list[dict]) -> list[dict]:
    """Who registered what, from ``specframe plugins`` (which also lists family, options and exactness)."""
    return [{key: entry[key] for key in ENTRY} for entry in listing]


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
    none = _identities(json.loads(run_with(site, ["-m", "specframe.cli", "plugins"], load="").stdout))
    assert ENTRY not in none and any(e["name"] == "packed" for e in none)  # built-ins always load
    chosen = run_with(site, ["-m", "specframe.cli", "plugins"], load="specframe-ablation-orders").stdout
    assert ENTRY in _identities(json.loads(chosen))


def test_an_unknown_name_whose_distribution_is_excluded_says_so(site):
    code = (
        "from specframe.plugins import get_registry\n"
        "try:\n"
        "    get_registry().get('order_policy', 'lowest-confidence')\n"
        "except KeyError as error:\n"
        "    print(error)\n"
    )
    for load in ("", "some-other-plugin"):
        message = run_with(site, ["-c", code], load=load).stdout
        assert "unknown order policy 'lowest-confidence'" in message
        assert (
            f"comes from the installed distribution 'specframe-ablation-orders', which SPECFRAME_LOAD_PLUGINS="
            f"{load!r} excludes; add 'specframe-ablation-orders' to SPECFRAME_LOAD_PLUGINS or unset it"
        ) in message, message
    unrelated = "from specframe.plugins import get_registry\ntry:\n    get_registry().get('order_policy', 'nope')\n"
    unrelated += "except KeyError as error:\n    print(error)\n"
    assert "excludes" not in run_with(site, ["-c", unrelated], load="").stdout  # no hint where none applies


def test_an_installed_plugins_command_is_listed_by_help_and_runs(site):
    listing = run_with(site, ["-m", "specframe.cli", "--help"])
    assert listing.returncode == 0, listing.stderr
    text = " ".join(listing.stdout.split())  # argparse wraps the help column
    assert "ablation-order show the order in which lowest-confidence verifies draft positions" in text
    scores = ["--score", "5=0.9", "--score", "6=0.1"]
    result = run_with(site, ["-m", "specframe.cli", "ablation-order", "5", "6", "7", *scores])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "6 5 7\n"
    excluded = run_with(site, ["-m", "specframe.cli", "--help"], load="")
    assert "ablation-order" not in excluded.stdout  # a command comes and goes with its plugin


@pytest.fixture(scope="module")
def training_site(tmp_path_factory):
    return install_distribution(TRAINING, tmp_path_factory.mktemp("training-site"))


def test_the_training_commands_come_with_the_specframe_training_distribution(training_site):
    listing = run_with(training_site, ["-m", "specframe.cli", "--help"])
    assert listing.returncode == 0, listing.stderr
    text = " ".join(listing.stdout.split())  # argparse wraps the help column
    assert "train train one of the small bundled-style models on the Python stdlib" in text
    assert "train-drafter train the drafter (proposal LoRA) of a converted model" in text
    for command in ("train", "train-drafter"):
        result = run_with(training_site, ["-m", "specframe.cli", command, "--help"])
        assert result.returncode == 0 and "--work-dir" in result.stdout, result.stderr
    excluded = run_with(training_site, ["-m", "specframe.cli", "train", "setdlm"], load="")
    assert excluded.returncode == 1 and excluded.stderr.count("\n") == 1, excluded.stderr
    assert "comes from the installed distribution 'specframe-training', which SPECFRAME_LOAD_PLUGINS='' excludes" in (
        " ".join(excluded.stderr.split())
    )
