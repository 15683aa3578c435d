"""Which components reproduce the verifier's output, and which settings change the output.

Acceptance rules and schedules declare whether they are *exact* with the class attribute ``exact``:

* ``True``: the output is the verifier's (token for token under greedy decoding, in distribution when
  sampling). Every built-in rule and speculative schedule says so.
* ``False``: lossy, such as the ``native`` diffusion decoders, which verify nothing.
* ``None`` (the base classes' default): not declared. Such a component is not assumed exact.

A declaration is the component's own: a plugin class that inherits a built-in class's ``exact = True``
(say, a subclass of the greedy rule with its own ``verify``) has not declared anything, and reads as
``None`` until it sets ``exact`` itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

#: Modules whose declarations count only for their own classes (those of the library).
_LIBRARY = "specframe."


def declared_exact(component: Any) -> bool | None:
    """What ``component`` (an instance or a class) declares with ``exact``: ``True``, ``False`` or ``None``.

    The declaration of the nearest class in the method resolution order that sets ``exact`` counts, unless
    that class is the library's and ``component``'s own class is not (a plugin subclass of a built-in
    class, which declared nothing).
    """
    cls = component if inspect.isclass(component) else type(component)
    own_is_library = cls.__module__.startswith(_LIBRARY)
    for klass in cls.__mro__:
        if "exact" in vars(klass):
            value = vars(klass)["exact"]
            if klass.__module__.startswith(_LIBRARY) and not own_is_library:
                return None
            return value if isinstance(value, bool) else None
    return None


def is_exact(rule: Any, schedule: Any) -> bool:
    """Whether a decoder with this acceptance rule and schedule reproduces the verifier's output.

    Both must declare ``exact = True``; the order policy only chooses which conditional each accepted
    token is verified against, never whether it is.
    """
    return declared_exact(rule) is True and declared_exact(schedule) is True


def width_changes_output(order: Any, rule: Any) -> bool:
    """Whether the widths a decoder uses change its output for a given seed.

    They do when the order is not left to right (any-order verification accepts other tokens at other
    widths), when the rule samples (the same seed's random numbers are drawn for other tokens), or when the
    rule is not declared exact (its accepted drafts depend on what was drafted). A component may also say
    so itself with the attribute ``output_depends_on_width``.
    """
    for component in (order, rule):
        declared = getattr(component, "output_depends_on_width", None)
        if isinstance(declared, bool):
            if declared:
                return True
            continue
        if component is order and not getattr(order, "left_to_right", False):
            return True
        if component is rule and (getattr(rule, "stochastic", False) or declared_exact(rule) is not True):
            return True
    return False


def inexact_reason(rule: Any, schedule: Any, name_of: Callable[[Any], str | None] | None = None) -> str | None:
    """Why a decoder with this rule and schedule is not exact, for people (``None`` when it is).

    Args:
        rule: The decoder's acceptance rule.
        schedule: The decoder's schedule.
        name_of: The name a component was registered under, where known (the command line passes
            :func:`specframe.blame.registered_name`); else its ``name`` attribute, else its class's name.
    """
    reasons = []
    for label, component in (("schedule", schedule), ("acceptance rule", rule)):
        declared = declared_exact(component)
        if declared is not True:
            registered = name_of(component) if name_of is not None else None
            name = registered or getattr(component, "name", "") or type(component).__name__
            said = "declares exact = False" if declared is False else "does not declare exact = True"
            reasons.append(f"{label} {name!r} {said}")
    if not reasons:
        return None
    return "not exact: " + " and ".join(reasons) + ", so the output is not the verifier's (the AR model's)"
