"""The plugin host: built-ins registered like plugins, named failures, isolation of broken plugins."""

from __future__ import annotations

import types

import pytest

from specframe import hookimpl
from specframe.errors import DuplicatePluginError, PluginError, UnknownPluginError
from specframe.plugins import BUILTIN_PLUGINS, PluginHost, register_plugin, reset_host, unregister_plugin


@pytest.fixture
def host():
    """A fresh process-wide host without entry points, restored afterwards."""
    fresh = reset_host(load_entry_points=False)
    yield fresh
    reset_host(load_entry_points=False)


def _plugin(**hooks):
    module = types.SimpleNamespace()
    for name, fn in hooks.items():
        setattr(module, name, hookimpl(fn))
    return module


def test_every_builtin_registers_and_nothing_fails(host):
    registry = host.registry()
    assert registry.failures == []
    kinds = {(e.kind, e.name) for e in registry.entries()}
    expected = {
        ("model_backend", "nemotron-labs-diffusion"),
        ("model_backend", "setdlm"),
        ("mask_builder", "nemotron-labs-diffusion"),
        ("mask_builder", "setdlm"),
        ("order_policy", "ltr"),
        ("order_policy", "confidence"),
        ("acceptance_rule", "greedy"),
        ("acceptance_rule", "rejection"),
        ("schedule", "ar"),
        ("schedule", "linear"),
        ("schedule", "quadratic"),
        ("schedule", "packed"),
        ("schedule", "native"),
    }
    assert expected <= kinds
    # built-ins are stamped with their module and the specframe distribution, like any plugin
    plugins = {e.plugin for e in registry.entries()}
    assert plugins == set(BUILTIN_PLUGINS)
    assert {e.distribution for e in registry.entries()} == {"specframe"}


def test_unknown_name_lists_known_ones(host):
    with pytest.raises(UnknownPluginError) as info:
        host.registry().get("schedule", "pakced")
    message = str(info.value)
    assert "unknown schedule 'pakced'" in message
    for name in ("ar", "linear", "packed", "quadratic"):
        assert name in message


def test_family_restricted_schedule_names_its_families(host):
    registry = host.registry()
    assert registry.get("schedule", "native", family="setdlm").plugin == "specframe.schedules.native_setdlm"
    assert (
        registry.get("schedule", "native", family="nemotron-labs-diffusion").plugin
        == "specframe.schedules.native_nemotron"
    )
    with pytest.raises(UnknownPluginError, match="only available for model famil"):
        registry.get("schedule", "native", family="some-other-family")


def test_duplicate_name_names_both_plugins_and_leaves_others_working(host):
    def register_schedules(register):
        register("packed", lambda: None)

    host.register(_plugin(register_schedules=register_schedules), name="copycat", distribution="copycat-dist")
    registry = host.registry()
    with pytest.raises(DuplicatePluginError) as info:
        registry.get("schedule", "packed")
    message = str(info.value)
    assert "specframe.schedules.packed" in message and "'specframe'" in message
    assert "copycat" in message and "copycat-dist" in message
    assert registry.get("schedule", "linear").name == "linear"


def test_hook_that_raises_is_reported_and_others_keep_working(host):
    def register_schedules(register):
        raise RuntimeError("boom")

    host.register(_plugin(register_schedules=register_schedules), name="exploding", distribution="bad-dist")
    registry = host.registry()
    assert any(
        f.plugin == "exploding" and f.distribution == "bad-dist" and "boom" in f.message for f in registry.failures
    )
    assert registry.get("schedule", "packed").plugin == "specframe.schedules.packed"


def test_invalid_hook_signature_is_reported_with_its_distribution(host):
    def register_schedules(register, unexpected_argument):
        register("x", lambda: None)

    assert not host.register(_plugin(register_schedules=register_schedules), name="badsig", distribution="sig-dist")
    failure = host.failures[-1]
    assert failure.plugin == "badsig" and failure.distribution == "sig-dist"
    assert "invalid hook implementation" in failure.message
    assert host.registry().get("schedule", "ar").name == "ar"


def test_misspelled_hook_is_reported(host):
    def register_schedule(register):  # missing the trailing "s"
        register("x", lambda: None)

    assert not host.register(_plugin(register_schedule=register_schedule), name="typo", distribution="typo-dist")
    assert "unknown hook register_schedule" in host.failures[-1].message


def test_bad_register_calls_are_failures_not_crashes(host):
    def register_schedules(register):
        register("", lambda: None)
        register("not-callable", 42)
        register("bad-extra", lambda: None, colour="red")
        register("fine", lambda: None)

    host.register(_plugin(register_schedules=register_schedules), name="sloppy", distribution="sloppy-dist")
    registry = host.registry()
    messages = [f.message for f in registry.failures if f.plugin == "sloppy"]
    assert len(messages) == 3
    assert any("non-empty string" in m for m in messages)
    assert any("not callable" in m for m in messages)
    assert any("colour" in m for m in messages)
    assert registry.get("schedule", "fine").plugin == "sloppy"


def test_plugin_that_fails_to_import_is_reported(monkeypatch):
    monkeypatch.setattr("specframe.plugins.BUILTIN_PLUGINS", ("specframe.orders.ltr", "specframe.does_not_exist"))
    host = PluginHost(load_entry_points=False)
    failure = host.failures[0]
    assert failure.plugin == "specframe.does_not_exist"
    assert "failed to import" in failure.message and "ModuleNotFoundError" in failure.message
    assert host.registry().get("order_policy", "ltr").name == "ltr"


def test_register_plugin_in_process_and_compose_by_name(host):
    class Reverse:
        left_to_right = False

        def order(self, positions, scores):
            return sorted(positions, reverse=True)

    def register_order_policies(register):
        register("reverse", Reverse)

    register_plugin(_plugin(register_order_policies=register_order_policies), "reverse-plugin")
    try:
        entry = host.registry().get("order_policy", "reverse")
        assert entry.factory().order([3, 1, 2], {}) == [3, 2, 1]
    finally:
        unregister_plugin("reverse-plugin")
    with pytest.raises(UnknownPluginError):
        host.registry().get("order_policy", "reverse")


def test_register_plugin_raises_for_an_invalid_plugin(host):
    def register_schedules(register, extra):
        pass

    with pytest.raises(PluginError, match="invalid hook implementation"):
        register_plugin(_plugin(register_schedules=register_schedules), "broken")


def test_entry_point_selection_env(monkeypatch):
    from specframe import plugins

    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "alpha, beta-dist")
    assert plugins._wanted_entry_points() == {"alpha", "beta-dist"}
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "")
    assert plugins._wanted_entry_points() == set()
    monkeypatch.delenv("SPECFRAME_LOAD_PLUGINS")
    assert plugins._wanted_entry_points() is None


def test_a_selected_plugin_that_is_not_installed_is_reported(monkeypatch):
    """A typo in SPECFRAME_LOAD_PLUGINS used to load nothing, silently; now the name is a failure."""
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "adaptve_packed")
    host = PluginHost()
    messages = [str(f) for f in host.failures]
    assert len(messages) == 1 and "plugin 'adaptve_packed'" in messages[0]
    assert "named in SPECFRAME_LOAD_PLUGINS, but no installed specframe entry point" in messages[0]
    with pytest.raises(UnknownPluginError, match="some plugins failed to load: plugin 'adaptve_packed'"):
        host.registry().get("schedule", "adaptive-packed")
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "")
    assert PluginHost().failures == []  # no plugin asked for, none missing


def test_hook_functions_without_hookimpl_are_reported(host):
    unmarked = types.SimpleNamespace(register_schedules=lambda register: None)
    assert not host.register(unmarked, name="unmarked")
    assert "register_schedules is not marked with @specframe.hookimpl" in str(host.failures[-1])


def test_the_registry_is_collected_once_per_change_of_the_plugin_set(host):
    calls = []

    def register_order_policies(register):
        calls.append(1)
        register("counted", lambda: None)

    first = host.registry()
    assert host.registry() is first  # compose and load_model reuse it: no hook runs again
    register_plugin(_plugin(register_order_policies=register_order_policies), "counting")
    second = host.registry()
    assert second is not first and host.registry() is second and len(calls) == 1
    assert "counted" in second.names("order_policy") and "counted" not in first.names("order_policy")
    unregister_plugin("counting")
    assert "counted" not in host.registry().names("order_policy") and len(calls) == 1


def test_a_hook_that_returns_its_registrations_is_reported(host):
    # A common slip: returning [(name, factory)] instead of calling register(name, factory).
    def register_schedules(register):
        return [("returned", lambda: None)]

    host.register(_plugin(register_schedules=register_schedules), name="returner", distribution="returner-dist")
    registry = host.registry()
    failure = next(f for f in registry.failures if f.plugin == "returner")
    assert failure.distribution == "returner-dist"
    assert "returned a list" in failure.message and "register(name, factory)" in failure.message
    with pytest.raises(UnknownPluginError, match="returner"):  # the unknown name's message points at it
        registry.get("schedule", "returned")


def test_reusing_a_builtin_name_says_to_rename_it_not_to_uninstall_the_builtin(host):
    def register_schedules(register):
        register("packed", lambda: None)

    host.register(_plugin(register_schedules=register_schedules), name="copycat", distribution="copycat-dist")
    with pytest.raises(DuplicatePluginError) as info:
        host.registry().get("schedule", "packed")
    message = str(info.value)
    assert "built-in name" in message and "rename it in the plugin" in message
    assert "uninstall 'copycat-dist'" in message and "uninstall one of them" not in message


# -- commands ------------------------------------------------------------------------------------------


def test_a_command_that_reuses_a_builtin_name_is_an_error_naming_the_plugin(host, capsys):
    from specframe.cli import main

    def register_commands(register):
        register("bench", "copycat.cli:add_parser", help="not the real bench")

    host.register(_plugin(register_commands=register_commands), name="copycat", distribution="copycat-dist")
    assert main(["bench", "--limit", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: command 'bench' is registered by both plugin 'specframe.commands'") and (
        "plugin 'copycat' (distribution 'copycat-dist')" in err and "rename it in the plugin" in err
    )
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out
    assert listing.count("bench ") == 1 and "not the real bench" not in listing  # listed once, as the built-in


def test_a_commands_target_is_imported_only_when_it_runs(host, capsys):
    from specframe.cli import main

    def register_commands(register):
        register("broken", "no_such_module_anywhere:add_parser", help="a command whose module is missing")
        register("typo", "not a target")

    host.register(_plugin(register_commands=register_commands), name="lazy", distribution="lazy-dist")
    failures = [f.message for f in host.registry().failures if f.plugin == "lazy"]
    assert failures == ["command 'typo': target 'not a target' is not a 'package.module:function' string"]
    assert main(["plugins"]) == 0  # the broken module is never imported for another command
    capsys.readouterr()
    assert main(["broken"]) == 1
    err = capsys.readouterr().err
    assert "command 'broken' (plugin 'lazy', distribution 'lazy-dist') could not add its parser" in err
    assert "ModuleNotFoundError" in err and "bug in that plugin" in err
