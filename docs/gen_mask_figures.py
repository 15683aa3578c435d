"""Render the attention-mask figures of the concepts page from specframe's own mask builders.

Each figure is one real call: a decoding state is set up by hand (a 4-token prompt, speculative width 4),
the real schedule plans the call with ``schedule.plan(state)``, and the family's real mask builder lays it
out with ``builder.build(plan)``. The picture is the :class:`~specframe.plan.PhysicalCall`'s attention
matrix; row labels come from its input ids, position ids and output-row maps. Nothing is drawn by hand, so
the figures change when a layout changes.

mkdocs-gen-files runs this script on every build (the PNGs land in ``images/masks/``). Run it directly to
write them into a folder instead::

    python docs/gen_mask_figures.py /tmp/masks
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from specframe.acceptance.base import DraftRef, Proposals
from specframe.acceptance.greedy import GreedyAcceptance
from specframe.ledger import CacheLedger
from specframe.masks.nemotron import NemotronMaskBuilder
from specframe.masks.setdlm import SetDLMMaskBuilder
from specframe.orders.confidence import ConfidenceOrder
from specframe.orders.ltr import LeftToRight
from specframe.plan import PhysicalCall
from specframe.schedules.ar import ARSchedule
from specframe.schedules.linear import LinearSchedule
from specframe.schedules.packed import PackedSchedule
from specframe.schedules.quadratic import QuadraticSchedule
from specframe.state import DecodeContext, DecodeState

WIDTH = 4
PROMPT_LENGTH = 4
MASK = 999
FAMILIES = {
    "nemotron-labs-diffusion": ("Nemotron-Labs-Diffusion", NemotronMaskBuilder),
    "setdlm": ("SetDLM", SetDLMMaskBuilder),
}


def token_id(role: str, position: int) -> int:
    """A distinct id per (role, position), so that every row's label can be read back from its input id."""
    return {"prompt": 100, "accepted": 200, "draft": 300}[role] + position


def token_label(token: int) -> str:
    """The symbol shown for an input id: ``p2`` (prompt), ``x5`` (accepted), ``d6`` (draft) or ``MASK``."""
    if token == MASK:
        return "MASK"
    return {1: "p", 2: "x", 3: "d"}[token // 100] + str(token % 100)


def stand_in_model(family: str) -> SimpleNamespace:
    """What a mask builder reads from a model: its family, mask id, device and adapter flag."""
    return SimpleNamespace(family=family, mask_token_id=MASK, device=torch.device("cpu"), has_adapter=False)


def make_state(
    builder_traits, *, accepted: int = 0, cached: int = 0, drafts: dict[int, float] | None = None, order=None
) -> DecodeState:
    """A state after ``accepted`` output tokens (the first ``cached`` positions in the KV cache) with drafts.

    Args:
        builder_traits: The family's layout traits.
        accepted: Output tokens accepted so far.
        cached: Positions (prompt included) whose keys and values are cached; the rest are pending.
        drafts: Stored draft positions and their confidence scores.
        order: Verification order policy (left to right by default).
    """
    ctx = DecodeContext(width=WIDTH, order=order or LeftToRight(), rule=GreedyAcceptance(), traits=builder_traits)
    state = DecodeState([token_id("prompt", p) for p in range(PROMPT_LENGTH)], 64, ctx)
    ledger = CacheLedger(state)
    ledger.cached.update(range(cached))
    if accepted:
        ledger.accept([(p, token_id("accepted", p)) for p in range(PROMPT_LENGTH, PROMPT_LENGTH + accepted)])
        state.calls = accepted
    state.pending = ledger.pending
    if drafts:
        positions = sorted(drafts)
        proposals = Proposals(
            tokens=torch.tensor([token_id("draft", p) for p in positions]),
            scores=torch.tensor([drafts[p] for p in positions]),
        )
        state.set_drafts({p: DraftRef(proposals, i) for i, p in enumerate(positions)}, dict(drafts))
    return state


@dataclass
class Case:
    """One figure: a family, a schedule's call, and what it shows."""

    family: str
    slug: str
    title: str
    call: PhysicalCall


def cases() -> Iterator[Case]:
    """Every figure of the concepts page, as real physical calls."""
    for family, (family_name, builder_class) in FAMILIES.items():
        builder = builder_class(stand_in_model(family))
        traits = builder.traits
        steady = {"accepted": 1, "cached": PROMPT_LENGTH}  # the prompt is cached, x4 is pending
        full_draft = {p: 0.5 for p in range(5, 5 + WIDTH)}
        plans = [
            ("ar", "plain AR step", ARSchedule(), make_state(traits, **steady)),
            ("linear-draft", "Linear-SS, drafting call", LinearSchedule(), make_state(traits, **steady)),
            (
                "linear-verify",
                "Linear-SS, verification call",
                LinearSchedule(),
                make_state(traits, **steady, drafts=full_draft),
            ),
            ("quadratic", "Quadratic-SS", QuadraticSchedule(), make_state(traits, **steady, drafts=full_draft)),
            ("packed-first", "Packed-SS, first call (the prompt)", PackedSchedule(), make_state(traits)),
            (
                "packed",
                "Packed-SS, after a call that added 2 tokens",
                PackedSchedule(),
                make_state(traits, accepted=2, cached=PROMPT_LENGTH + 1, drafts={6: 0.8, 7: 0.6}),
            ),
        ]
        if traits.any_order:
            plans.append(
                (
                    "packed-confidence",
                    "Packed-SS, confidence order",
                    PackedSchedule(),
                    make_state(
                        traits,
                        accepted=2,
                        cached=PROMPT_LENGTH + 1,
                        drafts={6: 0.5, 7: 0.9, 8: 0.7},
                        order=ConfidenceOrder(),
                    ),
                )
            )
        for slug, title, schedule, state in plans:
            call = builder.build(schedule.plan(state))
            yield Case(family, slug, f"{family_name}: {title}", call)


def row_labels(call: PhysicalCall) -> tuple[list[str], list[str]]:
    """Per row: what it holds (``x4 @4``) and what the call reads from it (verifier rank, draft target)."""
    plan = call.plan
    held = [
        f"{token_label(int(t))} @{int(p)}"
        for t, p in zip(call.input_ids.tolist(), call.position_ids.tolist(), strict=True)
    ]
    roles = [""] * len(held)
    output = call.output_rows.tolist()
    for rank, index in enumerate(call.verify_rows.tolist()):
        roles[output[index]] = f"verifies rank {rank + 1} (pos {plan.order[rank]})"
    for group, indices in zip(plan.drafts, call.draft_rows, strict=True):
        for target, index in zip(group.targets, indices.tolist(), strict=True):
            branch = f", branch {group.context}" if len(plan.drafts) > 1 else ""
            roles[output[index]] = f"drafts pos {target}{branch}"
    for position, (row, _) in call.commit_rows.items():
        note = "cached" if position in dict(plan.pending) else "cached if accepted"
        roles[row] = f"{roles[row]}; {note}" if roles[row] else note
    return held, roles


def render(case: Case) -> bytes:
    """The PNG of one case's attention matrix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    call = case.call
    rows = call.num_rows
    held, roles = row_labels(call)
    cell = 0.28
    fig, ax = plt.subplots(figsize=(2.6 + 3.3 + cell * rows, 1.4 + cell * rows), dpi=110)
    ax.imshow(call.attention.int().numpy(), cmap=ListedColormap(["#f4f4f4", "#3b6ea8"]), vmin=0, vmax=1)
    ax.set_xticks(range(rows), held, rotation=90, fontsize=7, family="monospace")
    ax.set_yticks(range(rows), held, fontsize=7, family="monospace")
    ax.xaxis.tick_top()
    ax.set_xticks([x - 0.5 for x in range(1, rows)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, rows)], minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    for label in ax.get_xticklabels() + ax.get_yticklabels():
        if label.get_text().startswith("MASK"):
            label.set_color("#b5651d")
    for row, role in enumerate(roles):
        if role:
            ax.text(rows - 0.3, row, role, va="center", fontsize=7)
    ax.set_title(f"{case.title}: {rows} rows, W = {WIDTH}", fontsize=9, pad=40)
    ax.set_xlim(-0.5, rows - 0.5)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def figure_path(case: Case) -> str:
    """Where a case's PNG lives inside the docs."""
    return f"images/masks/{case.family}-{case.slug}.png"


def main(argv: list[str]) -> None:
    """Write every figure into the folder ``argv[0]``, or into the docs build when run by mkdocs-gen-files."""
    if argv:
        folder = Path(argv[0])
        for case in cases():
            target = folder / figure_path(case)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(render(case))
        return
    import mkdocs_gen_files

    for case in cases():
        with mkdocs_gen_files.open(figure_path(case), "wb") as handle:
            handle.write(render(case))


if __name__ == "__main__":
    main(sys.argv[1:])
elif __name__ == "<run_path>":  # mkdocs-gen-files runs build scripts with runpy.run_path
    main([])
