"""The plugin author's test kit, in one package.

- :mod:`specframe.testing.models`: small random checkpoints of both families in the Hub layout
  (:func:`~specframe.testing.models.write_random_checkpoint`, :func:`~specframe.testing.models.small_vocabulary`);
- :mod:`specframe.testing.reference`: the exact plain-AR distribution of short outputs and a goodness-of-fit
  test against it (the sampling half of "lossless"), and a conditional recomputed from scratch;
- :mod:`specframe.testing.any_order`: every accepted token that is not the greedy conditional given what was
  accepted before it (the greedy half, for orders that verify out of textual order);
- :mod:`specframe.testing.plugins`: a plugin registered for a test session, installed like a user's, run in
  a subprocess; :func:`specframe.plugins.plugin_registered` registers one for a ``with`` block.

Every name below is importable from ``specframe.testing`` itself.
"""

from specframe.plugins import plugin_registered
from specframe.testing.any_order import AcceptedCall, OrderViolation, any_order_violations, record_calls
from specframe.testing.models import NEMOTRON, SETDLM, small_vocabulary, write_random_checkpoint
from specframe.testing.plugins import install_distribution, registered_fixture, run_with, torch_threads
from specframe.testing.reference import ar_distribution, conditional_logits, goodness_of_fit

__all__ = [
    "NEMOTRON",
    "SETDLM",
    "AcceptedCall",
    "OrderViolation",
    "any_order_violations",
    "ar_distribution",
    "conditional_logits",
    "goodness_of_fit",
    "install_distribution",
    "plugin_registered",
    "record_calls",
    "registered_fixture",
    "run_with",
    "small_vocabulary",
    "torch_threads",
    "write_random_checkpoint",
]
