"""The model-backend interface: one forward over cached prefix + new rows under an arbitrary mask.

A model backend knows its architecture, weights, tokenizer and special token ids. It knows no schedule:
the mask builder of its family lays a :class:`specframe.plan.CallPlan` out as rows, and the backend only
evaluates them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from specframe.errors import InputError
from specframe.models.cache import KVCache
from specframe.models.calls import ModelCall, caller_checked


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

    Subclasses set the attributes below in their constructor and implement :meth:`forward` (or
    :meth:`evaluate`, which receives the same arguments as one record).

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
    num_parameters: int | None = None
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32

    def forward(
        self,
        cache: KVCache,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention: torch.Tensor,
        output_rows: torch.Tensor | None = None,
        adapter_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Evaluate new rows against the cache and stage their keys and values in it.

        A backend implements either this method or :meth:`evaluate`, which receives the arguments as one
        :class:`~specframe.models.calls.ModelCall` (this method packs them and calls it).

        Args:
            cache: The request's cache; the new rows' keys/values are staged in it (see :class:`KVCache`).
            input_ids: ``[R]`` token ids.
            position_ids: ``[R]`` position ids.
            attention: ``[R, R]`` boolean mask among new rows (every row also sees every cached row).
            output_rows: ``[K]`` rows to return logits for; all rows when ``None``.
            adapter_rows: ``[R]`` boolean rows that get the proposal-only adapter, if one is loaded.

        Returns:
            ``[K, vocab_size]`` logits.
        """
        return self.evaluate(ModelCall(cache, input_ids, position_ids, attention, output_rows, adapter_rows))

    def forward_many(self, batch: Sequence[tuple[KVCache, Any]]) -> list[torch.Tensor]:
        """Evaluate several requests' calls in one step, each against its own cache (for batched decoding).

        Item ``i`` is a request's cache and its call (a record with ``input_ids``, ``position_ids``,
        ``attention``, ``output_rows``, ``adapter_rows`` and ``checked``, such as a
        :class:`~specframe.plan.PhysicalCall`); output ``i`` must equal :meth:`forward` of that item alone.
        This default runs :meth:`forward` once per item; a backend may override it with one pass over all
        items' rows (attention never crossing requests).
        """
        outputs = []
        for cache, call in batch:
            with caller_checked(call.checked):
                outputs.append(
                    self.forward(
                        cache, call.input_ids, call.position_ids, call.attention, call.output_rows, call.adapter_rows
                    )
                )
        return outputs

    def evaluate(self, call: ModelCall) -> torch.Tensor:
        """:meth:`forward` with its arguments as one record; override this or :meth:`forward`.

        Raises:
            NotImplementedError: If the backend overrides neither.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement forward() or evaluate()")

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
