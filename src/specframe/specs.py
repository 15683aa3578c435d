"""Plugin choices written as text, as the command line takes them: ``NAME`` or ``NAME:key=value,key=value``.

Each value is read as a JSON scalar where it parses as one (``2`` -> 2, ``0.5`` -> 0.5, ``true`` -> True,
``null`` -> None, ``"2"`` -> the string "2") and is kept as a plain string otherwise (``mode=fast``).
Values cannot contain commas. Examples::

    parse_spec("packed")                                  # -> "packed"
    parse_spec("adaptive-packed:patience=2,cooldown=4")   # -> {"name": "adaptive-packed", "patience": 2, "cooldown": 4}
    split_specs("ar,adaptive-packed:patience=2,cooldown=4,packed")
    # -> ["ar", "adaptive-packed:patience=2,cooldown=4", "packed"]
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Mapping
from typing import Any

from specframe.errors import ConfigError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_spec(text: str, *, option: str = "--schedule") -> str | dict[str, Any]:
    """Turn ``NAME`` or ``NAME:key=value,...`` into a plugin field value for a decoder config.

    Args:
        text: The text as written on the command line.
        option: The command-line option it came from (for messages).

    Returns:
        The bare name, or a mapping with ``name`` and the options.

    Raises:
        ConfigError: An empty name, an option without ``=``, a key that is not an identifier, or a key given
            twice.
    """
    if not isinstance(text, str):
        raise ConfigError(f"{option} must be text like NAME or NAME:key=value, got {text!r}")
    name, colon, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise ConfigError(f"{option} {text!r} has no plugin name; write NAME or NAME:key=value,key=value")
    if not colon:
        return name
    options: dict[str, Any] = {}
    for item in rest.split(","):
        key, equals, raw = item.partition("=")
        key = key.strip()
        if not equals or not _KEY.match(key):
            raise ConfigError(
                f"{option} {text!r}: option {item.strip()!r} is not key=value (write "
                f"{name}:key=value,key=value; keys are identifiers, values cannot contain commas)"
            )
        if key == "name" or key in options:
            raise ConfigError(f"{option} {text!r} gives option {key!r} twice (or names it 'name'); give it once")
        options[key] = parse_value(raw.strip())
    return {"name": name, **options}


def parse_value(raw: str) -> Any:
    """A JSON scalar where ``raw`` parses as one, else ``raw`` itself as a string."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if value is None or isinstance(value, (bool, int, float, str)) else raw


def format_spec(value: str | Mapping[str, Any]) -> str:
    """The canonical text of a plugin field value: ``NAME``, or ``NAME:key=value,...`` with sorted keys.

    It parses back to the same value with :func:`parse_spec`, so it can name a bench method.
    """
    if isinstance(value, str):
        return value
    options = {k: v for k, v in value.items() if k != "name"}
    if not options:
        return str(value["name"])
    return f"{value['name']}:" + ",".join(f"{k}={_format_value(options[k])}" for k in sorted(options))


def comma_items(text: str, *, option: str) -> list[str]:
    """The stripped items of a comma-separated command-line list, refusing empty ones.

    An empty item (``1,,2``, a trailing comma, or an empty value) is a typo more often than not, so it is an
    error rather than skipped.

    Raises:
        ConfigError: Naming the option, the text and the empty entry (counted from 1).
    """
    items = [item.strip() for item in text.split(",")]
    empty = next((i for i, item in enumerate(items) if not item), None)
    if empty is not None:
        raise ConfigError(
            f"{option} {text!r}: entry {empty + 1} is empty; separate the entries with single commas and no "
            "trailing comma"
        )
    return items


def split_specs(text: str, *, option: str = "--schedules") -> list[str]:
    """Split a comma-separated list of specs: an item with ``=`` continues the options of the spec before it.

    Raises:
        ConfigError: For an empty entry, or an option that follows no ``NAME:key=value`` item.
    """
    specs: list[str] = []
    for item in comma_items(text, option=option):
        key, equals, _ = item.partition("=")
        if equals and ":" not in key:
            if not specs or ":" not in specs[-1]:
                raise ConfigError(
                    f"{option} {text!r}: option {item!r} follows no NAME:key=value item; write NAME:key=value,key=value"
                )
            specs[-1] += "," + item
        else:
            specs.append(item)
    return specs


def spec_name(value: str | Mapping[str, Any]) -> str:
    """The plugin name of a field value (text, or mapping with ``name``)."""
    if isinstance(value, Mapping):
        return str(value.get("name"))
    return value.partition(":")[0].strip()


def _format_value(value: Any) -> str:
    if isinstance(value, str) and parse_value(value) == value and "," not in value and value.strip() == value:
        return value
    return json.dumps(value)


def as_integer(value: Any) -> int | None:
    """``value`` as a Python int when it is an integer, else ``None``.

    Integers are Python's and NumPy's (anything with ``__index__``, as ``prompt_ids`` entries are read), never
    booleans (Python's or NumPy's) or floats, even integral ones.
    """
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None
