"""Converting autoregressive checkpoints into specframe model folders (``specframe convert``).

An AR checkpoint (a GGUF file, or a transformers folder or Hub id of a Llama, Mistral, Qwen2/Qwen2.5 or Qwen3
model) is read into a :class:`~specframe.convert.source.SourceModel` and written in a family's Hub layout:

* Llama, Mistral, Qwen2 and Qwen3 -> Nemotron-Labs-Diffusion (the same block, with ``qk_norm`` for Qwen3,
  ``qkv_bias`` for Qwen2, and an untied ``diffusion_head`` that starts as the LM head), so the AR mode is
  exactly the source model.

Qwen3 is not written as SetDLM although SetDLM's backbone is Qwen3: SetDLM verifies with MASK rows at the
target position (no shift), which an AR-trained model never learned, so its output would not be the source
model's. Nemotron verifies with causal next-token rows, which is exactly what an AR model is.

The diffusion mode of a converted model is untrained: its proposals are poor until a drafter adapter is
trained for it (``specframe train-drafter``); the AR output, and so every schedule's output, is the source
model's from the start.
"""

from specframe.convert.source import SourceModel
from specframe.convert.writer import convert

__all__ = ["SourceModel", "convert"]
