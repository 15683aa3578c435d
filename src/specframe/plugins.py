"""Plugin manager, entry-point loading and the registry of named implementations.

Built-in implementations live in the modules listed in :data:`BUILTIN_PLUGINS` and are registered exactly
like third-party plugins, which are discovered through the ``specframe`` entry-point group::

    [project.entry-points.specframe]
    my_schedules = "my_package.plugin"

The environment variable ``SPECFRAME_LOAD_PLUGINS`` limits which entry points load: a comma-separated list of
entry-point or distribution names, or the empty string for none. Built-ins always load.

One broken plugin never breaks the others: an import error, an invalid hook implementation, an exception
raised while registering, a hook that returns something instead of calling ``register``, or a bad
``register`` call is recorded as a :class:`PluginFailure` naming the plugin and its distribution, and
everything else keeps working. Two plugins claiming one name are reported only
when that name is used, naming both.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
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

BUILTIN_PLUGINS: tuple[str, ...] = (
    "specframe.models.nemotron",
    "specframe.models.setdlm",
    "specframe.masks.nemotron",
    "specframe.masks.setdlm",
    "specframe.orders.ltr",
    "specframe.orders.confidence",
    "specframe.acceptance.greedy",
    "specframe.acceptance.rejection",
    "specframe.schedules.ar",
    "specframe.schedules.linear",
    "specframe.schedules.quadratic",
    "specframe.schedules.packed",
    "specframe.schedules.kbranch",
    "specframe.schedules.auto",
    "specframe.schedules.native_nemotron",
    "specframe.schedules.native_setdlm",
)

# kind -> (hook name, human label)
KINDS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "model_backend": ("register_model_backends", "model backend"),
        "mask_builder": ("register_mask_builders", "mask builder"),
        "order_policy": ("register_order_policies", "order policy"),
        "acceptance_rule": ("register_acceptance_rules", "acceptance rule"),
        "schedule": ("register_schedules", "schedule"),
    }
)

# Extra keyword arguments each kind's register() accepts.
_ALLOWED_EXTRAS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "model_backend": frozenset({"model_types"}),
        "mask_builder": frozenset(),
        "order_policy": frozenset(),
        "acceptance_rule": frozenset(),
        "schedule": frozenset({"family"}),
    }
)


@dataclass(frozen=True)
class PluginEntry:
    """One named implementation registered by a plugin.

    Attributes:
        kind: One of :data:`KINDS`.
        name: The name users compose it by.
        factory: Callable that builds the implementation.
        plugin: Name of the plugin (module or entry point) that registered it.
        distribution: Installed distribution that ships the plugin (``"specframe"`` for built-ins).
        extras: Extra registration data (``model_types`` for backends, ``family`` for schedules).
    """

    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    distribution: str
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str | None:
        """The model family this entry is restricted to, if any."""
        return self.extras.get("family")

    def describe(self) -> dict[str, Any]:
        """The entry as ``specframe plugins`` prints it.

        Besides kind, name, plugin and distribution: a schedule's ``family`` (``None``: every family), the
        ``options`` of a configurable kind (name -> default, ``"<required>"`` for one without a default), and
        for acceptance rules and schedules what they declare as ``exact`` (``None``: nothing, or unknown
        until built; see :mod:`specframe.exactness`).
        """
        out: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "plugin": self.plugin,
            "distribution": self.distribution,
        }
        if self.kind == "schedule":
            out["family"] = self.family
        if self.kind in ("order_policy", "acceptance_rule", "schedule"):
            out["options"] = factory_options(self.factory)
        if self.kind in ("acceptance_rule", "schedule"):
            product = product_class(self.factory)
            out["exact"] = declared_exact(product) if product is not None else None
        return out


def factory_options(factory: Callable[..., Any]) -> dict[str, Any]:
    """The keyword options ``factory`` takes: name -> default (``"<required>"`` without one), JSON-friendly."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return {}
    options = {}
    for p in parameters:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        default = "<required>" if p.default is p.empty else p.default
        if not (default is None or isinstance(default, (bool, int, float, str))):
            default = repr(default)
        options[p.name] = default
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
    """A plugin that could not be loaded or registered.

    Attributes:
        plugin: Plugin (entry point or module) name.
        distribution: Distribution that ships it.
        message: What went wrong.
    """

    plugin: str
    distribution: str
    message: str

    def __str__(self) -> str:
        return f"plugin {self.plugin!r} from distribution {self.distribution!r}: {self.message}"


class Registry:
    """All registered implementations, by kind and name, with the failures met while collecting them."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[tuple[str, str | None], list[PluginEntry]]] = {k: {} for k in KINDS}
        self.failures: list[PluginFailure] = []
        #: Installed entry points that ``SPECFRAME_LOAD_PLUGINS`` left out (consulted only to explain an
        #: unknown name).
        self.excluded: list[metadata.EntryPoint] = []

    def add(self, entry: PluginEntry) -> None:
        """Add an entry (duplicates are kept and reported when their name is used)."""
        self._entries[entry.kind].setdefault((entry.name, entry.family), []).append(entry)

    def entries(self, kind: str | None = None) -> list[PluginEntry]:
        """Every entry, or every entry of one kind, in registration order."""
        kinds = [kind] if kind else list(KINDS)
        return [e for k in kinds for group in self._entries[k].values() for e in group]

    def names(self, kind: str) -> list[str]:
        """Sorted distinct names registered for ``kind``."""
        return sorted({name for name, _ in self._entries[kind]})

    def duplicates(self) -> list[list[PluginEntry]]:
        """Groups of entries that share one kind, name and family."""
        return [group for k in KINDS for group in self._entries[k].values() if len(group) > 1]

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
        table = self._entries[kind]
        group = table.get((name, family)) if family is not None else None
        if not group:
            group = table.get((name, None))
        if not group:
            others = sorted(f for (n, f) in table if n == name and f is not None)
            known = ", ".join(self.names(kind)) or "none"
            if others:
                raise UnknownPluginError(
                    f"{label} {name!r} is only available for model famil{'y' if len(others) == 1 else 'ies'} "
                    f"{', '.join(map(repr, others))}, not {family!r}"
                )
            hint = self._excluded_hint(kind, name) + self._failure_hint()
            plural = label[:-1] + "ies" if label.endswith("y") else label + "s"
            raise UnknownPluginError(f"unknown {label} {name!r}; known {plural}: {known}{hint}")
        if len(group) > 1:
            owners = " and ".join(f"plugin {e.plugin!r} (distribution {e.distribution!r})" for e in group)
            others = sorted({e.distribution for e in group if e.distribution != BUILTIN_DISTRIBUTION})
            if len(others) < len(group):  # a built-in is one of them: it cannot be uninstalled
                dists = " and ".join(map(repr, others))
                remedy = (
                    f"{name!r} is a built-in name, which plugins must not reuse: rename it in the plugin, or "
                    f"uninstall {dists} or leave it out of {LOAD_ENV}"
                )
            else:
                remedy = f"uninstall one of them or restrict loading with {LOAD_ENV}"
            raise DuplicatePluginError(f"{label} {name!r} is registered by both {owners}; {remedy}")
        return group[0]

    def _excluded_hint(self, kind: str, name: str) -> str:
        """Which installed but excluded distributions register ``name`` (an empty string when none does).

        Only now, to explain an unknown name, are the excluded entry points imported, and only to call
        their hook with a register that records names; nothing they register is kept.
        """
        owners = sorted({_distribution(ep) for ep in self.excluded if name in _names_registered(ep, kind)})
        if not owners:
            return ""
        selection = os.environ.get(LOAD_ENV, "")
        dists = " and ".join(map(repr, owners))
        return (
            f" ({KINDS[kind][1]} {name!r} comes from the installed distribution {dists}, which {LOAD_ENV}="
            f"{selection!r} excludes; add {owners[0]!r} to {LOAD_ENV} or unset it)"
        )

    def _failure_hint(self) -> str:
        if not self.failures:
            return ""
        return " (some plugins failed to load: " + "; ".join(str(f) for f in self.failures) + ")"


class PluginHost:
    """The plugin manager plus bookkeeping of where each plugin came from."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager("specframe")
        self.pm.add_hookspecs(hookspecs)
        self._distributions: dict[str, str] = {}
        self._registry: Registry | None = None
        self.failures: list[PluginFailure] = []
        self.excluded: list[metadata.EntryPoint] = []  # entry points SPECFRAME_LOAD_PLUGINS left out
        for module_name in BUILTIN_PLUGINS:
            self._register_module(module_name, module_name, BUILTIN_DISTRIBUTION)
        if load_entry_points:
            self._load_entry_points()

    # -- loading -----------------------------------------------------------------------------------------
    def _register_module(self, module_name: str, plugin_name: str, distribution: str) -> None:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a broken plugin must not break the others
            self.failures.append(PluginFailure(plugin_name, distribution, f"failed to import: {_describe(exc)}"))
            return
        self.register(module, name=plugin_name, distribution=distribution)

    def _load_entry_points(self) -> None:
        wanted = _wanted_entry_points()
        installed: set[str] = set()
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            distribution = ep.dist.name if ep.dist is not None else "<unknown>"
            installed |= {ep.name, distribution}
            if wanted is not None and ep.name not in wanted and distribution not in wanted:
                self.excluded.append(ep)
                continue
            if self.pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                self.failures.append(PluginFailure(ep.name, distribution, f"failed to import: {_describe(exc)}"))
                continue
            self.register(plugin, name=ep.name, distribution=distribution)
        for name in sorted((wanted or set()) - installed):
            known = ", ".join(sorted(installed)) or "none"
            self.failures.append(
                PluginFailure(
                    name,
                    "<not installed>",
                    f"is named in {LOAD_ENV}, but no installed specframe entry point or "
                    f"distribution has that name (installed: {known})",
                )
            )

    def register(self, plugin: object, *, name: str, distribution: str = "<local>") -> bool:
        """Register a plugin object (module or instance); record a failure instead of raising.

        Returns:
            Whether the plugin was registered.
        """
        self._registry = None  # the plugin set (or its failures) changes: collect again on next use
        unknown = [
            attr
            for attr in dir(plugin)
            if self.pm.parse_hookimpl_opts(plugin, attr) is not None and not hasattr(self.pm.hook, attr)
        ]
        if unknown:
            known = ", ".join(spec for _, (spec, _) in KINDS.items())
            self.failures.append(
                PluginFailure(name, distribution, f"unknown hook {', '.join(unknown)}; hooks are: {known}")
            )
            return False
        problem = _unmarked_hooks(self.pm, plugin)
        if problem:
            self.failures.append(PluginFailure(name, distribution, problem))
            return False
        try:
            self.pm.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            self.failures.append(PluginFailure(name, distribution, f"invalid hook implementation: {exc}"))
            return False
        self._distributions[name] = distribution
        return True

    def unregister(self, name: str) -> None:
        """Remove a registered plugin by name."""
        self.pm.unregister(name=name)
        self._distributions.pop(name, None)
        self._registry = None

    # -- collecting --------------------------------------------------------------------------------------
    def registry(self) -> Registry:
        """Every plugin's registrations, collected by calling the hooks once per change of the plugin set."""
        if self._registry is None:
            self._registry = self._collect()
        return self._registry

    def _collect(self) -> Registry:
        registry = Registry()
        registry.failures.extend(self.failures)
        registry.excluded.extend(self.excluded)
        for kind, (hook_name, _) in KINDS.items():
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():  # in registration order
                plugin_name = impl.plugin_name
                distribution = self._distributions.get(plugin_name, "<local>")
                register = _make_register(registry, kind, plugin_name, distribution)
                try:
                    returned = impl.function(register=register)
                except Exception as exc:
                    registry.failures.append(
                        PluginFailure(plugin_name, distribution, f"{hook_name} raised {_describe(exc)}")
                    )
                    continue
                if returned is not None:  # e.g. a list of (name, factory): it would register nothing
                    registry.failures.append(
                        PluginFailure(
                            plugin_name,
                            distribution,
                            f"{hook_name} returned a {type(returned).__name__}, which is ignored; a hook returns "
                            "nothing and calls register(name, factory) once per implementation instead",
                        )
                    )
        return registry


def _unmarked_hooks(pm: pluggy.PluginManager, plugin: object) -> str | None:
    """Why a plugin would register nothing: hook functions without ``@hookimpl``, or no hook at all."""
    hooks = [hook for hook, _ in KINDS.values()]
    marked = [h for h in hooks if pm.parse_hookimpl_opts(plugin, h) is not None]
    unmarked = [h for h in hooks if h not in marked and callable(getattr(plugin, h, None))]
    if unmarked:
        return (
            f"{', '.join(unmarked)} {'is' if len(unmarked) == 1 else 'are'} not marked with @specframe.hookimpl, so "
            "specframe would never call it; decorate each hook function with @hookimpl"
        )
    if not marked:
        return f"implements none of specframe's hooks ({', '.join(hooks)}, each marked with @specframe.hookimpl)"
    return None


def _make_register(registry: Registry, kind: str, plugin: str, distribution: str) -> Callable[..., None]:
    allowed = _ALLOWED_EXTRAS[kind]
    label = KINDS[kind][1]

    def register(name: str, factory: Callable[..., Any], **extras: Any) -> None:
        problem = None
        if not isinstance(name, str) or not name.strip():
            problem = f"{label} name must be a non-empty string, got {name!r}"
        elif not callable(factory):
            problem = f"{label} {name!r}: factory {factory!r} is not callable"
        elif set(extras) - allowed:
            bad = ", ".join(sorted(set(extras) - allowed))
            problem = f"{label} {name!r}: unexpected register() argument(s) {bad}; allowed: {sorted(allowed)}"
        if problem:
            registry.failures.append(PluginFailure(plugin, distribution, problem))
            return
        registry.add(PluginEntry(kind, name, factory, plugin, distribution, MappingProxyType(dict(extras))))

    return register


def _distribution(ep: metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "<unknown>"


def _names_registered(ep: metadata.EntryPoint, kind: str) -> set[str]:
    """The names an entry point's plugin registers for ``kind`` (empty if it cannot be imported or called)."""
    names: set[str] = set()

    def record(name: object, factory: object = None, **extras: object) -> None:
        names.add(str(name))

    try:
        hook = getattr(ep.load(), KINDS[kind][0], None)
        if callable(hook):
            hook(register=record)
    except Exception:  # a broken excluded plugin only loses the hint
        return set()
    return names


def _wanted_entry_points() -> set[str] | None:
    raw = os.environ.get(LOAD_ENV)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


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
    before = len(host.failures)
    if not host.register(plugin, name=name):
        failure = host.failures.pop(before) if len(host.failures) > before else None
        raise PluginError(str(failure) if failure else f"could not register plugin {name!r}")


def unregister_plugin(name: str) -> None:
    """Remove a plugin registered with :func:`register_plugin`."""
    get_host().unregister(name)


@contextlib.contextmanager
def plugin_registered(plugin: object, name: str) -> Iterator[None]:
    """Make ``plugin`` available inside a ``with`` block (a test), and only there.

    A plugin that is already registered (its entry point was loaded) is left as it is, so a plugin's own
    tests run both with and without ``SPECFRAME_LOAD_PLUGINS`` selecting it. In a pytest suite::

        import pytest
        import my_plugin
        from specframe.plugins import plugin_registered

        @pytest.fixture(autouse=True)
        def my_plugin_registered():
            with plugin_registered(my_plugin, "my_plugin"):
                yield

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
