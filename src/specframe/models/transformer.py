"""The decoder network both families share, and the :class:`ModelBackend` that evaluates calls with it.

A family contributes a :class:`NetworkConfig` (sizes, RoPE, Qwen3 qk-norm, tied head, Llama-4 query
scaling), its checkpoint :class:`~specframe.models.weights.KeyLayout` and its special tokens; everything else,
from building the module on the meta device to validating a call's inputs, lives here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specframe import kernels
from specframe.errors import InputError
from specframe.models import cpu
from specframe.models.base import ModelBackend, ModelCall, TextTokenizer, check_call
from specframe.models.cache import KVCache
from specframe.models.compiled import CompiledPath
from specframe.models.config_json import DecoderDims
from specframe.models.forward import Forward
from specframe.models.layers import DecoderLayer, ForwardContext, RMSNorm, RopeSpec, RotaryEmbedding
from specframe.models.loading import Checkpoint
from specframe.models.weights import KeyLayout, TensorSource, load_state, open_weights


@dataclass(frozen=True)
class NetworkConfig:
    """Everything that shapes the network.

    Attributes:
        dims: Sizes read from ``config.json``.
        rope: Rotary-embedding settings.
        qk_norm: Per-head RMSNorm of queries and keys before RoPE (Qwen3).
        qkv_bias: Biases on the query, key and value projections (Qwen2).
        tie_embeddings: The output layer reuses the input embedding.
        query_scale_beta: Llama-4 query scaling strength (0 disables it).
        query_scale_length: Positions per Llama-4 scaling step (``original_max_position_embeddings``).
    """

    dims: DecoderDims
    rope: RopeSpec
    qk_norm: bool = False
    qkv_bias: bool = False
    tie_embeddings: bool = False
    query_scale_beta: float = 0.0
    query_scale_length: int = 1


@dataclass(frozen=True)
class SpecialTokens:
    """Special token ids of a model.

    Attributes:
        mask: Id of the mask (diffusion query) token.
        eos: Ids that end generation.
        bos: Id prepended to prompts, if the family does so.
        pad: Padding id, if any.
    """

    mask: int
    eos: tuple[int, ...] = ()
    bos: int | None = None
    pad: int | None = None


class DecoderStack(nn.Module):
    """Token embedding, transformer blocks and final norm (Llama / Mistral / Qwen3 naming)."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        d = config.dims
        self.embed_tokens = nn.Embedding(d.vocab_size, d.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(
                d.hidden_size,
                d.intermediate_size,
                d.num_heads,
                d.num_kv_heads,
                d.head_dim,
                d.rms_norm_eps,
                config.qk_norm,
                config.qkv_bias,
            )
            for _ in range(d.num_layers)
        )
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Normalised final hidden states ``[B, T, hidden]`` of batched rows (training's forward, and the tests').

        Inference runs :mod:`specframe.models.forward` over the same parameters.
        """
        x = self.embed_tokens(input_ids)
        for index, layer in enumerate(self.layers):
            x = layer(x, ctx, index)
        return self.norm(x)


class DecoderNetwork(nn.Module):
    """The decoder stack plus its output layer (``head``; absent when tied to the embedding)."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        self.config = config
        self.body = DecoderStack(config)
        d = config.dims
        self.head = None if config.tie_embeddings else nn.Linear(d.hidden_size, d.vocab_size, bias=False)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output-layer logits of final hidden states."""
        weight = self.body.embed_tokens.weight if self.head is None else self.head.weight
        return F.linear(hidden, weight)


def build_network(
    config: NetworkConfig, source: TensorSource, layout: KeyLayout, checkpoint: Checkpoint
) -> DecoderNetwork:
    """Build the network on the meta device and fill it from ``source`` (allocating each weight once)."""
    with torch.device("meta"):
        network = DecoderNetwork(config)
    load_state(network, source, layout, device=checkpoint.device, dtype=checkpoint.dtype, where=checkpoint.where)
    return network.eval()


class DecoderBackend(ModelBackend):
    """A :class:`ModelBackend` over a :class:`DecoderNetwork`.

    Families subclass it to set :attr:`family`, to read their checkpoints (:meth:`read_checkpoint` and
    :meth:`key_layout`, which :meth:`from_checkpoint` uses) and, where needed, to adjust logits
    (:meth:`finish_logits`).

    Args:
        network: The loaded network.
        special: Special token ids.
        tokenizer: The checkpoint's tokenizer, if any.
        checkpoint: Where the model came from, and the device and dtype its weights were loaded to.

    Attributes:
        check_inputs: Validate token and position ids on every call (one host sync per call, skipped for calls
            marked ``checked``); benchmarks that trust their mask builder may turn it off.
        pad_token_id: Padding id, if the checkpoint names one.
        num_parameters: Parameters of the network (for the thread policy of :mod:`specframe.models.threads`).
        threads: Thread count chosen for this model when a decoder was composed on it (``None`` before).
        path: ``"eager"`` (the default) or ``"compiled"`` (one graph for every row count,
            :mod:`specframe.models.compiled`; set by :meth:`enable_compiled`); both run
            :mod:`specframe.models.forward`.
        cpu_tuning: Whether the CPU tuning of :mod:`specframe.models.cpu` applies (the ``SPECFRAME_CPU_TUNING``
            environment switch when loaded, on unless set to 0; :meth:`set_cpu_tuning` changes it).
    """

    def __init__(
        self,
        network: DecoderNetwork,
        special: SpecialTokens,
        tokenizer: TextTokenizer | None,
        checkpoint: Checkpoint,
    ) -> None:
        d = network.config.dims
        self.network = network
        self.config = network.config
        self.name = checkpoint.name
        self.vocab_size = d.vocab_size
        self.mask_token_id = special.mask
        self.eos_token_ids = special.eos
        self.bos_token_id = special.bos
        self.pad_token_id = special.pad
        self.max_positions = d.max_positions - 1
        self.num_layers = d.num_layers
        self.num_kv_heads = d.num_kv_heads
        self.head_dim = d.head_dim
        self.tokenizer = tokenizer
        self.has_adapter = False
        self.device = checkpoint.device
        self.dtype = checkpoint.dtype
        self.check_inputs = True
        self.rotary = RotaryEmbedding(network.config.rope, d.head_dim, self.device, self.dtype)
        self.path = "eager"
        self.num_parameters = sum(p.numel() for p in network.parameters())
        self.threads: int | None = None
        self.cpu_tuning = cpu.enabled(checkpoint.cpu_tuning)
        self.quant = checkpoint.quant
        scaling = (network.config.query_scale_beta, network.config.query_scale_length)
        kernel = cpu.kernel(network, self.device, self.dtype, tuned=self.cpu_tuning, quant=self.quant)
        self.inference = Forward(network, self.rotary, scaling, kernel)
        self.compiled: CompiledPath | None = None

    def set_cpu_tuning(self, enabled: bool) -> None:
        """Turn the CPU tuning of :mod:`specframe.models.cpu` on or off (the weights' kernels are rebuilt)."""
        self.cpu_tuning = bool(enabled)
        self.inference.kernel = cpu.kernel(
            self.network, self.device, self.dtype, tuned=self.cpu_tuning, quant=self.quant
        )
        self.inference.refresh()
        if self.compiled is not None:
            self.compiled = CompiledPath(self.inference, self.device, self.compiled.backend, tuned=self.cpu_tuning)

    def kernel_report(self) -> dict[str, Any]:
        """Which kernels run this model's calls, and whether outputs are guaranteed invariant to row counts.

        ``{"kernels": "specframe avx512+vnni" | "torch", "invariant": bool, "weights": [formats], "note": str}``,
        with specframe's kernels also ``"build"``, the digest of their build (:func:`specframe.kernels.build_id`),
        and ``"parallel"``, false where they were built without OpenMP and run on one thread:
        with specframe's kernels every row's logits are bitwise what a one-row call gives it (so speculative
        outputs equal AR's in any dtype); torch's kernels round calls of different sizes differently.
        """
        w = self.inference.weights
        projections = [getattr(layer, n) for layer in w.layers for n in ("qkv", "o", "gate_up", "down")] + [w.head]
        formats = sorted({getattr(p, "format", str(self.dtype).removeprefix("torch.")) for p in projections})
        if w.invariant:
            note = "each row reduces alone: speculative outputs are AR's bitwise"
            one_thread = kernels.one_thread_reason()
            if one_thread is not None:
                note += f"; the kernels were {one_thread}"
            report = {"kernels": f"specframe {kernels.variant()}", "invariant": True, "weights": formats, "note": note}
            return {**report, "build": kernels.build_id(), "parallel": one_thread is None}
        if not self.cpu_tuning:
            why = "CPU tuning is off"
        elif self.device.type != "cpu" or self.dtype not in (torch.float32, torch.bfloat16):
            why = f"specframe's kernels run float32 and bfloat16 on the CPU, not {self.dtype} on {self.device}"
        else:
            why = kernels.unavailable_reason() or f"{kernels.SWITCH}=0"
        note = f"torch's kernels ({why}): calls of different row counts round differently"
        return {"kernels": "torch", "invariant": False, "weights": formats, "note": note}

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary (see :meth:`ModelBackend.describe`) with the :meth:`kernel_report`."""
        return {**super().describe(), "kernels": self.kernel_report()}

    def enable_compiled(self, backend: str = "inductor") -> None:
        """Run steady-state calls as one compiled graph from now on (see :mod:`specframe.models.compiled`).

        Args:
            backend: The ``torch.compile`` backend.

        Raises:
            ConfigError: If ``torch.compile`` cannot run on this device (no C++ compiler on the CPU, ...).
        """
        if self.compiled is None or self.compiled.backend != backend:
            self.compiled = CompiledPath(self.inference, self.device, backend, tuned=self.cpu_tuning)
        self.path = "compiled"

    def new_cache(self, capacity: int) -> KVCache:
        """An empty cache for ``capacity`` rows (on the compiled path: a fixed, rounded-up, zero-filled one)."""
        if self.path == "compiled" and self.compiled is not None:
            return self.compiled.new_cache(self.num_layers, self.num_kv_heads, self.head_dim, capacity)
        return super().new_cache(capacity)

    @classmethod
    def read_checkpoint(cls, ckpt: Checkpoint) -> tuple[NetworkConfig, SpecialTokens, TextTokenizer | None]:
        """The network settings, special ids and tokenizer of a checkpoint (each family reads its own).

        Raises:
            CheckpointError: If config.json or the tokenizer is malformed.
        """
        raise NotImplementedError(f"{cls.__name__} does not read checkpoints")

    @classmethod
    def key_layout(cls, tensors: TensorSource, config: NetworkConfig, where: str) -> KeyLayout:
        """How this checkpoint's tensor names map to the network's parameter names."""
        raise NotImplementedError(f"{cls.__name__} has no checkpoint key layout")

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint) -> DecoderBackend:
        """Load a located checkpoint: read it, then build the network from its weights on the target device.

        Raises:
            CheckpointError: If the checkpoint is malformed, or its weights do not match its config.
        """
        config, special, tokenizer = cls.read_checkpoint(ckpt)
        with open_weights(ckpt.folder) as tensors:
            network = build_network(config, tensors, cls.key_layout(tensors, config, ckpt.where), ckpt)
        return cls(network, special, tokenizer, ckpt)

    @torch.no_grad()
    def forward(self, cache: KVCache, call: ModelCall) -> torch.Tensor:
        """Evaluate a call (see :meth:`ModelBackend.forward`) on the model's :attr:`path`.

        Logits are returned in float32 for half-precision models and in the model's dtype otherwise.

        Raises:
            InputError: If shapes disagree, a token id is outside the vocabulary, a position id is beyond
                the model's context, the cache does not belong to this model or the call does not fit in it.
        """
        check_call(self, cache, call, values=self.check_inputs)
        if self.path == "compiled" and self.compiled is not None:
            return self._finish(self.compiled.logits(cache, call))
        return self._finish(self.inference.run([(cache, call)])[0])

    @torch.no_grad()
    def forward_many(self, batch: Sequence[tuple[KVCache, ModelCall]]) -> list[torch.Tensor]:
        """Evaluate several requests' calls in one pass (see :meth:`ModelBackend.forward_many`).

        The embedding, every projection, the MLP and the output layer run once over all calls' rows
        concatenated; attention runs over each request's own cache, alike requests padded into one kernel
        (:class:`~specframe.models.forward.Padded`). Each item's logits equal :meth:`forward` of that item alone
        up to rounding (1e-12 in float64: kernels chosen by the total row count round differently). On the
        compiled path the batch runs eagerly.

        Raises:
            InputError: As :meth:`forward`, naming the item; or if a cache appears twice.
        """
        if len({id(cache) for cache, _ in batch}) != len(batch):
            raise InputError("forward_many got the same cache twice; each request needs its own cache")
        for index, (cache, call) in enumerate(batch):
            try:
                check_call(self, cache, call, values=self.check_inputs)
            except InputError as error:
                raise InputError(f"batch item {index}: {error}") from None
        if not batch:
            return []
        return [self._finish(logits) for logits in self.inference.run(batch)]

    def _finish(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return self.finish_logits(logits)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Family-specific adjustment of returned logits (identity by default)."""
        return logits
