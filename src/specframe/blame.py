"""Which plugin an object came from, so that an error raised while decoding can name it.

:func:`specframe.compose` remembers the registry entry of every order, acceptance rule, schedule and mask
builder it builds (:func:`remember`). When one of them breaks its contract while decoding (a plan that is not
a ``CallPlan``, an order that is not a permutation) or raises, the error names the plugin and distribution
that registered it (:func:`origin`, :func:`plugin_failure`) instead of leaving a bare ``AttributeError`` in
specframe's own code. Built-in implementations are never blamed: an exception there is specframe's bug and
is left as it is.
"""

from __future__ import annotations

import weakref
from types import TracebackType

from specframe.errors import PluginError
from specframe.plugins import BUILTIN_DISTRIBUTION, PluginEntry

# id(object) -> (a weak reference to it, the entry that built it); an entry leaves with its object.
_ORIGINS: dict[int, tuple[weakref.ref, PluginEntry]] = {}


def remember(product: object, entry: PluginEntry) -> None:
    """Record that ``entry``'s factory built ``product`` (objects that take no weak reference are skipped)."""
    key = id(product)
    try:
        ref = weakref.ref(product, lambda _, key=key: _ORIGINS.pop(key, None))
    except TypeError:
        return
    _ORIGINS[key] = (ref, entry)


def entry_of(obj: object) -> PluginEntry | None:
    """The registry entry whose factory built ``obj``, if :func:`remember` saw it."""
    item = _ORIGINS.get(id(obj))
    return item[1] if item is not None and item[0]() is obj else None


def registered_name(obj: object) -> str | None:
    """The name ``obj``'s plugin registered it under (what a configuration names it by), if known."""
    entry = entry_of(obj)
    return entry.name if entry is not None else None


def origin(obj: object, label: str) -> str:
    """How an error names ``obj``: ``schedule 'x' (plugin 'p', distribution 'd')``, else by its class."""
    entry = entry_of(obj)
    if entry is None:
        cls = type(obj)
        return f"{label} {cls.__qualname__} (module {cls.__module__})"
    return f"{entry.label} {entry.name!r} (plugin {entry.plugin!r}, distribution {entry.distribution!r})"


def contract_error(obj: object, label: str, problem: str) -> PluginError:
    """A :class:`PluginError` for ``obj`` breaking its interface: ``problem`` says how."""
    return PluginError(f"{origin(obj, label)}: {problem}; this is a bug in that plugin")


def plugin_failure(exc: BaseException, suspects: tuple[object, ...]) -> PluginError | None:
    """A :class:`PluginError` naming the third-party plugin inside which ``exc`` was raised, if any.

    The innermost frame of the traceback that runs a method of a third-party object :func:`remember` saw, or
    that runs in the module of one of the third-party ``suspects`` (a plugin's helper function), decides.
    ``None`` when no third-party plugin's code is on the traceback (an error of specframe's own).
    """
    modules = {type(s).__module__: s for s in suspects if _third_party(s)}
    culprit = None
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        if owner is not None and _third_party(owner):
            culprit = owner
        elif frame.f_globals.get("__name__") in modules:
            culprit = modules[frame.f_globals["__name__"]]
        tb = tb.tb_next
    if culprit is None:
        return None
    return PluginError(
        f"{origin(culprit, '')} raised {type(exc).__name__}: {exc} while decoding; this is a bug in that plugin "
        "(report it to its authors with the traceback, which SPECFRAME_DEBUG=1 shows on the command line, or "
        "choose another one)"
    )


def _third_party(obj: object) -> bool:
    entry = entry_of(obj)
    return entry is not None and entry.distribution != BUILTIN_DISTRIBUTION
