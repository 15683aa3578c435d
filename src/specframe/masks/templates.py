"""Layout templates: each distinct plan shape is laid out once, then reused with new tokens and positions.

In steady state a schedule plans the same few call shapes again and again: Packed-SS on Nemotron verifies a
chain of ``kappa <= W`` drafts and drafts the next window, shifted by however many tokens the last call
accepted. A family layout that depends only on the plan's *shape* lays each shape out once, here, on the
model's device: the attention mask, the output and row maps and the adapter rows are kept, and a call only
fills in its token ids and position ids (one host-to-device copy of ``2R`` integers).

What the shape is depends on the family (:attr:`MaskBuilder.layout_depends_on`):

* ``"offsets"``: the positions relative to the plan's first position (a layout that computes with positions,
  such as Nemotron's causal chain and its mask block);
* ``"counts"``: only how many pending tokens, ranks, chain tokens and targets per group the plan has; the
  layout copies positions into rows but never compares or computes with them (SetDLM), so one template
  serves every verification order.

The shape is laid out from a canonical plan: its positions shifted to start at 0 (``"offsets"``) or replaced
by their index in the plan's list of positions (``"counts"``: pending, then order, then each group's targets),
and each token of the plan replaced by a negative placeholder (``-1 - i`` for the ``i``-th of the pending
tokens, then the chain), so that the rows holding plan tokens can be found in the laid-out ids. Token ids
and positions of a call are validated on the host from these lists, so the model need not read them back
from the device.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specframe.errors import InputError, PlanError
from specframe.plan import CallPlan, DraftGroup, PhysicalCall

#: Templates kept per mask builder (least recently used ones are dropped).
MAX_TEMPLATES = 256

#: The ways a layout may depend on its plan (see the module docstring).
MODES = ("offsets", "counts")

ShapeKey = tuple


@dataclass(frozen=True)
class LayoutTemplate:
    """One laid-out plan shape (see the module docstring).

    Attributes:
        ids: Token ids of the rows; entries ``< 0`` are placeholders for the plan's tokens.
        slots: ``(row, token index)`` for each placeholder row.
        positions: Per row, its position relative to the base (``"offsets"``) or the index of its position
            in the plan's list of positions (``"counts"``).
        low: Smallest entry of ``positions``.
        high: Largest entry of ``positions``.
        commit: ``(row, token index or -1, token)`` per committable row (committed at the row's position).
        call: The laid-out canonical call, whose tensors every instance shares.
    """

    ids: tuple[int, ...]
    slots: tuple[tuple[int, int], ...]
    positions: tuple[int, ...]
    low: int
    high: int
    commit: tuple[tuple[int, int, int], ...]
    call: PhysicalCall


def plan_positions(plan: CallPlan) -> list[int]:
    """The plan's positions in the order ``"counts"`` layouts index them: pending, order, then the targets."""
    positions = [p for p, _ in plan.pending]
    positions.extend(plan.order)
    for group in plan.drafts:
        positions.extend(group.targets)
    return positions


def plan_shape(plan: CallPlan, mode: str) -> tuple[int, ShapeKey] | None:
    """The plan's base position and a hashable key of its shape, or ``None`` if it has no position.

    The base is meaningful for ``"offsets"`` only (``0`` for ``"counts"``).
    """
    if mode == "counts":
        groups = tuple([(g.context, len(g.targets)) for g in plan.drafts])
        return 0, (mode, len(plan.pending), len(plan.order), len(plan.chain), plan.num_verify, groups, plan.width)
    pending = plan.pending
    if pending:
        base = pending[0][0] if len(pending) == 1 else min([p for p, _ in pending])
    elif plan.order:
        base = plan.order[0]
    else:
        base = next((g.targets[0] for g in plan.drafts if g.targets), None)
        if base is None:
            return None
    key = (
        mode,
        (0,) if len(pending) == 1 else tuple([p - base for p, _ in pending]),
        tuple([p - base for p in plan.order]),
        len(plan.chain),
        plan.num_verify,
        tuple([(g.context, tuple([t - base for t in g.targets])) for g in plan.drafts]),
        plan.width,
    )
    return base, key


def canonical_plan(key: ShapeKey) -> CallPlan:
    """The plan of shape ``key`` with canonical positions and placeholder tokens ``-1, -2, ...``."""
    if key[0] == "counts":
        _, num_pending, ranks, kappa, num_verify, counts, width = key
        pending = tuple(range(num_pending))
        order = tuple(range(num_pending, num_pending + ranks))
        groups, start = [], num_pending + ranks
        for context, count in counts:
            groups.append((context, tuple(range(start, start + count))))
            start += count
    else:
        _, pending, order, kappa, num_verify, groups, width = key
    return CallPlan(
        pending=tuple((p, -1 - i) for i, p in enumerate(pending)),
        order=order,
        chain=tuple(-1 - len(pending) - r for r in range(kappa)),
        num_verify=num_verify,
        drafts=tuple(DraftGroup(context, targets) for context, targets in groups),
        width=width,
    )


def plan_tokens(key: ShapeKey) -> int:
    """How many placeholder tokens the canonical plan of ``key`` has (pending tokens plus the chain)."""
    pending = key[1] if key[0] == "counts" else len(key[1])
    return pending + key[3]


def make_template(call: PhysicalCall, tokens: int, vocab_size: int) -> LayoutTemplate | None:
    """A template of a canonical ``call`` whose plan has ``tokens`` placeholder tokens.

    Returns ``None`` when the layout cannot be validated once for all its instances (a row that attends to
    nothing, a constant id outside the vocabulary, a committed row whose position is not the one it is
    committed at): such calls are built and checked one by one.

    Raises:
        PlanError: The layout uses a placeholder that names no token of the plan.
    """
    ids = call.input_ids.tolist()
    positions = call.position_ids.tolist()
    slots = []
    for row, token in enumerate(ids):
        if token < 0:
            if -1 - token >= tokens:
                raise PlanError(f"the mask builder produced token id {token} at row {row}")
            slots.append((row, -1 - token))
        elif token >= vocab_size:
            return None
    rows = len(ids)
    outputs = call.output_rows.tolist()
    if not bool(call.attention.any(dim=1).all()) or any(not 0 <= r < rows for r in outputs):
        return None
    if any(positions[row] != position for position, (row, _) in call.commit_rows.items()):
        return None
    commit = tuple((row, -1 - token if token < 0 else -1, token) for row, token in call.commit_rows.values())
    return LayoutTemplate(
        ids=tuple(ids),
        slots=tuple(slots),
        positions=tuple(positions),
        low=min(positions),
        high=max(positions),
        commit=commit,
        call=call,
    )


class TemplateCache:
    """Builds physical calls from templates, laying out each new plan shape once.

    Args:
        build: The family layout (``MaskBuilder.build``).
        mode: How the layout depends on the plan: ``"offsets"`` or ``"counts"`` (see the module docstring).
        device: The model's device.
        vocab_size: The model's vocabulary size.
        max_positions: The model's largest position id.
    """

    def __init__(
        self,
        build: Callable[[CallPlan], PhysicalCall],
        mode: str,
        device: torch.device,
        vocab_size: int,
        max_positions: int,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown layout dependence {mode!r}; expected one of {MODES}")
        self.build = build
        self.mode = mode
        self.device = device
        self._on_cpu = device.type == "cpu"
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        self.templates: OrderedDict[ShapeKey, LayoutTemplate | None] = OrderedDict()

    def call(self, plan: CallPlan) -> PhysicalCall:
        """The physical call of ``plan``.

        Plans with more pending tokens than ``width + 1`` (the prompt call) are laid out directly: their
        shape rarely repeats and their masks are large.

        Raises:
            PlanError: The family cannot lay the plan out.
            InputError: A token id outside the vocabulary or a position beyond the model's context.
        """
        shape = plan_shape(plan, self.mode) if len(plan.pending) <= plan.width + 1 else None
        if shape is None:
            return self.build(plan)
        base, key = shape
        if key in self.templates:
            self.templates.move_to_end(key)
            template = self.templates[key]
        else:
            template = make_template(self.build(canonical_plan(key)), plan_tokens(key), self.vocab_size)
            self.templates[key] = template
            if len(self.templates) > MAX_TEMPLATES:
                self.templates.popitem(last=False)
        if template is None:
            return self.build(plan)
        return self._instantiate(template, plan, base)

    def _instantiate(self, template: LayoutTemplate, plan: CallPlan, base: int) -> PhysicalCall:
        pending = plan.pending
        tokens = [pending[0][1]] if len(pending) == 1 else [t for _, t in pending]
        tokens += plan.chain
        if tokens and (min(tokens) < 0 or max(tokens) >= self.vocab_size):
            bad = [t for t in tokens if not 0 <= t < self.vocab_size]
            raise InputError(f"token ids {bad[:5]} are outside the model's vocabulary [0, {self.vocab_size})")
        if self.mode == "counts":
            source = plan_positions(plan)
            positions = [source[i] for i in template.positions]
            low, high = min(positions), max(positions)
        else:
            positions = [base + o for o in template.positions]
            low, high = base + template.low, base + template.high
        if low < 0 or high > self.max_positions:
            raise InputError(
                f"the call spans positions {low}..{high}, outside the model's context of "
                f"{self.max_positions + 1} positions: shorten the prompt or the requested output"
            )
        ids = [*template.ids]
        for row, index in template.slots:
            ids[row] = tokens[index]
        # torch.frombuffer wraps a host buffer without the per-element conversion torch.tensor does. On the
        # CPU, one buffer each (indexing rows of a joint one costs two more ops); for an accelerator, one
        # joint buffer and one copy. Past timings of each: docs/performance.md#host-side-choices.
        if self._on_cpu:
            input_ids = torch.frombuffer(array("q", ids), dtype=torch.int64)
            position_ids = torch.frombuffer(array("q", positions), dtype=torch.int64)
        else:
            data = torch.frombuffer(array("q", ids + positions), dtype=torch.int64).to(self.device)
            input_ids, position_ids = data.view(2, len(ids)).unbind(0)
        shared = template.call
        return PhysicalCall(
            plan=plan,
            input_ids=input_ids,
            position_ids=position_ids,
            attention=shared.attention,
            output_rows=shared.output_rows,
            verify_rows=shared.verify_rows,
            draft_rows=shared.draft_rows,
            commit_rows={
                positions[row]: (row, tokens[index] if index >= 0 else token) for row, index, token in template.commit
            },
            adapter_rows=shared.adapter_rows,
            row_slices=shared.row_slices,
            checked=True,
        )
