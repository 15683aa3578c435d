"""The model zoo: shared layers, the Nemotron-Labs-Diffusion and SetDLM families, and checkpoint loading.

Load a model with :func:`load_model`; every family implements :class:`ModelBackend`::

    from specframe.models import ModelCall, load_model

    model = load_model("nvidia/Nemotron-Labs-Diffusion-8B", device="cuda")
    cache = model.new_cache(4096)
    logits = model.forward(cache, ModelCall(input_ids, position_ids, attention))
"""

from specframe.models.base import ModelBackend, ModelCall, TextTokenizer
from specframe.models.cache import KVCache
from specframe.models.loading import load_model
from specframe.models.tokenizer import HubTokenizer

__all__ = ["HubTokenizer", "KVCache", "ModelBackend", "ModelCall", "TextTokenizer", "load_model"]
