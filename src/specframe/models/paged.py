"""A paged key/value cache: fixed-size blocks from one pool, a block table per request, attention in place.

A :class:`BlockPool` holds every layer's keys and values for ``blocks x block_size`` rows, once, and a free
list of blocks. A request's :class:`PagedKVCache` holds a *block table*: the pool blocks its rows live in, in
order, so that its logical row ``i`` is pool row ``table[i // block_size] * block_size + i % block_size``.
It behaves as :class:`~specframe.models.cache.KVCache` does (rows staged after the committed ones, a commit
keeps the chosen ones), and the forward reads its rows where they are: the invariant attention kernel takes
the row map (``specframe_kernels::attention(..., rows)``), and reduces over the keys in the same order as
from a contiguous cache, so a request's logits are bitwise those of a contiguous cache. (Torch's attention,
the fallback without specframe's kernels, gathers the rows first.)

A request's blocks are taken from the free list when its cache is made, for its whole budget (prompt,
output and the largest call's staging rows), and given back when it leaves: the engine admits a request
only when its blocks are free (:meth:`BlockPool.fits`), so a request admitted never runs out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specframe.errors import InputError
from specframe.models.cache import KVCache


class BlockPool:
    """Every layer's keys and values in ``blocks`` blocks of ``block_size`` rows, and their free list.

    Args:
        num_layers: Number of transformer layers.
        num_kv_heads: Key/value heads per layer.
        head_dim: Size of one head.
        blocks: Blocks in the pool (>= 1).
        block_size: Rows per block (>= 1).
        dtype: Storage dtype.
        device: Storage device.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        for name, value in (("blocks", blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"a block pool's {name} must be an integer >= 1, got {value!r}")
        shape = (num_layers, blocks * block_size, num_kv_heads, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self._free = list(range(blocks - 1, -1, -1))  # popped from the end: low blocks first

    @classmethod
    def for_model(cls, model: object, blocks: int, block_size: int = 16) -> BlockPool:
        """A pool shaped for ``model``'s caches (its layers, heads, dtype and device)."""
        probe = model.new_cache(1)  # type: ignore[attr-defined]
        _, _, kv, dim = probe.keys.shape
        return cls(probe.num_layers, kv, dim, blocks, block_size, probe.keys.dtype, probe.keys.device)

    @property
    def blocks(self) -> int:
        """Blocks in the pool."""
        return int(self.keys.shape[1]) // self.block_size

    @property
    def free_blocks(self) -> int:
        """Blocks no request holds."""
        return len(self._free)

    def blocks_for(self, capacity: int) -> int:
        """Blocks a cache of ``capacity`` rows takes."""
        return -(-capacity // self.block_size)

    def fits(self, capacity: int) -> bool:
        """Whether a cache of ``capacity`` rows can be made now."""
        return self.blocks_for(capacity) <= len(self._free)

    def require(self, capacity: int, *, taken: int = 0) -> None:
        """Check that a cache of ``capacity`` rows can be made now, ``taken`` of the free blocks being promised.

        Raises:
            InputError: If the pool could never hold it, or has too few free blocks now.
        """
        needed = self.blocks_for(capacity)
        if needed > self.blocks:
            raise InputError(
                f"a request needing {capacity} KV rows ({needed} blocks of {self.block_size}) can never fit this "
                f"pool of {self.blocks} blocks; give the pool more blocks or the request fewer tokens"
            )
        if needed + taken > len(self._free):
            raise InputError(
                f"the KV block pool has {len(self._free) - taken} free blocks and this request needs {needed}; "
                "admit it once other requests have left (BlockPool.fits says when)"
            )

    def new_cache(self, capacity: int) -> PagedKVCache:
        """A request's cache of ``capacity`` rows, its blocks taken from the free list.

        Raises:
            InputError: If the pool could never hold it, or has too few free blocks now.
        """
        self.require(capacity)
        needed = self.blocks_for(capacity)
        table = [self._free.pop() for _ in range(needed)]
        return PagedKVCache(self, table, capacity)

    def release(self, cache: PagedKVCache) -> None:
        """Give a cache's blocks back (once; later calls do nothing)."""
        if cache.table:
            self._free.extend(reversed(cache.table))
            cache.table = []


class PagedKVCache(KVCache):
    """One request's rows in a :class:`BlockPool`'s blocks, with the interface of a contiguous cache.

    Made by :meth:`BlockPool.new_cache`. ``keys``/``values`` are the pool's buffers; :attr:`rows` maps each
    logical row to its pool row, and every row a :class:`~specframe.models.cache.KVCache` method names is a
    logical row.
    """

    #: Whether the rows live in a shared pool's blocks (the compiled path runs such a cache's calls eagerly).
    paged = True

    def __init__(self, pool: BlockPool, table: Sequence[int], capacity: int) -> None:
        self.pool, self.table = pool, list(table)
        self.keys, self.values = pool.keys, pool.values
        size = pool.block_size
        blocks = torch.as_tensor(self.table, dtype=torch.long, device=pool.keys.device)
        offsets = torch.arange(size, dtype=torch.long, device=pool.keys.device)
        #: The pool row of each logical row ``0 .. capacity - 1``.
        self.rows = (blocks[:, None] * size + offsets).reshape(-1)[:capacity]
        self.length = 0
        self.staged = 0
        self.positions: list[int] = []

    @property
    def capacity(self) -> int:
        """Rows the cache holds."""
        return int(self.rows.shape[0])

    def reserve(self, rows: int) -> None:
        """Stage ``rows`` new rows after the committed ones.

        Raises:
            InputError: If the rows do not fit in the capacity.
            RuntimeError: If the cache's blocks were given back.
        """
        if not self.table:
            raise RuntimeError("this paged cache's blocks were given back to the pool; its request has ended")
        super().reserve(rows)

    def staged_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The pool rows the staged rows are written to, and the span's pool rows, in order.

        As :data:`~specframe.models.forward.Segment` takes them: attention reads the span's rows in place.
        """
        return self.slots(), self.key_rows()

    def slots(self) -> torch.Tensor:
        """The pool rows of the staged rows (where a forward writes their keys and values)."""
        return self.rows[self.length : self.length + self.staged]

    def key_rows(self) -> torch.Tensor:
        """The pool rows of the committed and staged rows, in order (what attention reads)."""
        return self.rows[: self.length + self.staged]

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage the new rows of ``layer``; return keys and values of cached + staged rows (gathered copies)."""
        if keys.shape[0] != self.staged:
            raise RuntimeError(f"call reserve({keys.shape[0]}) before writing {keys.shape[0]} rows")
        slots = self.slots()
        self.keys[layer, slots] = keys
        self.values[layer, slots] = values
        rows = self.key_rows()
        return self.keys[layer].index_select(0, rows), self.values[layer].index_select(0, rows)

    def _move(self, source: torch.Tensor, start: int) -> None:
        """Copy logical rows ``source`` to logical rows ``start ..``, through the block table."""
        pool_source, target = self.rows[source], self.rows[start : start + source.shape[0]]
        self.keys[:, target] = self.keys.index_select(1, pool_source)
        self.values[:, target] = self.values.index_select(1, pool_source)
