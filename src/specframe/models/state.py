"""Matching checkpoint tensors to a module built on the meta device, and assigning them.

A family describes its checkpoint layout with a :class:`KeyLayout` (prefix renames plus keys to ignore).
:func:`load_state` checks every name and shape first and reports all missing, unexpected and mis-shaped
tensors in one error; only then does it read the tensors, one at a time, converting each to the target
device and dtype, and assign them to the module (``load_state_dict(assign=True)``), so that the weights
are allocated once, in their final place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from specframe.errors import CheckpointError
from specframe.models.weights import TensorSource

_LIST_LIMIT = 8


@dataclass(frozen=True)
class KeyLayout:
    """How checkpoint tensor names map to module parameter names.

    Attributes:
        renames: ``(checkpoint prefix, module prefix)`` pairs; the first pair matching a name applies.
        ignored: Regular expressions of checkpoint names to skip (buffers such as ``rotary_emb.inv_freq``).
    """

    renames: tuple[tuple[str, str], ...]
    ignored: tuple[str, ...] = (r"(^|\.)rotary_emb\.inv_freq$",)

    def to_module(self, name: str) -> str | None:
        """The module name for checkpoint ``name``; ``None`` if it is ignored; ``name`` itself if unknown."""
        if any(re.search(pattern, name) for pattern in self.ignored):
            return None
        for checkpoint_prefix, module_prefix in self.renames:
            if name.startswith(checkpoint_prefix):
                return module_prefix + name[len(checkpoint_prefix) :]
        return "\0" + name  # cannot collide with a module name

    def to_checkpoint(self, name: str) -> str:
        """The checkpoint name a module parameter is expected under."""
        for checkpoint_prefix, module_prefix in self.renames:
            if name.startswith(module_prefix):
                return checkpoint_prefix + name[len(module_prefix) :]
        return name


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:_LIST_LIMIT])
    return shown + (f" and {len(items) - _LIST_LIMIT} more" if len(items) > _LIST_LIMIT else "")


def match_names(module: nn.Module, source: TensorSource, layout: KeyLayout, *, where: str) -> dict[str, str]:
    """Map each module parameter to its checkpoint tensor, checking names and shapes.

    Returns:
        ``{module name: checkpoint name}`` for every parameter of ``module``.

    Raises:
        CheckpointError: Naming every missing, unexpected and mis-shaped tensor.
    """
    expected = {name: tuple(t.shape) for name, t in module.state_dict(keep_vars=True).items()}
    mapping: dict[str, str] = {}
    unexpected, misshaped = [], []
    for checkpoint_name in source.names():
        target = layout.to_module(checkpoint_name)
        if target is None:
            continue
        if target not in expected:
            unexpected.append(checkpoint_name)
            continue
        if target in mapping:
            unexpected.append(f"{checkpoint_name} (duplicates {mapping[target]})")
            continue
        mapping[target] = checkpoint_name
        found = source.shape(checkpoint_name)
        if found != expected[target]:
            misshaped.append(f"{checkpoint_name} has shape {list(found)}, expected {list(expected[target])}")
    missing = [layout.to_checkpoint(name) for name in expected if name not in mapping]
    problems = []
    if missing:
        problems.append(f"missing tensor(s) {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected tensor(s) {_listing(unexpected)}")
    if misshaped:
        problems.append(f"mis-shaped tensor(s): {_listing(misshaped)}")
    if problems:
        raise CheckpointError(
            f"{where} ({source.description}) does not match its config: "
            + "; ".join(problems)
            + ". Check that config.json belongs to these weights and that the files are complete."
        )
    return mapping


def load_state(
    module: nn.Module,
    source: TensorSource,
    layout: KeyLayout,
    *,
    device: torch.device,
    dtype: torch.dtype,
    where: str,
) -> None:
    """Fill ``module`` (built on the meta device) with the checkpoint's tensors on ``device`` in ``dtype``.

    Raises:
        CheckpointError: If names or shapes do not match, or a tensor cannot be read.
    """
    mapping = match_names(module, source, layout, where=where)
    state = {}
    for target, checkpoint_name in mapping.items():
        state[target] = source.load(checkpoint_name).to(device=device, dtype=dtype)
    module.load_state_dict(state, strict=True, assign=True)
    freeze(module.parameters())


def freeze(parameters: Iterable[nn.Parameter]) -> None:
    """Turn off gradients: backends only ever run inference."""
    for parameter in parameters:
        parameter.requires_grad_(False)
