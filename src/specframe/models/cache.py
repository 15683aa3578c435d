"""A fixed-capacity key/value cache, written by index, that keeps only the rows a call commits.

The cache holds, per layer, keys (already rotated by their position) and values of accepted tokens, in the
order they were committed. Because every new row may attend to every cached row, the order of cached rows
never matters for attention, so rows verified in any order can be committed as they are accepted.

A forward pass writes the keys and values of its new rows into a staging area directly after the committed
rows (so attention reads one contiguous slice); :meth:`KVCache.commit` then keeps the chosen staged rows
and drops the rest. Rejected rows are simply overwritten by the next call: rollback costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specframe.errors import InputError


class KVCache:
    """Per-request key/value storage for all layers of one model.

    Args:
        num_layers: Number of transformer layers.
        num_kv_heads: Key/value heads per layer.
        head_dim: Size of one head.
        capacity: Rows it holds: committed tokens plus the largest call's staging rows (the decoder sizes it
            from the prompt, the output budget and the mask builder's largest call). A call that does not fit
            is refused.
        dtype: Storage dtype.
        device: Storage device.
    """

    #: Whether the rows live in a shared pool's blocks (:class:`~specframe.models.paged.PagedKVCache`).
    paged = False

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"KV cache capacity must be >= 1, got {capacity}")
        shape = (num_layers, capacity, num_kv_heads, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        self.staged = 0
        self.positions: list[int] = []

    @property
    def capacity(self) -> int:
        """Rows the buffer holds."""
        return int(self.keys.shape[1])

    @property
    def num_layers(self) -> int:
        """Number of layers stored."""
        return int(self.keys.shape[0])

    def reserve(self, rows: int) -> None:
        """Stage ``rows`` new rows after the committed ones (the rows a call writes at ``length ..``).

        Raises:
            InputError: If the rows do not fit in the capacity.
        """
        if self.length + rows > self.capacity:
            raise InputError(
                f"a call of {rows} rows does not fit in the KV cache ({self.length} of {self.capacity} rows "
                "committed); create the cache with room for the prompt, the output and the largest call "
                "(model.new_cache(capacity))"
            )
        self.staged = rows

    def staged_rows(self) -> tuple[slice, None]:
        """Where a forward writes the staged rows, and how attention finds the span's rows.

        A slice of the buffer, and ``None``: rows ``0 .. length + staged`` in place (a paged cache gives a row map).
        """
        return slice(self.length, self.length + self.staged), None

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage the new rows of ``layer`` and return keys and values of cached + staged rows.

        Args:
            layer: Layer index.
            keys: ``[R, kv_heads, head_dim]`` rotated keys of the new rows.
            values: ``[R, kv_heads, head_dim]`` values of the new rows.

        Returns:
            Keys and values ``[length + R, kv_heads, head_dim]`` (views into the buffer).
        """
        rows = keys.shape[0]
        if rows != self.staged:
            raise RuntimeError(f"call reserve({rows}) before writing {rows} rows (reserved {self.staged})")
        end = self.length + rows
        self.keys[layer, self.length : end] = keys
        self.values[layer, self.length : end] = values
        return self.keys[layer, :end], self.values[layer, :end]

    def commit(self, rows: Sequence[int], positions: Sequence[int] | None = None) -> None:
        """Keep the staged rows ``rows`` (indices into the last call's new rows), in the given order.

        Args:
            rows: Staged row indices to keep.
            positions: Their position ids, recorded for inspection; optional.
        """
        if not rows:
            return
        if max(rows) >= self.staged or min(rows) < 0:
            raise IndexError(f"commit rows {list(rows)} outside the {self.staged} staged rows")
        count = len(rows)
        if list(rows) != list(range(count)):  # the leading staged rows already sit where they are kept
            self._move(torch.as_tensor(list(rows), device=self.keys.device) + self.length, self.length)
        self.length += count
        self.staged = 0
        if positions is not None:
            self.positions.extend(map(int, positions))

    def drop_positions(self, positions: set[int]) -> None:
        """Remove committed rows whose recorded position is in ``positions`` (keeps the others' order).

        Any-order decoding needs this when an EOS accepted late ends the output before tokens that were
        already cached.
        """
        keep = [i for i, p in enumerate(self.positions) if p not in positions]
        if len(keep) == self.length:
            return
        self._move(torch.as_tensor(keep, dtype=torch.long, device=self.keys.device), 0)
        self.positions = [self.positions[i] for i in keep]
        self.length = len(keep)

    def _move(self, source: torch.Tensor, start: int) -> None:
        """Copy the rows ``source`` to rows ``start ..`` in every layer (all read before any is written)."""
        end = start + source.shape[0]
        self.keys[:, start:end] = self.keys.index_select(1, source)
        self.values[:, start:end] = self.values.index_select(1, source)
