"""Reading small device results on the host, many at once, with one synchronisation.

A decoding iteration needs a handful of numbers on the host (how many drafts were accepted, the verifier's
token, the new draft tokens and their scores). On a GPU every separate read waits for the device, so results
are computed on the device, wrapped in a :class:`DeferredRead`, and read together: :func:`read_together`
copies every pending tensor of the objects it is given and waits once. On a CPU a read costs no wait; the
same code path then only saves Python work.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class DeferredRead:
    """Base of results whose host values are read later, possibly together with other results.

    Subclasses hold device tensors in :attr:`_pending` until :meth:`_receive` gets their host values.
    """

    _pending: tuple[torch.Tensor, ...] = ()

    def _receive(self, values: list[list]) -> None:
        """Take the host values (``tensor.tolist()`` of each pending tensor, in order)."""
        raise NotImplementedError

    def _read(self) -> None:
        """Read this object's pending values now (a read on its own: one synchronisation)."""
        read_together(self)


def host_lists(tensors: Sequence[torch.Tensor]) -> list[list]:
    """``[t.tolist() for t in tensors]``, waiting for the device at most once.

    CUDA tensors are copied into host memory asynchronously and the stream is synchronised once; tensors
    already on the CPU are read directly.
    """
    on_device = [t for t in tensors if t.is_cuda]
    if not on_device:
        return [t.tolist() for t in tensors]
    copies = [t.to("cpu", non_blocking=True) if t.is_cuda else t for t in tensors]
    torch.cuda.current_stream(on_device[0].device).synchronize()
    return [c.tolist() for c in copies]


def read_together(*items: DeferredRead | None) -> None:
    """Resolve every given deferred result that is still pending, with one transfer for all of them.

    ``None`` items and items already read are skipped.
    """
    pending = [item for item in items if item is not None and item._pending]
    if not pending:
        return
    tensors = [t for item in pending for t in item._pending]
    values = host_lists(tensors)
    start = 0
    for item in pending:
        count = len(item._pending)
        item._pending = ()
        item._receive(values[start : start + count])
        start += count


class HostCopy(DeferredRead):
    """A device tensor to be read to the host, possibly together with other results.

    Args:
        tensor: The tensor to copy.
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        self._pending = (tensor,)
        self._values: list = []

    def _receive(self, values: list[list]) -> None:
        self._values = values[0]

    @property
    def values(self) -> list:
        """``tensor.tolist()``."""
        if self._pending:
            self._read()
        return self._values
