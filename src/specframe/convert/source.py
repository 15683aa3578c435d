"""What a converter reads out of an AR checkpoint, whatever its format."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from specframe.errors import CheckpointError

#: Architectures a source may have, by transformers' class name, and the family each becomes.
ARCHITECTURES = {
    "LlamaForCausalLM": "nemotron-labs-diffusion",
    "MistralForCausalLM": "nemotron-labs-diffusion",
    "Qwen2ForCausalLM": "nemotron-labs-diffusion",  # with qkv_bias; see specframe.convert
    "Qwen3ForCausalLM": "nemotron-labs-diffusion",  # with qk_norm; see specframe.convert
}


@dataclass
class SourceModel:
    """An AR checkpoint read into transformers' names and conventions.

    Attributes:
        architecture: transformers' class name (a key of :data:`ARCHITECTURES`).
        config: The transformers ``config.json`` fields that describe the network (sizes, RoPE, norms), plus
            ``qkv_bias`` (whether the query, key and value projections have biases, as Qwen2's do).
        tensors: ``{transformers tensor name: loader}``; each loader returns the float tensor in the
            ``[out, in]`` orientation transformers uses (dequantized, un-permuted). Names follow
            ``model.layers.{i}.self_attn.q_proj.weight`` etc.; ``lm_head.weight`` is absent when tied.
        blocks: ``{transformers tensor name: loader}`` of the matrices the source stores in a block format
            specframe's kernels run as they are (GGUF's Q8_0, Q4_0, Q4_1): each loader returns ``(format,
            uint8 blocks)`` with rows in the order of :attr:`tensors` (un-permuted), so that
            ``specframe convert --quant keep`` can write them unchanged.
        tokenizer_json: The tokenizer as a ``tokenizer.json`` document (a dict).
        chat_template: The Jinja chat template, if the source has one.
        special: ``bos_token_id``, ``eos_token_id``, ``pad_token_id``, ``unk_token_id`` where known.
        control_tokens: Ids of control (special) tokens, candidates for the mask token.
        add_bos: Whether the source's tokenizer puts the BOS token before a prompt; the converted model
            prepends it only then (its config.json ``bos_token_id`` is what a model prepends).
        description: Where the model came from, for messages and the written metadata.
    """

    architecture: str
    config: dict[str, Any]
    tensors: dict[str, Callable[[], torch.Tensor]]
    tokenizer_json: dict[str, Any]
    blocks: dict[str, Callable[[], tuple[str, torch.Tensor]]] = field(default_factory=dict)
    chat_template: str | None = None
    special: dict[str, Any] = field(default_factory=dict)
    control_tokens: list[int] = field(default_factory=list)
    add_bos: bool = False
    description: str = ""

    @property
    def family(self) -> str:
        """The specframe family this architecture converts to."""
        return ARCHITECTURES[self.architecture]

    def check_biases(self) -> None:
        """Fail unless a source with q/k/v biases has all three in every layer.

        Raises:
            CheckpointError: Naming the missing bias tensors.
        """
        if not self.config.get("qkv_bias"):
            return
        names = [
            f"model.layers.{layer}.self_attn.{part}_proj.bias"
            for layer in range(self.config["num_hidden_layers"])
            for part in "qkv"
        ]
        missing = [name for name in names if name not in self.tensors]
        if missing:
            listed = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            raise CheckpointError(
                f"{self.description}: a {self.architecture} has query, key and value biases, but tensor(s) {listed} "
                "are missing; the checkpoint is incomplete: download it again"
            )

    def load(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor, one at a time, in name order."""
        for name in self.tensors:
            yield name, self.tensors[name]()
