"""One model call's inputs as a record, and validating them before the call runs (messages name the problem)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specframe.errors import InputError
from specframe.models.cache import KVCache

if TYPE_CHECKING:
    from specframe.models.base import ModelBackend


@dataclass(frozen=True, slots=True)
class ModelCall:
    """The arguments of :meth:`ModelBackend.forward <specframe.models.base.ModelBackend.forward>`, as one record.

    :meth:`~specframe.models.base.ModelBackend.forward` packs them and hands the record to
    :meth:`~specframe.models.base.ModelBackend.evaluate`; each forward path takes it whole.

    Attributes:
        cache: The request's cache; the new rows' keys/values are staged in it.
        input_ids: ``[R]`` token ids.
        position_ids: ``[R]`` position ids.
        attention: ``[R, R]`` boolean mask among new rows (every row also sees every cached row).
        output_rows: ``[K]`` rows to return logits for; all rows when ``None``.
        adapter_rows: ``[R]`` boolean rows that get the proposal-only adapter, if one is loaded.
    """

    cache: KVCache
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention: torch.Tensor
    output_rows: torch.Tensor | None = None
    adapter_rows: torch.Tensor | None = None


_CALLER_CHECKED: ContextVar[bool] = ContextVar("specframe_caller_checked", default=False)


class caller_checked:  # noqa: N801 - used like a function: ``with caller_checked(call.checked):``
    """Within the block, :func:`check_call` skips the value check (its host sync) when ``checked``.

    For a caller that validated token and position ids on the host before putting them on the device (the
    decoder, for calls built from layout templates); shapes, dtypes and devices are still checked. (A class
    rather than a generator-based context manager: the decoder enters one per model call.)

    Args:
        checked: Whether the caller checked the values.
    """

    __slots__ = ("checked", "token")

    def __init__(self, checked: bool = True) -> None:
        self.checked = checked

    def __enter__(self) -> None:
        self.token = _CALLER_CHECKED.set(self.checked)

    def __exit__(self, *exc: object) -> None:
        _CALLER_CHECKED.reset(self.token)


def check_call(model: ModelBackend, call: ModelCall, *, values: bool = True) -> None:
    """Check a call's arguments (see :meth:`ModelBackend.forward`) before it runs.

    Shapes, dtypes and devices are checked without a host sync; with ``values``, the ids too (one host sync),
    unless the caller checked them (:func:`caller_checked`).

    Raises:
        InputError: Naming every problem found.
    """
    cache, ids, positions, attention = call.cache, call.input_ids, call.position_ids, call.attention
    output_rows, adapter = call.output_rows, call.adapter_rows
    rows = ids.shape[0] if ids.dim() == 1 else -1
    problems = []
    if rows < 1:
        problems.append(f"input_ids must be a non-empty 1-D tensor, got shape {list(ids.shape)}")
    for label, tensor in (("input_ids", ids), ("position_ids", positions)):
        if tensor.dtype not in (torch.int64, torch.int32) or tensor.device != model.device:
            got = f"{tensor.dtype} on {tensor.device}"
            problems.append(f"{label} must be an integer tensor on {model.device}, got {got}")
    if positions.shape != ids.shape:
        problems.append(f"position_ids shape {list(positions.shape)} != input_ids {list(ids.shape)}")
    if attention.shape != (rows, rows) or attention.dtype != torch.bool:
        got = f"{attention.dtype} {list(attention.shape)}"
        problems.append(f"attention must be a [{rows}, {rows}] bool tensor, got {got}")
    if output_rows is not None and output_rows.dim() != 1:
        problems.append(f"output_rows must be 1-D, got shape {list(output_rows.shape)}")
    if adapter is not None and (adapter.shape != (rows,) or adapter.dtype != torch.bool):
        problems.append(f"adapter_rows must be a [{rows}] bool tensor, got {adapter.dtype} {list(adapter.shape)}")
    keys = cache.keys
    expected = (model.num_layers, model.num_kv_heads, model.head_dim)
    found = (cache.num_layers, *keys.shape[2:])
    if found != expected or keys.dtype != model.dtype or keys.device != model.device:
        problems.append(
            f"the KV cache ({keys.dtype}, {keys.device}, layers/heads/head size {found}) was not made for this "
            f"model ({model.dtype}, {model.device}, {expected}); create it with model.new_cache()"
        )
    if not problems and values and not _CALLER_CHECKED.get():
        problems = _value_problems(model, cache, ids, positions, attention, output_rows)
    if problems:
        raise InputError("; ".join(problems))


def _value_problems(model: ModelBackend, cache: KVCache, ids, positions, attention, output_rows) -> list[str]:
    stats = [ids.min(), ids.max(), positions.min(), positions.max()]
    selected = output_rows is not None and output_rows.numel() > 0
    if selected:
        stats += [output_rows.min(), output_rows.max()]
    if cache.length == 0:  # with cached rows every row sees something
        stats.append((~attention.any(dim=1)).sum())
    values = torch.stack([s.to(torch.int64) for s in stats]).tolist()  # one host sync
    low_id, high_id, low_pos, high_pos = values[:4]
    problems = []
    if low_id < 0 or high_id >= model.vocab_size:
        bad = high_id if high_id >= model.vocab_size else low_id
        problems.append(f"token id {bad} is outside the model's vocabulary [0, {model.vocab_size})")
    if low_pos < 0:
        problems.append(f"position id {low_pos} is negative")
    if high_pos > model.max_positions:
        problems.append(
            f"position id {high_pos} is beyond the model's context of {model.max_positions + 1} positions "
            "(max_position_embeddings): shorten the prompt or the requested output"
        )
    rows = ids.shape[0]
    if selected and (values[4] < 0 or values[5] >= rows):
        problems.append(f"output_rows must index the {rows} rows of the call")
    if cache.length == 0 and values[-1]:
        problems.append(f"{values[-1]} row(s) attend to nothing (empty cache and an all-False mask row)")
    return problems
