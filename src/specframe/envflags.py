"""On/off switches read from environment variables (``SPECFRAME_DEBUG``, ``SPECFRAME_CPU_TUNING``).

A switch is read the same way everywhere: ``1``, ``true``, ``yes`` or ``on`` turn it on, ``0``, ``false``,
``no`` or ``off`` turn it off (in any case), an empty or unset variable leaves the default, and anything
else is an error naming the variable, since a typo read as either value would silently do the opposite of
what was meant somewhere.
"""

from __future__ import annotations

import os

from specframe.errors import ConfigError

_ON = {"1", "true", "yes", "on"}
_OFF = {"0", "false", "no", "off"}


def env_flag(name: str, default: bool = False) -> bool:
    """Whether the switch in environment variable ``name`` is on, read now.

    Args:
        name: The variable, e.g. ``"SPECFRAME_DEBUG"``.
        default: The value when the variable is unset or empty.

    Raises:
        ConfigError: For a value that is neither on nor off, naming the variable and the values it takes.
    """
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ConfigError(
        f"environment variable {name}={os.environ[name]!r} is not a switch; set it to 1, true, yes or on to turn "
        f"it on, 0, false, no or off to turn it off, or unset it for the default ({'on' if default else 'off'})"
    )
