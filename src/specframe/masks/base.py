"""The mask-builder interface: lay a family-free CallPlan out as physical rows, and read the logits back.

A mask builder owns a family's input layout (appendix D of the paper): which rows a plan needs, their token
and position ids, who attends to whom, which rows answer which verification rank or draft target, and which
rows hold keys/values worth committing to the cache. It never decides acceptance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from specframe.errors import ConfigError
from specframe.masks.templates import TemplateCache
from specframe.models.base import ModelBackend
from specframe.orders.base import OrderPolicy
from specframe.plan import CallPlan, CallResult, LayoutTraits, PhysicalCall


class MaskBuilder(ABC):
    """Turns plans into physical calls for one model family.

    Args:
        model: The loaded model (for its mask token id, adapter and device).
    """

    traits: LayoutTraits = LayoutTraits(free_bonus=False, any_order=False)

    #: How :meth:`build` depends on a plan beyond which rows hold the plan's tokens (never on the token
    #: values): ``"offsets"``, only on positions relative to the plan's first one; ``"counts"``, only on the
    #: number of pending tokens, ranks, chain tokens and targets per group (positions are copied into rows,
    #: never compared); ``None``, in any way. With a mode, :meth:`physical` lays each plan shape out once and
    #: reuses it (:mod:`specframe.masks.templates`); with ``None`` every call is built afresh.
    layout_depends_on: str | None = None

    def __init__(self, model: ModelBackend) -> None:
        self.model = model
        self.device = model.device

    @abstractmethod
    def build(self, plan: CallPlan) -> PhysicalCall:
        """Lay ``plan`` out as rows (raises :class:`~specframe.errors.PlanError` if it cannot)."""

    def physical(self, plan: CallPlan) -> PhysicalCall:
        """The physical call of ``plan``: :meth:`build`'s layout, from a template (see :attr:`layout_depends_on`).

        Raises:
            PlanError: The family cannot lay the plan out.
            InputError: A token id outside the vocabulary or a position beyond the model's context.
        """
        if self.layout_depends_on is None:
            return self.build(plan)
        templates = self.__dict__.get("_templates")
        if templates is None:
            model = self.model
            mode = self.layout_depends_on
            templates = TemplateCache(self.build, mode, self.device, model.vocab_size, model.max_positions)
            self._templates = templates
        return templates.call(plan)

    def read(self, call: PhysicalCall, logits: torch.Tensor) -> CallResult:
        """Split the returned logits (one row per ``call.output_rows``) into verifier and drafter logits."""
        if call.row_slices is not None:
            verify, drafts = call.row_slices
            return CallResult.sliced(logits, verify, drafts)
        return CallResult(
            verify_logits=logits[call.verify_rows],
            draft_logits=tuple(logits[rows] for rows in call.draft_rows),
        )

    def max_rows(self, width: int, prompt_length: int) -> int:
        """An upper bound on the rows of one call, used to preallocate the KV cache's staging area."""
        return prompt_length + (width + 2) * (width + 2)

    def check_order(self, order: OrderPolicy, order_name: str) -> None:
        """Refuse an order policy this family cannot verify in.

        Raises:
            ConfigError: The family verifies left to right only and the policy is not left to right.
        """
        if not self.traits.any_order and not order.left_to_right:
            raise ConfigError(
                f"model family {self.model.family!r} verifies left to right only; order {order_name!r} is not "
                "supported on it (use order 'ltr')"
            )


class RowTable:
    """Accumulates physical rows and the attention among them, block by block.

    Rows are appended in groups; each group attends within itself causally (``"causal"``), fully
    (``"full"``, a bidirectional diffusion block) or only to itself (``"self"``), plus to a set of earlier
    rows. The attention matrix is materialised with slice assignments, so a long prompt costs no Python loop.
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.adapter: list[bool] = []
        self._rules: list[tuple[range, range | list[int] | tuple[range, ...], str]] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def add(
        self,
        tokens: list[int],
        positions: list[int],
        *,
        within: str = "causal",
        sees: range | list[int] | tuple[range, ...] = (),
        adapter: bool = False,
    ) -> range:
        """Append rows; returns their indices.

        Args:
            tokens: Token ids of the new rows.
            positions: Their position ids.
            within: Attention among the new rows: ``"causal"``, ``"full"`` or ``"self"``.
            sees: Earlier rows every new row also attends to: a range, a list of rows, or a tuple of ranges.
            adapter: Whether the rows get the proposal-only adapter.
        """
        if within not in ("causal", "full", "self"):
            raise ValueError(f"unknown attention pattern {within!r}")
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in tokens)
        self.positions.extend(int(p) for p in positions)
        self.adapter.extend([adapter] * len(tokens))
        rows = range(start, len(self.tokens))
        self._rules.append((rows, sees, within))
        return rows

    def attention(self, device: torch.device) -> torch.Tensor:
        """The ``[R, R]`` boolean attention matrix."""
        size = len(self.tokens)
        mask = torch.zeros(size, size, dtype=torch.bool)
        for rows, sees, within in self._rules:
            a, b = rows.start, rows.stop
            if within == "causal":
                mask[a:b, a:b] = torch.ones(b - a, b - a, dtype=torch.bool).tril()
            elif within == "full":
                mask[a:b, a:b] = True
            else:
                mask[a:b, a:b] = torch.eye(b - a, dtype=torch.bool)
            for part in sees if isinstance(sees, tuple) else (sees,):
                if isinstance(part, range) and part.step == 1:
                    mask[a:b, part.start : part.stop] = True
                elif len(part):
                    mask[a:b, torch.as_tensor(list(part), dtype=torch.long)] = True
        return mask.to(device)

    def call(
        self,
        plan: CallPlan,
        device: torch.device,
        *,
        verify_rows: list[int],
        draft_rows: list[list[int]],
        commit_rows: dict[int, tuple[int, int]],
        use_adapter: bool,
    ) -> PhysicalCall:
        """Materialise a :class:`PhysicalCall` whose outputs are the verify rows then the draft rows."""
        output = list(verify_rows) + [r for rows in draft_rows for r in rows]
        verify_index = torch.arange(len(verify_rows), device=device)
        draft_index, draft_slices = [], []
        offset = len(verify_rows)
        for rows in draft_rows:
            draft_index.append(torch.arange(offset, offset + len(rows), device=device))
            draft_slices.append(slice(offset, offset + len(rows)))
            offset += len(rows)
        return PhysicalCall(
            plan=plan,
            input_ids=torch.tensor(self.tokens, dtype=torch.long, device=device),
            position_ids=torch.tensor(self.positions, dtype=torch.long, device=device),
            attention=self.attention(device),
            output_rows=torch.tensor(output, dtype=torch.long, device=device),
            verify_rows=verify_index,
            draft_rows=tuple(draft_index),
            commit_rows=commit_rows,
            # no adapter rows at all (an AR or verify-only call): None, so the model skips the adapter entirely
            adapter_rows=(
                torch.tensor(self.adapter, dtype=torch.bool, device=device)
                if use_adapter and any(self.adapter)
                else None
            ),
            row_slices=(slice(0, len(verify_rows)), tuple(draft_slices)),
        )
