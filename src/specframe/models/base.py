"""The model-backend interface: one forward over cached prefix + new rows under an arbitrary mask.

A model backend knows its architecture, weights, tokenizer and special token ids. It knows no schedule:
the mask builder of its family lays a :class:`specframe.plan.CallPlan` out as rows, and the backend only
evaluates them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specframe.errors import InputError
from specframe.models.cache import KVCache


@dataclass(frozen=True)
class ModelCall:
    """The inputs of one model call: new rows to evaluate against a request's cache.

    The decoder passes its :class:`specframe.plan.PhysicalCall`, a subclass that adds the plan's row maps.

    Attributes:
        input_ids: ``[R]`` token ids.
        position_ids: ``[R]`` position ids.
        attention: ``[R, R]`` boolean mask among new rows (every row also sees every cached row).
        output_rows: ``[K]`` rows to return logits for; all rows when ``None``.
        adapter_rows: ``[R]`` boolean rows that get the proposal-only adapter, if one is loaded.
        checked: The caller validated token and position ids on the host, so the model need not read them
            back from the device (:func:`check_call` then checks shapes, dtypes and devices only).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention: torch.Tensor
    output_rows: torch.Tensor | None = None
    adapter_rows: torch.Tensor | None = None
    checked: bool = False


class TextTokenizer(Protocol):
    """What specframe needs from a tokenizer."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any special tokens added."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens included."""
        ...

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (added tokens included)."""
        ...


class ModelBackend:
    """A loaded model of one family, ready to evaluate calls.

    Subclasses set the attributes below in their constructor and implement :meth:`forward` (and, where they
    can evaluate many requests' rows in one pass, :meth:`forward_many`).

    Attributes:
        family: Family name, e.g. ``"nemotron-labs-diffusion"``; selects the mask builder.
        name: Where the model came from (Hub repo id or folder).
        vocab_size: Size of the output layer.
        mask_token_id: Id fed to mask (diffusion query) rows.
        eos_token_ids: Ids that end generation.
        bos_token_id: Id prepended to prompts by :meth:`encode_prompt`, or ``None``.
        max_positions: Largest position id the model supports (``max_position_embeddings - 1``); every
            position a call uses lies in the request's prompt and output span.
        num_layers: Transformer layers (for the KV cache).
        num_kv_heads: Key/value heads per layer.
        head_dim: Size of one attention head.
        tokenizer: Tokenizer, or ``None`` if the checkpoint ships none (then only token ids can be decoded).
        has_adapter: Whether a proposal-only adapter (LoRA) is loaded.
        drafter_acceptance: How often the loaded drafter's proposals agreed with the model, by draft offset
            1, 2, ... (measured on held-out text when it was trained, shipped beside the adapter as
            ``specframe_acceptance.json``), or ``None``. Width ``auto`` starts each request's estimate from it
            instead of a neutral guess.
        num_parameters: The network's parameter count, which sizes the CPU thread policy
            (:mod:`specframe.models.threads`: one thread per 64M parameters, at most the free cores). ``None``
            (the default): counted from the ``torch.nn.Module`` parameters of the backend or of the modules
            it holds as attributes; a backend with neither runs on one thread, with a one-time warning.
            Set it when the weights live elsewhere (a remote service, a compiled artefact).
    """

    family: str = ""
    name: str = ""
    vocab_size: int = 0
    mask_token_id: int = 0
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    max_positions: int = 0
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    tokenizer: TextTokenizer | None = None
    has_adapter: bool = False
    drafter_acceptance: tuple[float, ...] | None = None
    num_parameters: int | None = None
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32

    def forward(self, cache: KVCache, call: ModelCall) -> torch.Tensor:
        """Evaluate a call's new rows against the cache and stage their keys and values in it.

        Args:
            cache: The request's cache; the new rows' keys/values are staged in it (see :class:`KVCache`).
            call: The rows, their positions and mask, which rows to return and which get the adapter.

        Returns:
            ``[K, vocab_size]`` logits of ``call.output_rows`` (all rows when ``None``).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement forward(cache, call)")

    def forward_many(self, batch: Sequence[tuple[KVCache, ModelCall]]) -> list[torch.Tensor]:
        """Evaluate several requests' calls, each against its own cache; attention never crosses requests.

        The result for item ``i`` equals ``forward(*batch[i])``. This default runs :meth:`forward` once per
        item; a backend that can evaluate many requests' rows in one pass overrides it.

        Args:
            batch: ``(cache, call)`` per request (each cache at most once).

        Returns:
            One logits tensor per item, in order.
        """
        return [self.forward(cache, call) for cache, call in batch]

    def new_cache(self, capacity: int) -> KVCache:
        """An empty cache with room for ``capacity`` rows on this model's device and dtype."""
        return KVCache(self.num_layers, self.num_kv_heads, self.head_dim, capacity, self.dtype, self.device)

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a prompt, with the family's BOS convention applied.

        Raises:
            InputError: If the model has no tokenizer.
        """
        if self.tokenizer is None:
            raise InputError(f"model {self.name!r} has no tokenizer.json; pass token ids instead of text")
        ids = self.tokenizer.encode(text)
        if self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids (empty string when the model has no tokenizer)."""
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids))

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary (family, source, sizes, special ids)."""
        return {
            "family": self.family,
            "name": self.name,
            "vocab_size": self.vocab_size,
            "num_layers": self.num_layers,
            "mask_token_id": self.mask_token_id,
            "eos_token_ids": list(self.eos_token_ids),
            "bos_token_id": self.bos_token_id,
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "has_adapter": self.has_adapter,
        }


def check_call(model: ModelBackend, cache: KVCache, call: ModelCall, *, values: bool = True) -> None:
    """Check a call (see :meth:`ModelBackend.forward`) before it runs.

    Shapes, dtypes and devices are checked without a host sync; with ``values``, the ids too (one host sync),
    unless the caller checked them (``call.checked``).

    Raises:
        InputError: Naming every problem found.
    """
    if not isinstance(call, ModelCall):
        raise InputError(
            f"forward(cache, call) takes a ModelCall as its call, got {type(call).__name__}; build one with "
            "ModelCall(input_ids, position_ids, attention, ...)"
        )
    ids, positions, attention = call.input_ids, call.position_ids, call.attention
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
    if not problems and values and not call.checked:
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
