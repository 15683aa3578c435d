"""A batched, cache-free forward of the inference network, for training.

The network is the very :class:`~specframe.models.transformer.DecoderNetwork` the backends run, so trained
weights load into the inference classes unchanged. Instead of rows against a KV cache, a batch of ``[B, T]``
rows attends among itself under a ``[B, T, T]`` boolean mask (True = may attend), with autograd.
"""

from __future__ import annotations

import torch

from specframe.models.layers import ForwardContext, RotaryEmbedding, llama4_query_scale
from specframe.models.transformer import DecoderNetwork, NetworkConfig


class TrainingForward:
    """Evaluates a :class:`DecoderNetwork` on batched rows under an arbitrary attention mask.

    Args:
        network: The network to train (its parameters keep ``requires_grad``).
        dtype: Dtype of the rotary tables (the parameters' dtype).
    """

    def __init__(self, network: DecoderNetwork, dtype: torch.dtype = torch.float32) -> None:
        self.network = network
        config: NetworkConfig = network.config
        device = next(network.parameters()).device
        self.rotary = RotaryEmbedding(config.rope, config.dims.head_dim, device, dtype)
        self.dtype = dtype
        self.device = device

    def hidden(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        *,
        adapter_rows: torch.Tensor | None = None,
        prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        capture: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Final normalised hidden states ``[B, T, hidden]``.

        Args:
            input_ids: ``[B, T]`` token ids.
            position_ids: ``[B, T]`` position ids (rows may share positions, as duplicate masks do).
            mask: ``[B, T, T]`` boolean attention mask (``[B, T, P + T]`` with a ``prefix``); every row must see
                at least one row.
            adapter_rows: ``[B, T]`` rows that get the low-rank adapters, if the network has any.
            prefix: Per layer, keys and values of ``P`` earlier rows (e.g. from ``capture``) to attend to.
            capture: A list that receives each layer's keys and values of the prefix and these rows.
        """
        config: NetworkConfig = self.network.config
        cos, sin = self.rotary(position_ids)
        scale = None
        if config.query_scale_beta:
            scale = llama4_query_scale(position_ids, config.query_scale_beta, config.query_scale_length, self.dtype)
        ctx = ForwardContext(
            cos=cos,
            sin=sin,
            mask=mask,
            query_scale=scale,
            adapter_rows=adapter_rows,
            prefix=prefix,
            capture=capture,
        )
        return self.network.body(input_ids, ctx)

    def logits(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Output logits: ``[B, T, vocab]``, or ``[N, vocab]`` for the ``N`` rows selected by ``rows``.

        Args:
            input_ids: ``[B, T]`` token ids.
            position_ids: ``[B, T]`` position ids.
            mask: ``[B, T, T]`` boolean attention mask.
            rows: Optional ``[B, T]`` boolean selection; the output layer then runs on those rows only.
        """
        hidden = self.hidden(input_ids, position_ids, mask)
        if rows is not None:
            hidden = hidden[rows]
        return self.network.logits(hidden)
