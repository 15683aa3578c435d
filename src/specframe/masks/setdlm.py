"""SetDLM layouts: position-aligned duplicate masks (appendix D.2 of the paper).

SetDLM predicts the token at the position of its input mask (no shift), and its training construction
represents each position twice, once as a clean token and once as a mask with the same position id. A call
is laid out as four regions::

    [ N | O | M | R ]

* ``N``: pending tokens (the prompt, a correction, tokens a native step decoded), causal among themselves in
  generation order, committed to the cache;
* ``O``: the draft chain in rank order (masks pad the ranks without a draft), each attending to ``N`` and
  the earlier ranks; accepted chain rows are committed;
* ``M``: one verifier mask per rank, attending to ``N`` and the drafts at earlier ranks;
* ``R``: one proposal mask per draft target, attending to ``N`` and the first ``context`` chain rows only.

Masks never see other masks and clean tokens never see masks. Verification may follow any order, and the
verifier scores only positions of the window (no free bonus). With a chain, ``O`` and ``M`` cover the whole
window, so a Packed-SS call has ``p + 3u`` rows, a Linear-SS iteration ``p + 3u`` over its two calls
(``p + u`` drafting, ``2u`` verifying) and a Quadratic-SS call ``p + 2u + u^2`` (Table 2).
"""

from __future__ import annotations

from specframe.hookspecs import hookimpl
from specframe.masks.base import MaskBuilder, RowTable
from specframe.plan import CallPlan, LayoutTraits, PhysicalCall


class SetDLMMaskBuilder(MaskBuilder):
    """Physical layouts for SetDLM."""

    traits = LayoutTraits(free_bonus=False, any_order=True)
    layout_depends_on = "counts"

    def build(self, plan: CallPlan) -> PhysicalCall:
        """Lay out ``plan`` as ``[N | O | M | R]``."""
        mask_id = self.model.mask_token_id
        table = RowTable()
        pending = table.add([t for _, t in plan.pending], [p for p, _ in plan.pending], within="causal")
        commit = {p: (pending[i], t) for i, (p, t) in enumerate(plan.pending)}
        kappa = len(plan.chain)
        chain = range(pending.stop, pending.stop)
        if kappa:
            ranks = len(plan.order)
            chain = table.add(
                list(plan.chain) + [mask_id] * (ranks - kappa),
                list(plan.order),
                within="causal",
                sees=pending,
            )
            commit.update(
                {p: (chain[r], t) for r, (p, t) in enumerate(zip(plan.chain_positions, plan.chain, strict=True))}
            )
        verify_rows = []
        verifier_ranks = len(plan.order) if kappa and plan.num_verify else plan.num_verify
        for rank in range(verifier_ranks):
            earlier = range(chain.start, chain.start + min(rank, kappa))
            row = table.add([mask_id], [plan.order[rank]], within="self", sees=(pending, earlier))
            verify_rows.append(row[0])
        draft_rows = []
        for group in plan.drafts:
            context = (pending, range(chain.start, chain.start + group.context))
            rows = table.add([mask_id] * len(group.targets), list(group.targets), within="self", sees=context)
            draft_rows.append(list(rows))
        return table.call(
            plan,
            self.device,
            verify_rows=verify_rows[: plan.num_verify],
            draft_rows=draft_rows,
            commit_rows=commit,
            use_adapter=False,
        )

    def max_rows(self, width: int, prompt_length: int) -> int:
        """Largest call: the prompt call or a Quadratic-SS call of ``p + 2W + W^2`` rows."""
        return max(prompt_length + 3 * width + 1, 1 + 2 * width + width * width)


@hookimpl
def register_mask_builders(register):
    """Register the layout of the ``setdlm`` family."""
    register("setdlm", SetDLMMaskBuilder)
