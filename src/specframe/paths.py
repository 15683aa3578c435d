"""Where specframe keeps what it makes once per machine (cost models, pulled models)."""

from __future__ import annotations

import os
from pathlib import Path

from specframe.errors import ConfigError


def cache_dir() -> Path:
    """The cache folder: ``$SPECFRAME_CACHE_DIR``, else ``$XDG_CACHE_HOME/specframe`` or ``~/.cache/specframe``.

    Raises:
        ConfigError: If ``$SPECFRAME_CACHE_DIR`` names an existing file: nothing could be cached there, and
            every process would redo its work without a word.
    """
    explicit = os.environ.get("SPECFRAME_CACHE_DIR")
    if explicit:
        if Path(explicit).expanduser().is_file():
            raise ConfigError(
                f"SPECFRAME_CACHE_DIR={explicit!r} is a file, so nothing (cost models, pulled models) can be cached "
                "there; point it at a folder (it is created if missing) or unset it for ~/.cache/specframe"
            )
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specframe"
