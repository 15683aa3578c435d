"""Fixtures of the conversion tests: transformers checkpoints and their conversions, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from convert_helpers import transformers_model, write_transformers_checkpoint

from specframe.convert import convert
from specframe.convert.hf_source import read_transformers

#: Source checkpoints: (architecture, tied embeddings, shard size of the save, config changes). Qwen3's
#: head_dim is not hidden_size / heads, as in the released Qwen3 models.
CHECKPOINTS = {
    "llama": ("LlamaForCausalLM", False, None, {}),
    "llama-tied": ("LlamaForCausalLM", True, None, {}),
    "llama-sharded": ("LlamaForCausalLM", False, "60KB", {}),
    "mistral": ("MistralForCausalLM", False, None, {}),
    "qwen2": ("Qwen2ForCausalLM", False, None, {}),
    "qwen2-tied": ("Qwen2ForCausalLM", True, None, {}),
    "qwen3": ("Qwen3ForCausalLM", False, None, {"head_dim": 32}),
    "qwen3-tied": ("Qwen3ForCausalLM", True, None, {"head_dim": 32}),
}


class Converted:
    """A source transformers model, its checkpoint folder and the converted specframe folder."""

    def __init__(self, name: str, root: Path) -> None:
        architecture, tied, shard, changes = CHECKPOINTS[name]
        self.name, self.tied = name, tied
        self.model = transformers_model(architecture, tied=tied, seed=len(name), **changes)
        self.source = write_transformers_checkpoint(self.model, root / "source", max_shard_size=shard)
        self.folder = convert(read_transformers(self.source), root / "converted", dtype="float32")


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory):
    """``converted(name)``: a :class:`Converted` for a key of :data:`CHECKPOINTS`, built once."""
    cache: dict[str, Converted] = {}

    def get(name: str) -> Converted:
        if name not in cache:
            cache[name] = Converted(name, tmp_path_factory.mktemp(name))
        return cache[name]

    return get
