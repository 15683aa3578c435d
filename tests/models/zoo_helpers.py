"""Helpers shared by the model-zoo tests (a distinct module name: test folders share sys.path)."""

from __future__ import annotations

import torch

from specframe.models.base import ModelCall


def causal(rows: int) -> torch.Tensor:
    return torch.ones(rows, rows, dtype=torch.bool).tril()


def run(model, cache, ids, positions, attention, **kwargs) -> torch.Tensor:
    """One forward from Python lists/tensors."""
    return model.forward(
        cache,
        ModelCall(
            torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(positions, dtype=torch.long), attention, **kwargs
        ),
    )
