"""A deterministic model built to satisfy the paper's monotonicity assumption (Assumption 3.1).

It is a real :class:`~specframe.models.base.ModelBackend` with Nemotron's conventions (a causal row at
position ``i`` predicts position ``i + 1``; a MASK row at ``i`` predicts ``i``), so it runs through the real
Nemotron mask builder, schedules and decoder loop. Its greedy continuation is a fixed sequence ``X``; its
drafter predicts output position ``k`` correctly exactly when the verified context it reads holds at least
``c*_k`` output tokens, which is Assumption 3.1 with thresholds ``c*_k <= k``.

The keys it caches encode (position, token), so a row's visible context can be read back from the cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specframe.models.base import ModelBackend, ModelCall
from specframe.models.cache import KVCache
from specframe.models.layers import ForwardContext, RotaryEmbedding, llama4_query_scale


class MonotoneOracle(ModelBackend):
    """Greedy continuation ``continuation``; drafter correct at output k iff context >= ``thresholds[k-1]``.

    Args:
        prompt_length: Length of the prompts it will be used with (output position 1 is this position).
        continuation: The verifier's greedy continuation ``x_1, x_2, ...`` (ids in ``[0, vocab - 1)``).
        thresholds: ``c*_k`` for ``k = 1 .. len(continuation)``, each in ``[0, k]``.
        vocab_size: Vocabulary size; the last id is the mask token.
    """

    num_parameters = 1_000  # a scripted stand-in: the thread policy gives it one thread

    family = "nemotron-labs-diffusion"

    def __init__(self, prompt_length: int, continuation: Sequence[int], thresholds: Sequence[int], vocab_size: int):
        assert all(0 <= c <= k + 1 for k, c in enumerate(thresholds))
        self.start = prompt_length
        self.continuation = list(continuation)
        self.thresholds = list(thresholds)
        self.name = "monotone-oracle"
        self.vocab_size = vocab_size
        self.mask_token_id = vocab_size - 1
        self.eos_token_ids = ()
        self.max_positions = 1 << 20
        self.num_layers, self.num_kv_heads, self.head_dim = 1, 1, 2
        self.dtype = torch.float64

    def forward(self, cache: KVCache, call: ModelCall):
        input_ids, position_ids, attention = call.input_ids, call.position_ids, call.attention
        output_rows = call.output_rows
        rows = input_ids.shape[0]
        cached_positions = [p for p, _ in stage_pairs(cache, input_ids, position_ids)]
        logits = torch.zeros(rows, self.vocab_size, dtype=torch.float64)
        for row in range(rows):
            position = int(position_ids[row])
            if int(input_ids[row]) != self.mask_token_id:
                logits[row, self._true(position + 1)] = 1.0
                continue
            visible = [
                int(position_ids[j])
                for j in range(rows)
                if attention[row, j] and int(input_ids[j]) != self.mask_token_id
            ]
            context = max([*cached_positions, *visible], default=-1) - self.start + 1
            k = position - self.start + 1
            correct = k >= 1 and context >= self.thresholds[k - 1]
            token = self._true(position) if correct else (self._true(position) + 1) % (self.vocab_size - 1)
            logits[row, token] = 1.0
        return logits if output_rows is None else logits[output_rows]

    def _true(self, position: int) -> int:
        k = position - self.start + 1
        return self.continuation[k - 1] if 1 <= k <= len(self.continuation) else 0


def stage_pairs(cache: KVCache, input_ids: torch.Tensor, position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """Stage a call's rows with keys that encode ``(position, token)``; return the cached rows' pairs.

    For test backends with one layer, one head and ``head_dim`` 2: what a row sees is then read back from the
    cache instead of being computed.
    """
    rows = input_ids.shape[0]
    cache.reserve(rows)
    code = torch.stack([position_ids, input_ids], -1).to(torch.float64).view(rows, 1, 2)
    keys, _ = cache.write(0, code, code)
    return [(int(p), int(t)) for p, t in keys[: cache.length, 0].long().tolist()]


def network_logits(
    model, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, adapter_rows: torch.Tensor | None = None
) -> torch.Tensor:
    """The reference forward: logits of a transformer backend's network over one sequence of rows, no cache.

    Runs the network's own modules (:mod:`specframe.models.layers`), one operation per checkpoint tensor, as
    training does: an oracle for the inference forward of :mod:`specframe.models.forward`, which shares none of
    its code. ``mask`` is ``[R, R]`` (True = may attend).
    """
    config = model.network.config
    device = next(model.network.parameters()).device
    rotary = RotaryEmbedding(config.rope, config.dims.head_dim, device, model.dtype)
    cos, sin = rotary(positions[None])
    scale = None
    if config.query_scale_beta:
        scale = llama4_query_scale(positions[None], config.query_scale_beta, config.query_scale_length, model.dtype)
    adapter = None if adapter_rows is None or not model.has_adapter else adapter_rows[None]
    ctx = ForwardContext(cos=cos, sin=sin, mask=mask[None], query_scale=scale, adapter_rows=adapter)
    with torch.no_grad():
        hidden = model.network.body(ids[None], ctx)[0]
        return model.finish_logits(model.network.logits(hidden))
