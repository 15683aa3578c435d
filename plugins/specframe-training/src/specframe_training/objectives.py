"""Training objectives of the two families, as batches of rows with an attention mask and per-row targets.

Both objectives lay a window of ``T`` clean tokens out twice, ``[clean x T | query x T]``, with the same
position ids in both halves; clean rows never see query rows, so the clean half is an ordinary causal (or
any-order causal) pass and the query half reads it like a KV cache, as the decoders do at inference.

**Nemotron-Labs-Diffusion** (:class:`BlockDiffusionObjective`): the joint objective of its recipe. Clean rows
are causal and carry the next-token (AR) loss. The query half is the window cut into contiguous blocks of
random lengths at a random phase; a block's rows attend bidirectionally within the block and to the clean
rows before the block, and its masked rows carry the diffusion loss (a MASK row predicts its own position's
token). The first token of a block, the *seed*, is usually kept clean and the other slots are often all
masked, which is the drafting block ``[last accepted token, MASK x W]`` of Linear-SS and Packed-SS; blocks
whose seed is masked too are the seedless blocks of the first call (``MASK x (W + 1)`` after the prompt) and
of Quadratic-SS groups, and partly masked blocks are the steps of the native block decoder.

**SetDLM** (:class:`AnyOrderObjective`): any-order autoregression over staggered orders with duplicate
masks. Each window draws a generation order that is left to right up to local shuffling over ``span``
positions (sort ``i + span * u_i``, ``u_i`` uniform); some windows are exactly left to right. A clean row sees
the clean rows not later in the order; the mask row of the token at rank ``r`` sees itself and the clean rows
at ranks ``< r - lag``. ``lag = 0`` is SetDLM's training construction and its verifier queries (``M``);
``lag > 0`` teaches the proposal queries (``R``), which see only the verified prefix while predicting up to
``W`` ranks ahead of it. Every mask row carries a loss against its own token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

IGNORE = -100


def _check_int(name: str, value: Any, floor: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < floor:
        raise ValueError(f"objective.{name} must be an integer >= {floor}, got {value!r}")


def _check_number(name: str, value: Any, high: float = math.inf) -> None:
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not number or not 0 <= value <= high:
        expected = "between 0 and 1" if high == 1 else "a finite number >= 0"
        raise ValueError(f"objective.{name} must be {expected}, got {value!r}")


@dataclass
class Batch:
    """Rows of a training step.

    Attributes:
        input_ids: ``[B, R]`` token ids.
        position_ids: ``[B, R]`` position ids.
        mask: ``[B, R, R]`` boolean attention mask.
        targets: ``[B, R]`` target ids (:data:`IGNORE` for rows without a loss).
        kinds: ``[B, R]`` index into ``kind_names`` of each row's loss (rows without a loss: any value).
        kind_names: Names of the loss terms, e.g. ``("ar", "diffusion")``.
        weights: Weight of each loss term in the total.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor
    targets: torch.Tensor
    kinds: torch.Tensor
    kind_names: tuple[str, ...]
    weights: tuple[float, ...]

    @property
    def loss_rows(self) -> torch.Tensor:
        """``[B, R]`` rows that carry a loss."""
        return self.targets != IGNORE


def batch_losses(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted total loss and each term's mean, from the logits of :attr:`Batch.loss_rows` (``[N, V]``)."""
    rows = batch.loss_rows
    per_row = F.cross_entropy(logits.float(), batch.targets[rows], reduction="none")
    kinds = batch.kinds[rows]
    total = per_row.new_zeros(())
    terms = {}
    for index, (name, weight) in enumerate(zip(batch.kind_names, batch.weights, strict=True)):
        selected = kinds == index
        if selected.any():
            term = per_row[selected].mean()
            total = total + weight * term
            terms[name] = float(term.detach())
    return total, terms


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """``[T, T]`` lower-triangular boolean mask: row ``i`` may attend to rows ``0..i``."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


@dataclass(frozen=True)
class BlockDiffusionObjective:
    """Nemotron-Labs-Diffusion's joint objective: next-token loss plus block-diffusion loss.

    Attributes:
        mask_id: The mask token.
        min_block: Shortest block (seed included).
        max_block: Longest block (seed included); inference blocks have ``W + 1`` positions.
        seed_prob: Chance a block's first token stays clean (the drafting seed).
        full_mask_prob: Chance every non-seed slot of a block is masked (otherwise each slot is masked with
            a probability drawn uniformly per block, at least one slot masked).
        diffusion_weight: Weight of the diffusion term (the AR term has weight 1).
        repeat_prob: Chance a window turns, after a natural prefix, into a loop that repeats the prefix's last
            ``period`` tokens. Only the diffusion rows learn from the loop (its next-token targets are ignored),
            so the drafter learns to continue repeated text at every block offset while the AR mode, the
            verifier, is trained on real code only.
        max_period: Longest loop period, in tokens.
    """

    mask_id: int
    min_block: int = 2
    max_block: int = 17
    seed_prob: float = 0.75
    full_mask_prob: float = 0.6
    diffusion_weight: float = 1.0
    repeat_prob: float = 0.0
    max_period: int = 24

    kind_names = ("ar", "diffusion")

    def __post_init__(self) -> None:
        _check_int("mask_id", self.mask_id, 0)
        _check_int("min_block", self.min_block, 1)
        _check_int("max_block", self.max_block, self.min_block)
        _check_int("max_period", self.max_period, 2)
        for name in ("seed_prob", "full_mask_prob", "repeat_prob"):
            _check_number(name, getattr(self, name), 1)
        _check_number("diffusion_weight", self.diffusion_weight)

    def batch(self, tokens: torch.Tensor, generator: torch.Generator) -> Batch:
        """Rows ``[clean | blocks]`` for ``[B, T]`` clean windows."""
        size, length = tokens.shape
        device = tokens.device
        tokens, loops = self._loops(tokens, generator)
        starts = torch.empty(size, length, dtype=torch.long)
        block_ids = torch.empty(size, length, dtype=torch.long)
        masked = torch.zeros(size, length, dtype=torch.bool)
        for b in range(size):
            self._blocks(length, generator, starts[b], block_ids[b], masked[b])
        starts, block_ids, masked = starts.to(device), block_ids.to(device), masked.to(device)
        columns = torch.arange(length, device=device)
        causal = causal_mask(length, device).expand(size, length, length)
        context = columns[None, None, :] < starts[:, :, None]  # block rows see the clean rows before the block
        within = block_ids[:, :, None] == block_ids[:, None, :]
        none = torch.zeros(size, length, length, dtype=torch.bool, device=device)
        mask = torch.cat([torch.cat([causal, none], dim=2), torch.cat([context, within], dim=2)], dim=1)
        noisy = torch.where(masked, torch.full_like(tokens, self.mask_id), tokens)
        ar_targets = torch.full_like(tokens, IGNORE)
        ar_targets[:, :-1] = tokens[:, 1:]
        ar_targets[loops] = IGNORE
        diffusion_targets = torch.where(masked, tokens, torch.full_like(tokens, IGNORE))
        positions = columns.expand(size, length)
        return Batch(
            input_ids=torch.cat([tokens, noisy], dim=1).long(),
            position_ids=torch.cat([positions, positions], dim=1),
            mask=mask,
            targets=torch.cat([ar_targets, diffusion_targets], dim=1).long(),
            kinds=torch.cat([torch.zeros_like(tokens), torch.ones_like(tokens)], dim=1),
            kind_names=self.kind_names,
            weights=(1.0, self.diffusion_weight),
        )

    def _loops(self, tokens: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows with loops (see ``repeat_prob``) and the ``[B, T]`` rows whose next token lies in a loop."""
        size, length = tokens.shape
        ignored = torch.zeros(size, length, dtype=torch.bool, device=tokens.device)
        if not self.repeat_prob:
            return tokens, ignored
        chosen = torch.rand(size, generator=generator) < self.repeat_prob
        if not chosen.any():
            return tokens, ignored
        tokens = tokens.clone()
        for b in chosen.nonzero().flatten().tolist():
            prefix = int(torch.randint(length // 8, length // 2 + 1, (), generator=generator))
            period = int(torch.randint(2, min(self.max_period, prefix) + 1, (), generator=generator))
            unit = tokens[b, prefix - period : prefix]
            tokens[b, prefix:] = unit.repeat((length - prefix) // period + 1)[: length - prefix]
            ignored[b, prefix - 1 :] = True
        return tokens, ignored

    def _blocks(
        self,
        length: int,
        generator: torch.Generator,
        starts: torch.Tensor,
        block_ids: torch.Tensor,
        masked: torch.Tensor,
    ) -> None:
        """Fill one window's block starts, block ids and masked slots."""

        def uniform() -> float:
            return float(torch.rand((), generator=generator))

        def integer(low: int, high: int) -> int:
            return int(torch.randint(low, high + 1, (), generator=generator))

        block = integer(self.min_block, self.max_block)
        start, index = -integer(0, block - 1), 0  # a random phase: the first block may begin before the window
        while start < length:
            end = min(start + block, length)
            first = max(start, 0)
            starts[first:end] = first
            block_ids[first:end] = index
            slots = torch.zeros(end - first, dtype=torch.bool)
            if uniform() < self.full_mask_prob:
                slots[:] = True
            else:
                slots = torch.rand(end - first, generator=generator) < uniform()
            if start == first and uniform() < self.seed_prob and end - first > 1:
                slots[0] = False  # the clean seed
            if not slots.any():
                slots[integer(1 if start == first and end - first > 1 else 0, end - first - 1)] = True
            masked[first:end] = slots
            start, index = end, index + 1
            block = integer(self.min_block, self.max_block)

    def heldout(self, tokens: torch.Tensor) -> Batch:
        """Causal rows only, with the next-token loss: held-out AR perplexity."""
        size, length = tokens.shape
        targets = torch.full_like(tokens, IGNORE)
        targets[:, :-1] = tokens[:, 1:]
        return Batch(
            input_ids=tokens.long(),
            position_ids=torch.arange(length, device=tokens.device).expand(size, length),
            mask=causal_mask(length, tokens.device).expand(size, length, length),
            targets=targets.long(),
            kinds=torch.zeros_like(tokens),
            kind_names=("ar",),
            weights=(1.0,),
        )


@dataclass(frozen=True)
class AnyOrderObjective:
    """SetDLM's any-order objective over staggered orders, with duplicate (position-aligned) masks.

    Attributes:
        mask_id: The mask token.
        span: Local shuffling span (about ``2S``; ``S`` is the prediction budget, ``S = W = 8``).
        ltr_prob: Chance a window's order is exactly left to right (the ``ltr`` verification order).
        draft_prob: Chance a mask row is a proposal query (``lag > 0``) rather than a verifier query.
        max_lag: Largest lag of a proposal query (``W_max - 1``).
    """

    mask_id: int
    span: int = 16
    ltr_prob: float = 0.3
    draft_prob: float = 0.5
    max_lag: int = 15

    kind_names = ("verify", "draft")

    def __post_init__(self) -> None:
        _check_int("mask_id", self.mask_id, 0)
        _check_int("span", self.span, 0)
        _check_int("max_lag", self.max_lag, 1)
        for name in ("ltr_prob", "draft_prob"):
            _check_number(name, getattr(self, name), 1)

    def ranks(self, size: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """``[B, T]`` rank of each position in its window's generation order."""
        keys = torch.arange(length, dtype=torch.float32).expand(size, length)
        shuffle = torch.rand(size, length, generator=generator) * self.span
        ltr = torch.rand(size, 1, generator=generator) < self.ltr_prob
        keys = keys + torch.where(ltr, torch.zeros_like(shuffle), shuffle)
        return keys.argsort(dim=1).argsort(dim=1)

    def batch(self, tokens: torch.Tensor, generator: torch.Generator) -> Batch:
        """Rows ``[clean | masks]`` for ``[B, T]`` clean windows."""
        size, length = tokens.shape
        ranks = self.ranks(size, length, generator)
        draft = torch.rand(size, length, generator=generator) < self.draft_prob
        lags = torch.where(draft, torch.randint(1, self.max_lag + 1, (size, length), generator=generator), 0)
        return self._rows(tokens, ranks.to(tokens.device), lags.to(tokens.device))

    def heldout(self, tokens: torch.Tensor) -> Batch:
        """Left-to-right verifier queries only: held-out AR perplexity."""
        size, length = tokens.shape
        ranks = torch.arange(length, device=tokens.device).expand(size, length)
        return self._rows(tokens, ranks, torch.zeros_like(ranks))

    def _rows(self, tokens: torch.Tensor, ranks: torch.Tensor, lags: torch.Tensor) -> Batch:
        size, length = tokens.shape
        device = tokens.device
        clean_sees = ranks[:, None, :] <= ranks[:, :, None]
        mask_sees = ranks[:, None, :] < (ranks - lags)[:, :, None]
        none = torch.zeros(size, length, length, dtype=torch.bool, device=device)
        itself = torch.eye(length, dtype=torch.bool, device=device).expand(size, length, length)
        mask = torch.cat([torch.cat([clean_sees, none], dim=2), torch.cat([mask_sees, itself], dim=2)], dim=1)
        positions = torch.arange(length, device=device).expand(size, length)
        return Batch(
            input_ids=torch.cat([tokens, torch.full_like(tokens, self.mask_id)], dim=1).long(),
            position_ids=torch.cat([positions, positions], dim=1),
            mask=mask,
            targets=torch.cat([torch.full_like(tokens, IGNORE), tokens], dim=1).long(),
            kinds=torch.cat([torch.zeros_like(tokens), (lags > 0).to(tokens.dtype)], dim=1),
            kind_names=self.kind_names,
            weights=(1.0, 1.0),
        )


def check_objective_options(
    objective: type[BlockDiffusionObjective | AnyOrderObjective], options: Any, family: str
) -> None:
    """Refuse options that ``objective`` does not take, or values of the wrong type or range.

    Args:
        objective: The family's objective class.
        options: The ``objective`` setting of a training run (every field but ``mask_id``, which the
            tokenizer decides).
        family: The family trained, for messages.

    Raises:
        ValueError: Naming the unknown options and the class's options, or the field and its bad value.
    """
    known = [item.name for item in fields(objective) if item.name != "mask_id"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"objective: unknown option(s) {', '.join(unknown)} for {family} (its objective's options: "
            f"{', '.join(known)})"
        )
    objective(mask_id=0, **options)
