"""Nemotron-Labs-Diffusion layouts (appendix D.1 of the paper).

Nemotron's two modes differ only in the attention mask. A causal row at position ``i`` predicts the token at
``i + 1`` (the AR verifier: a chain of k tokens after the last accepted token yields k + 1 predictions, so a
bonus costs no extra row); a MASK row at position ``i`` predicts the token at ``i`` (the drafter), attending
bidirectionally within its block. Verification is left to right only.

Layouts, by the shape of the plan:

* verification only (AR, Linear-SS verify, prompt calls): one causal region
  ``[pending..., chain...]``;
* verification + one draft group from the verified prefix (Packed-SS):
  ``[last, D̄ | last, MASK x W]`` where ``D̄`` is the chain padded with masks to the window, so steady-state
  calls have ``2(W + 1)`` rows; when the pending tokens are the whole prompt (the first call) the masks read
  the prompt's causal rows instead of a copy of its last token (appendix E.2);
* verification + a draft group per acceptance boundary (Quadratic-SS): each group's masks branch off the
  causal chain at its context's last token (``[d_j, MASK x (W + 1)]`` sharing ``d_j``'s causal row),
  ``B(B + 1)`` rows with ``B = W + 1``;
* drafting only (Linear-SS draft call, the native block decoder): one bidirectional block made of the
  targets and the pending tokens next to them (the seed and already decided slots), at most ``W + 1``
  positions, as the released block decoder lays out ``[seed, MASK x W]``.

Within a draft group, masks fill every open position from just after the group's context up to its last
target, so a block is always contiguous. Only causal rows carrying an accepted token are ever committed to the
cache; block rows never are. A proposal-only adapter (LoRA), when loaded, is applied to block rows only.
"""

from __future__ import annotations

from specframe.errors import PlanError
from specframe.hookspecs import hookimpl
from specframe.masks.base import MaskBuilder, RowTable
from specframe.plan import CallPlan, DraftGroup, LayoutTraits, PhysicalCall


class NemotronMaskBuilder(MaskBuilder):
    """Physical layouts for Nemotron-Labs-Diffusion."""

    traits = LayoutTraits(free_bonus=True, any_order=False)
    layout_depends_on = "offsets"

    def build(self, plan: CallPlan) -> PhysicalCall:
        """Lay out ``plan`` (see the module docstring for the layouts)."""
        if plan.num_verify == 0:
            return self._drafting_only(plan)
        return self._verifying(plan)

    def max_rows(self, width: int, prompt_length: int) -> int:
        """Largest call: the prompt call, or a Quadratic-SS call of ``B(B + 1)`` rows."""
        block = width + 1
        return max(prompt_length + 2 * block + 1, block * (block + 1) + 1)

    # -- layouts -----------------------------------------------------------------------------------------
    def _verifying(self, plan: CallPlan) -> PhysicalCall:
        pending = sorted(plan.pending)  # a left-to-right family processes clean tokens in textual order
        if not pending:
            raise PlanError(
                "Nemotron verifies with causal next-token rows: the token before the first verified position "
                "must be a pending input, but the plan has no pending token"
            )
        first = pending[-1][0] + 1
        if tuple(plan.order) != tuple(range(first, first + len(plan.order))):
            raise PlanError(
                f"Nemotron verifies left to right only: the verification order {list(plan.order)} must be the "
                f"consecutive positions from {first} (use order 'ltr')"
            )
        mask_id = self.model.mask_token_id
        table = RowTable()
        tokens = [t for _, t in pending] + list(plan.chain)
        positions = [p for p, _ in pending] + list(plan.chain_positions)
        base = positions[0]
        if positions != list(range(base, base + len(positions))):
            raise PlanError(f"Nemotron's causal rows must be consecutive positions; got pending + chain at {positions}")
        packed = self._is_packed(plan)
        if packed:  # pad the chain with masks to W slots: every steady-state call has 2(W + 1) rows
            slots = min(plan.width, len(plan.order))
            padding = list(range(first + len(plan.chain), first + slots))
            tokens += [mask_id] * len(padding)
            positions += padding
        causal = table.add(tokens, positions, within="causal")
        verify_rows = [causal[plan.order[r] - 1 - base] for r in range(plan.num_verify)]
        commit = {
            p: (causal[i], t)
            for i, (p, t) in enumerate(zip(positions, tokens, strict=True))
            if i < len(pending) + len(plan.chain)
        }
        draft_rows = []
        for group in plan.drafts:
            if not group.targets:
                draft_rows.append([])
            elif packed and len(pending) == 1:
                seed_position, seed_token = pending[0]
                block = table.add(
                    [seed_token] + [mask_id] * (group.targets[-1] - seed_position),
                    list(range(seed_position, group.targets[-1] + 1)),
                    within="full",
                    adapter=True,
                )
                draft_rows.append([block[t - seed_position] for t in group.targets])
            else:
                draft_rows.append(self._branch(table, pending, group, causal))
        return table.call(
            plan,
            self.device,
            verify_rows=verify_rows,
            draft_rows=draft_rows,
            commit_rows=commit,
            use_adapter=self.model.has_adapter,
        )

    def _branch(self, table: RowTable, pending: list[tuple[int, int]], group: DraftGroup, causal: range) -> list[int]:
        """Masks that branch off the causal rows of the pending tokens and the first ``context`` chain tokens."""
        if not group.targets:
            return []
        seen = len(pending) + group.context
        anchor = pending[-1][0] + group.context
        if group.targets[0] <= anchor:
            raise PlanError(f"draft targets {list(group.targets)} must follow the group's context (position {anchor})")
        span = list(range(anchor + 1, group.targets[-1] + 1))
        block = table.add(
            [self.model.mask_token_id] * len(span),
            span,
            within="full",
            sees=range(causal.start, causal.start + seen),
            adapter=True,
        )
        return [block[t - span[0]] for t in group.targets]

    def _drafting_only(self, plan: CallPlan) -> PhysicalCall:
        if len(plan.drafts) != 1 or plan.chain:
            raise PlanError("a Nemotron drafting-only call takes exactly one draft group and no chain")
        targets = plan.drafts[0].targets
        if not targets:
            raise PlanError("a drafting-only call needs at least one target position")
        pending = dict(plan.pending)
        last = targets[-1]
        while last + 1 in pending:
            last += 1
        start = targets[0]
        while start - 1 in pending and last - (start - 1) <= plan.width:
            start -= 1
        before = sorted((p, t) for p, t in plan.pending if p < start)
        if any(p > last for p, _ in plan.pending):
            raise PlanError("pending tokens after the drafting block cannot be laid out")
        table = RowTable()
        causal = table.add([t for _, t in before], [p for p, _ in before], within="causal")
        span = list(range(start, last + 1))
        block = table.add(
            [pending.get(p, self.model.mask_token_id) for p in span],
            span,
            within="full",
            sees=causal,
            adapter=True,
        )
        commit = {p: (causal[i], t) for i, (p, t) in enumerate(before)}
        return table.call(
            plan,
            self.device,
            verify_rows=[],
            draft_rows=[[block[t - start] for t in targets]],
            commit_rows=commit,
            use_adapter=self.model.has_adapter,
        )

    @staticmethod
    def _is_packed(plan: CallPlan) -> bool:
        return len(plan.drafts) == 1 and plan.drafts[0].context == 0 and len(plan.pending) == 1


@hookimpl
def register_mask_builders(register):
    """Register the layout of the ``nemotron-labs-diffusion`` family."""
    register("nemotron-labs-diffusion", NemotronMaskBuilder)
