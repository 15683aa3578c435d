"""Exception types.

Every error that a user can cause (a bad config value, an unknown plugin, a corrupted checkpoint, a prompt
that does not fit) is a :class:`SpecframeError` whose message names what is wrong and what to do. The CLI
prints such errors as one line and exits non-zero.
"""

from __future__ import annotations


class SpecframeError(Exception):
    """Base class of all errors that specframe raises on purpose."""


class ConfigError(SpecframeError, ValueError):
    """A decoder configuration value is missing, of the wrong type or out of range."""


class PluginError(SpecframeError):
    """A plugin could not be found, loaded or registered."""


class UnknownPluginError(PluginError, KeyError):
    """No plugin of the requested kind is registered under the requested name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class DuplicatePluginError(PluginError):
    """Two plugins registered the same name for the same kind."""


class CheckpointError(SpecframeError):
    """A checkpoint folder, its config or its weights are missing, corrupted or do not match the model."""


class UnsafeWeightsError(CheckpointError):
    """A weight file holds pickled Python objects other than tensors, so it was not loaded (for safety)."""


class NonFiniteWeightsError(CheckpointError):
    """A weight holds NaN or infinite values (a damaged file, a diverged training run, or a dtype overflow)."""


class PlanError(SpecframeError):
    """A mask builder cannot express a call plan (for example a non left-to-right order on Nemotron)."""


class InputError(SpecframeError, ValueError):
    """A prompt or request cannot be decoded (empty, too long, unknown token ids, ...)."""


class OutputError(SpecframeError):
    """An output folder or file (``specframe bench --out``, ``specframe convert --out``) cannot be written."""
