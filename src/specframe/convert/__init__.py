"""Converting autoregressive checkpoints into specframe model folders (``specframe convert``).

An AR checkpoint (a GGUF file, or a transformers folder or Hub id of a Llama, Mistral or Qwen3 model) is read
into a :class:`~specframe.convert.source.SourceModel` and written in a family's Hub layout:

* Llama / Mistral -> Nemotron-Labs-Diffusion (same block, an untied ``diffusion_head`` that starts as the LM
  head, so the AR mode is exactly the source model);
* Qwen3 -> SetDLM (its backbone is Qwen3).

The diffusion mode of a converted model is untrained: its proposals are poor until a drafter adapter is
trained for it (``specframe train-drafter``); the AR output, and so every schedule's output, is the source
model's from the start.
"""

from specframe.convert.source import SourceModel
from specframe.convert.writer import convert

__all__ = ["SourceModel", "convert"]
