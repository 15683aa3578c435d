"""``load_model``: pick a model family by ``config.json``'s ``model_type`` and let it load the checkpoint."""

from __future__ import annotations

import inspect
import os

import torch

from specframe.errors import CheckpointError, ConfigError
from specframe.models.base import ModelBackend
from specframe.models.config import read_config
from specframe.models.hub import resolve_source
from specframe.models.options import resolve_device
from specframe.plugins import PluginEntry, get_registry


def load_model(
    source: str | os.PathLike[str] | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    revision: str | None = None,
    family: str | None = None,
    adapter: bool | str | os.PathLike[str] = False,
) -> ModelBackend:
    """Load a model from the Hub, a local folder, or the bundled default.

    Args:
        source: Hub repo id (e.g. ``"nvidia/Nemotron-Labs-Diffusion-8B"``), a local folder in the Hub layout
            (config.json, safetensors or .bin weights, tokenizer.json), a bundled model's name
            (``"setdlm-stdlib-tiny"``), or ``None`` for the bundled default (``"nemotron-stdlib-tiny"``).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        dtype: ``"float32"``/``"fp32"``, ``"bfloat16"``/``"bf16"``, ``"float16"``, ``"float64"`` or a torch
            dtype; default float32 on CPU and the checkpoint's own dtype on accelerators.
        revision: Hub branch, tag or commit.
        family: Force a model family (e.g. ``"setdlm"``) instead of choosing by ``model_type``.
        adapter: Load the family's proposal-only adapter (``True``, or an adapter folder).

    Returns:
        The loaded backend.

    Raises:
        CheckpointError: If the checkpoint cannot be found, read or recognised.
        ConfigError: If the device or dtype is unavailable, or the family has no adapter.
        UnknownPluginError: If ``family`` names no registered family.
    """
    resolve_device(device)  # fail before any download
    folder = resolve_source(source, revision=revision, adapter=adapter is True)
    entry = _pick_family(read_config(folder), family, folder)
    options: dict[str, object] = {"device": device, "dtype": dtype, "revision": revision}
    if adapter is not False:
        if "adapter" not in inspect.signature(entry.factory).parameters:
            raise ConfigError(
                f"model family {entry.name!r} has no proposal-only adapter; drop adapter=True (--adapter on the "
                "command line)"
            )
        options["adapter"] = adapter
    model: ModelBackend = entry.factory(folder, **options)
    model.name = os.fspath(source) if source is not None else str(folder)
    return model


def _pick_family(config: dict, family: str | None, folder: os.PathLike[str]) -> PluginEntry:
    registry = get_registry()
    if family is not None:
        return registry.get("model_backend", family)
    model_type = config.get("model_type")
    known: dict[str, PluginEntry] = {}
    for entry in registry.entries("model_backend"):
        for name in entry.extras.get("model_types", ()):
            known.setdefault(name, entry)
    if model_type in known:
        return known[model_type]
    listing = ", ".join(f"{name!r} ({entry.name})" for name, entry in sorted(known.items())) or "none"
    found = f"model_type {model_type!r}" if model_type is not None else "no model_type"
    raise CheckpointError(
        f"{folder}/config.json has {found}; known model types: {listing}. Pass family=... to load it with a "
        "specific family, or install the plugin for this model type"
    )
