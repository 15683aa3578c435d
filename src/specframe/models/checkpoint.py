"""The first steps of every family loader: find the files, read config.json, settle device and dtype."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specframe.models.config import checkpoint_dtype, read_config
from specframe.models.hub import resolve_source
from specframe.models.options import resolve_device, resolve_dtype


@dataclass(frozen=True)
class Checkpoint:
    """A located checkpoint and the device/dtype to load it on.

    Attributes:
        folder: Local folder with config.json and the weights.
        config: The parsed config.json.
        name: How the user named the model (repo id or folder).
        device: Target device.
        dtype: Target dtype.
    """

    folder: Path
    config: dict[str, Any]
    name: str
    device: torch.device
    dtype: torch.dtype

    @property
    def where(self) -> str:
        """The folder, for messages."""
        return str(self.folder)


def locate_checkpoint(
    source: str | os.PathLike[str] | None,
    *,
    device: str | torch.device | None,
    dtype: str | torch.dtype | None,
    revision: str | None,
    adapter: bool = False,
) -> Checkpoint:
    """Resolve the device first (fail fast), then the files, then the dtype (which may depend on config.json).

    Raises:
        ConfigError: If the device or dtype is unavailable.
        CheckpointError: If the files or config.json cannot be found or read.
    """
    resolved_device = resolve_device(device)
    folder = resolve_source(source, revision=revision, adapter=adapter)
    config = read_config(folder)
    resolved_dtype = resolve_dtype(dtype, resolved_device, checkpoint_dtype(config))
    name = os.fspath(source) if source is not None else str(folder)
    return Checkpoint(folder, config, name, resolved_device, resolved_dtype)
