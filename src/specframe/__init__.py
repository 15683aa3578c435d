"""specframe: lossless self-speculative decoding for models with an AR and a diffusion mode in one network.

The public API::

    from specframe import compose
    decoder = compose({"schedule": "packed", "width": 8})
    result = decoder.generate("def fib(n):")
    print(result.text, result.metrics.tokens_per_nfe)
"""

from specframe.config import DecoderConfig, compose
from specframe.decoder import Decoder, Generation, StreamPiece
from specframe.errors import (
    CheckpointError,
    ConfigError,
    DuplicatePluginError,
    InputError,
    OutputError,
    PlanError,
    PluginError,
    SpecframeError,
    UnknownPluginError,
    UnsafeWeightsError,
)
from specframe.hookspecs import hookimpl
from specframe.metrics import Metrics

__version__ = "0.1.0"


def load_model(*args, **kwargs):
    """Load a model backend; see :func:`specframe.models.load_model`."""
    from specframe.models import load_model as _load_model

    return _load_model(*args, **kwargs)


__all__ = [
    "CheckpointError",
    "ConfigError",
    "Decoder",
    "DecoderConfig",
    "DuplicatePluginError",
    "Generation",
    "InputError",
    "Metrics",
    "OutputError",
    "PlanError",
    "PluginError",
    "SpecframeError",
    "StreamPiece",
    "UnknownPluginError",
    "UnsafeWeightsError",
    "__version__",
    "compose",
    "hookimpl",
    "load_model",
]
