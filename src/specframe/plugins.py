"""The plugin host: built-in and third-party plugins on one pluggy manager, and what they registered.

Built-ins (:data:`BUILTIN_PLUGINS`) are registered exactly like third-party plugins, which are found through
the ``specframe`` entry-point group; ``SPECFRAME_LOAD_PLUGINS`` (entry-point or distribution names, comma
separated; empty: none) limits which of those load. A broken plugin (import error, unknown or unmarked hook,
an exception or a bad ``register`` call while registering, registrations returned instead of made) is a
:class:`PluginFailure` naming it and its distribution, and breaks nothing else; a name two plugins claim is
an error naming both when it is used.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import os
import re
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from types import MappingProxyType
from typing import Any

import pluggy

from specframe import hookspecs
from specframe.errors import DuplicatePluginError, PluginError, UnknownPluginError
from specframe.exactness import declared_exact

ENTRY_POINT_GROUP = "specframe"
LOAD_ENV = "SPECFRAME_LOAD_PLUGINS"
BUILTIN_DISTRIBUTION = "specframe"

#: The modules of the built-in implementations, registered like third-party plugins (distribution "specframe").
BUILTIN_PLUGINS: tuple[str, ...] = tuple(
    "specframe." + module
    for module in """
    models.nemotron models.setdlm masks.nemotron masks.setdlm orders.ltr orders.confidence acceptance.greedy
    acceptance.rejection schedules.ar schedules.linear schedules.quadratic schedules.packed schedules.kbranch
    auto.schedule schedules.native_nemotron schedules.native_setdlm commands
    """.split()
)

#: kind -> (hook name, human label).
KINDS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "model_backend": ("register_model_backends", "model backend"),
        "mask_builder": ("register_mask_builders", "mask builder"),
        "order_policy": ("register_order_policies", "order policy"),
        "acceptance_rule": ("register_acceptance_rules", "acceptance rule"),
        "schedule": ("register_schedules", "schedule"),
        "command": ("register_commands", "command"),
    }
)
_EXTRAS = {"model_backend": {"model_types"}, "schedule": {"family"}, "command": {"help"}}  # register() keywords
HOOKS = tuple(hook for hook, _ in KINDS.values())
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")  # a command's "package.module:function"


@dataclass(frozen=True)
class PluginEntry:
    """One named implementation registered by a plugin.

    Attributes:
        kind: One of :data:`KINDS`.
        name: The name users compose it by.
        factory: Callable that builds the implementation (a command's ``"package.module:add_parser"``).
        plugin: Name of the plugin (module or entry point) that registered it.
        distribution: Installed distribution that ships the plugin (``"specframe"`` for built-ins).
        extras: Extra registration data (``model_types``, a schedule's ``family``, a command's ``help``).
    """

    kind: str
    name: str
    factory: Any
    plugin: str
    distribution: str
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str | None:
        """The model family this entry is restricted to, if any."""
        return self.extras.get("family")

    @property
    def label(self) -> str:
        """The kind as a message names it (``"order policy"``)."""
        return KINDS[self.kind][1]

    def describe(self) -> dict[str, Any]:
        """The entry as ``specframe plugins`` prints it.

        Who registered what, a schedule's ``family``, the ``options`` (name -> default, ``"<required>"``) and
        declared ``exact`` of configurable kinds (see :mod:`specframe.exactness`), a command's ``help`` and target.
        """
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "plugin": self.plugin}
        out["distribution"] = self.distribution
        if self.kind == "schedule":
            out["family"] = self.family
        if self.kind in ("order_policy", "acceptance_rule", "schedule"):
            out["options"] = factory_options(self.factory)
        if self.kind in ("acceptance_rule", "schedule"):
            product = product_class(self.factory)
            out["exact"] = declared_exact(product) if product is not None else None
        if self.kind == "command":
            out.update(help=self.extras.get("help", ""), target=self.factory)
        return out


def factory_options(factory: Callable[..., Any]) -> dict[str, Any]:
    """The keyword options ``factory`` takes: name -> default (``"<required>"`` without one), JSON-friendly."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return {}
    options = {}
    for p in parameters:
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            default = "<required>" if p.default is p.empty else p.default
            ok = default is None or isinstance(default, (bool, int, float, str))
            options[p.name] = default if ok else repr(default)
    return options


def product_class(factory: Callable[..., Any]) -> type | None:
    """The class ``factory`` builds: itself if a class, else its return annotation if that is a class."""
    if inspect.isclass(factory):
        return factory
    try:
        returned = typing.get_type_hints(factory).get("return")
    except Exception:  # an annotation that does not resolve: unknown
        return None
    return returned if inspect.isclass(returned) else None


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or registered: its name, distribution, and what went wrong."""

    plugin: str
    distribution: str
    message: str

    def __str__(self) -> str:
        return f"plugin {self.plugin!r} from distribution {self.distribution!r}: {self.message}"


@dataclass
class Registry:
    """Every registered implementation, with the failures met while collecting them.

    Attributes:
        failures: Plugins that failed to load or to register something.
        excluded: Installed entry points that ``SPECFRAME_LOAD_PLUGINS`` left out (consulted only to explain
            an unknown name).
    """

    _entries: list[PluginEntry] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)
    excluded: list[metadata.EntryPoint] = field(default_factory=list)

    def entries(self, kind: str | None = None) -> list[PluginEntry]:
        """Every entry, or every entry of one kind, in registration order."""
        return [e for e in self._entries if kind in (None, e.kind)]

    def names(self, kind: str) -> list[str]:
        """Sorted distinct names registered for ``kind``."""
        return sorted({e.name for e in self.entries(kind)})

    def duplicates(self) -> list[list[PluginEntry]]:
        """Groups of entries that share one kind, name and family."""
        groups: dict[tuple, list[PluginEntry]] = {}
        for e in self._entries:
            groups.setdefault((e.kind, e.name, e.family), []).append(e)
        return [group for group in groups.values() if len(group) > 1]

    def get(self, kind: str, name: str, *, family: str | None = None) -> PluginEntry:
        """Look up one implementation.

        Args:
            kind: One of :data:`KINDS`.
            name: The registered name.
            family: For family-restricted kinds (schedules), prefer the entry for this family.

        Raises:
            UnknownPluginError: Nothing of that kind has that name (the message lists the known names).
            DuplicatePluginError: Two plugins registered the name (the message names both).
        """
        label = KINDS[kind][1]
        named = [e for e in self.entries(kind) if e.name == name]
        group = [e for e in named if family is not None and e.family == family] or [
            e for e in named if e.family is None
        ]
        if not group and named:
            families = sorted({e.family for e in named})
            raise UnknownPluginError(
                f"{label} {name!r} is only available for model famil{'y' if len(families) == 1 else 'ies'} "
                f"{', '.join(map(repr, families))}, not {family!r}"
            )
        if not group:
            known = self.names(kind)
            close = difflib.get_close_matches(name, known, n=1)
            plural = label[:-1] + "ies" if label.endswith("y") else label + "s"
            message = f"unknown {label} {name!r}; known {plural}: {', '.join(known) or 'none'}"
            message += f"; did you mean {close[0]!r}?" if close else ""
            raise UnknownPluginError(message + self.unavailable_hint(kind, name))
        if len(group) > 1:
            owners = " and ".join(f"plugin {e.plugin!r} (distribution {e.distribution!r})" for e in group)
            others = sorted({e.distribution for e in group} - {BUILTIN_DISTRIBUTION})
            if len(others) < len(group):  # a built-in is one of them: it cannot be uninstalled
                remedy = (
                    f"{name!r} is a built-in name, which plugins must not reuse: rename it in the plugin, or "
                    f"uninstall {' and '.join(map(repr, others))} or leave it out of {LOAD_ENV}"
                )
            else:
                remedy = f"uninstall one of them or restrict loading with {LOAD_ENV}"
            raise DuplicatePluginError(f"{label} {name!r} is registered by both {owners}; {remedy}")
        return group[0]

    def unavailable_hint(self, kind: str, name: str) -> str:
        """Why ``name`` may be missing for ``kind``: an excluded installed plugin or a failed one ("" if none)."""
        return self._excluded_hint(kind, name) + self._failure_hint()

    def _excluded_hint(self, kind: str, name: str) -> str:
        # Only now, to explain an unknown name, are the excluded entry points imported and asked.
        owners = sorted({_distribution(ep) for ep in self.excluded if name in _names_registered(ep, kind)})
        if not owners:
            return ""
        return (
            f" ({KINDS[kind][1]} {name!r} comes from the installed distribution {' and '.join(map(repr, owners))}, "
            f"which {LOAD_ENV}={os.environ.get(LOAD_ENV, '')!r} excludes; add {owners[0]!r} to {LOAD_ENV} or "
            "unset it)"
        )

    def _failure_hint(self) -> str:
        if not self.failures:
            return ""
        return " (some plugins failed to load: " + "; ".join(map(str, self.failures)) + ")"


class PluginHost:
    """A pluggy plugin manager that records each plugin's distribution and every plugin's failure."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager("specframe")
        self.pm.add_hookspecs(hookspecs)
        self.failures: list[PluginFailure] = []
        self.excluded: list[metadata.EntryPoint] = []  # entry points SPECFRAME_LOAD_PLUGINS left out
        self._distributions: dict[str, str] = {}
        self._registry: Registry | None = None
        for module in BUILTIN_PLUGINS:
            self._load(module, BUILTIN_DISTRIBUTION, lambda module=module: importlib.import_module(module))
        if load_entry_points:
            self._load_entry_points()

    def _load(self, name: str, distribution: str, load: Callable[[], object]) -> None:
        try:
            plugin = load()
        except Exception as exc:  # a broken plugin must not break the others
            self.failures.append(PluginFailure(name, distribution, f"failed to import: {_describe(exc)}"))
        else:
            self.register(plugin, name=name, distribution=distribution)

    def _load_entry_points(self) -> None:
        wanted = _wanted_entry_points()
        installed: set[str] = set()
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            names = {ep.name, _distribution(ep)}
            installed |= names
            if wanted is not None and not names & wanted:
                self.excluded.append(ep)
            elif not self.pm.has_plugin(ep.name):
                self._load(ep.name, _distribution(ep), ep.load)
        for name in sorted((wanted or set()) - installed):
            self.failures.append(
                PluginFailure(
                    name,
                    "<not installed>",
                    f"is named in {LOAD_ENV}, but no installed specframe entry point or distribution has that name "
                    f"(installed: {', '.join(sorted(installed)) or 'none'})",
                )
            )

    def register(self, plugin: object, *, name: str, distribution: str = "<local>") -> bool:
        """Register a plugin object (module or instance); record a failure instead of raising.

        Returns:
            Whether the plugin was registered.
        """
        self._registry = None  # the plugin set (or its failures) changes: collect again on next use
        problem = _hook_problem(self.pm, plugin)
        if problem is None:
            try:
                self.pm.register(plugin, name=name)
            except (pluggy.PluginValidationError, ValueError) as exc:
                problem = f"invalid hook implementation: {exc}"
        if problem is not None:
            self.failures.append(PluginFailure(name, distribution, problem))
            return False
        self._distributions[name] = distribution
        return True

    def unregister(self, name: str) -> None:
        """Remove a registered plugin by name."""
        self.pm.unregister(name=name)
        self._distributions.pop(name, None)
        self._registry = None

    def registry(self) -> Registry:
        """Every plugin's registrations, collected by calling the hooks once per change of the plugin set."""
        if self._registry is None:
            registry = Registry(failures=list(self.failures), excluded=list(self.excluded))
            for kind, (hook, _) in KINDS.items():
                for impl in getattr(self.pm.hook, hook).get_hookimpls():  # in registration order
                    self._collect(registry, kind, impl)
            self._registry = registry
        return self._registry

    def _collect(self, registry: Registry, kind: str, impl: pluggy.HookImpl) -> None:
        """Call one plugin's hook with a ``register`` that stamps each entry with the plugin's name."""
        (hook, label), allowed = KINDS[kind], _EXTRAS.get(kind, set())
        plugin, distribution = impl.plugin_name, self._distributions.get(impl.plugin_name, "<local>")

        def fail(message: str) -> None:
            registry.failures.append(PluginFailure(plugin, distribution, message))

        def register(name: str, factory: Any, **extras: Any) -> None:
            if not isinstance(name, str) or not name.strip():
                fail(f"{label} name must be a non-empty string, got {name!r}")
            elif kind == "command" and not (isinstance(factory, str) and _TARGET.fullmatch(factory)):
                fail(f"command {name!r}: target {factory!r} is not a 'package.module:function' string")
            elif kind != "command" and not callable(factory):
                fail(f"{label} {name!r}: factory {factory!r} is not callable")
            elif set(extras) - allowed:
                bad = ", ".join(sorted(set(extras) - allowed))
                fail(f"{label} {name!r}: unexpected register() argument(s) {bad}; allowed: {sorted(allowed)}")
            else:
                registry._entries.append(PluginEntry(kind, name, factory, plugin, distribution, dict(extras)))

        try:
            returned = impl.function(register=register)
        except Exception as exc:
            fail(f"{hook} raised {_describe(exc)}")
            return
        if returned is not None:  # e.g. a list of (name, factory): it would register nothing
            fail(
                f"{hook} returned a {type(returned).__name__}, which is ignored; a hook returns nothing and calls "
                "register(name, factory) once per implementation instead"
            )


def _hook_problem(pm: pluggy.PluginManager, plugin: object) -> str | None:
    """Why ``plugin`` would register nothing: an unknown hook, hook functions without ``@hookimpl``, no hook."""
    marked = [attr for attr in dir(plugin) if pm.parse_hookimpl_opts(plugin, attr) is not None]
    unknown = [attr for attr in marked if attr not in HOOKS]
    if unknown:
        return f"unknown hook {', '.join(unknown)}; hooks are: {', '.join(HOOKS)}"
    unmarked = [h for h in HOOKS if h not in marked and callable(getattr(plugin, h, None))]
    if unmarked:
        return (
            f"{', '.join(unmarked)} {'is' if len(unmarked) == 1 else 'are'} not marked with @specframe.hookimpl, so "
            "specframe would never call it; decorate each hook function with @hookimpl"
        )
    if not marked:
        return f"implements none of specframe's hooks ({', '.join(HOOKS)}, each marked with @specframe.hookimpl)"
    return None


def _distribution(ep: metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "<unknown>"


def _names_registered(ep: metadata.EntryPoint, kind: str) -> set[str]:
    """The names an entry point's plugin registers for ``kind`` (empty if it cannot be imported or called)."""
    names: set[str] = set()
    try:
        hook = getattr(ep.load(), KINDS[kind][0], None)
        if callable(hook):
            hook(register=lambda name, *args, **kwargs: names.add(str(name)))
    except Exception:  # a broken excluded plugin only loses the hint
        return set()
    return names


def _wanted_entry_points() -> set[str] | None:
    raw = os.environ.get(LOAD_ENV)
    return None if raw is None else {part.strip() for part in raw.split(",") if part.strip()}


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide plugin host (created, and entry points loaded, on first use)."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost()
    return _HOST


def reset_host(*, load_entry_points: bool = True) -> PluginHost:
    """Replace the process-wide host with a fresh one (tests use this to isolate plugin state)."""
    global _HOST
    _HOST = PluginHost(load_entry_points=load_entry_points)
    return _HOST


def get_registry() -> Registry:
    """The :class:`Registry` of the process-wide host (collected again only after a plugin is (un)registered)."""
    return get_host().registry()


def register_plugin(plugin: object, name: str) -> None:
    """Register a plugin object in this process (for scripts and tests).

    Raises:
        PluginError: If the plugin is invalid (unknown hook, bad hook signature).
    """
    host = get_host()
    if not host.register(plugin, name=name):
        raise PluginError(str(host.failures.pop()))


def unregister_plugin(name: str) -> None:
    """Remove a plugin registered with :func:`register_plugin`."""
    get_host().unregister(name)


@contextlib.contextmanager
def plugin_registered(plugin: object, name: str) -> Iterator[None]:
    """Make ``plugin`` available inside a ``with`` block (a test), and only there.

    A plugin that is already registered (its entry point was loaded) is left as it is, so a plugin's own
    tests run both with and without ``SPECFRAME_LOAD_PLUGINS`` selecting it.

    Raises:
        PluginError: If the plugin is invalid (unknown hook, bad hook signature).
    """
    host = get_host()
    if host.pm.is_registered(plugin):
        yield
        return
    register_plugin(plugin, name)
    try:
        yield
    finally:
        if host.pm.has_plugin(name):
            host.unregister(name)
