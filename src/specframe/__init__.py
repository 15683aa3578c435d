"""specframe: lossless self-speculative decoding for models with an AR and a diffusion mode in one network."""

from specframe.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
