"""How ``compose`` turns ``width: "auto"`` and ``schedule: "auto"`` into an :class:`AutoSchedule` with a cost model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specframe.acceptance.base import AcceptanceRule
from specframe.costs import CostModel, cost_model_for
from specframe.errors import ConfigError
from specframe.exactness import width_changes_output
from specframe.masks.base import MaskBuilder
from specframe.models.base import ModelBackend
from specframe.orders.base import OrderPolicy
from specframe.schedules.auto import AUTO_MAX_WIDTH, AutoSchedule
from specframe.schedules.base import Schedule
from specframe.schedules.kbranch import KBranchSchedule
from specframe.schedules.linear import LinearSchedule
from specframe.schedules.packed import PackedSchedule
from specframe.schedules.quadratic import QuadraticSchedule

#: ``width: "auto"`` for a built-in schedule whose width no cost model chooses (``native``) means this width.
DEFAULT_WIDTH = 8

#: The cost model ``width: "auto"`` chooses by where the widths change the output and no ``cost`` is given:
#: fixed numbers, not this machine's timings, so that the same request gives the same output on every machine
#: and under any load. A call of R rows costs ``1 + R / 32`` units (a wide call of 32 rows costs two narrow
#: ones: between a GPU's nearly free rows and a small CPU's); only ratios matter to the choice.
NOMINAL_COST = CostModel(tau=1.0, delta=1 / 32, source="nominal")

# Built-in schedules whose width "auto" chooses, and the candidates it chooses among (W = 0: AR calls).
_AUTO_WIDTH_KINDS: Mapping[type, tuple[str, ...]] = {
    PackedSchedule: ("ar", "packed"),
    LinearSchedule: ("linear",),
    QuadraticSchedule: ("quadratic",),
    KBranchSchedule: ("kbranch",),
}


def check_cost(value: Any) -> None:
    """Refuse a ``cost`` config value that is not ``None``, a :class:`CostModel` or a mapping.

    Raises:
        ConfigError: Naming what was given and what to give.
    """
    if value is None or isinstance(value, CostModel):
        return
    if isinstance(value, Mapping):
        CostModel.from_mapping(value)
        return
    raise ConfigError(
        f"cost must be None (measure this machine), a CostModel or a mapping like {{'tau': 0.007, 'delta': 0.0002}}, "
        f"got {value!r}"
    )


def resolve(
    width: int | str,
    cost: CostModel | Mapping[str, Any] | None,
    schedule: Schedule,
    schedule_name: str,
    model: ModelBackend,
    builder: MaskBuilder,
    order: OrderPolicy,
    rule: AcceptanceRule,
) -> tuple[Schedule, int]:
    """The schedule to decode with and the decoder's width W (the largest a chosen width can be).

    A built-in ``packed``, ``linear``, ``quadratic`` or ``kbranch`` with ``width: "auto"`` becomes an
    :class:`AutoSchedule` over its own widths (``packed`` also over plain AR calls); ``schedule: "auto"``
    chooses among its candidates at the given width, or at every width under ``"auto"``. Other schedules
    take ``"auto"`` as their declared ``auto_width`` (see :func:`fixed_width`). An auto schedule is bound
    to ``cost`` (a mapping or :class:`CostModel`), or to this machine's cached cost model, calibrated first
    if there is none.

    Where the widths change the output (:func:`~specframe.exactness.width_changes_output`: any-order
    verification, sampling, a rule not declared exact), the schedule is bound ``deterministic`` instead, to
    ``cost`` if given, else to :data:`NOMINAL_COST`: no timing, nothing carried over between requests, so
    that the output is a function of the model, the prompt, the configuration and the seed.
    """
    if width == "auto" and type(schedule) in _AUTO_WIDTH_KINDS:
        schedule = AutoSchedule(getattr(schedule, "k", 2), kinds=_AUTO_WIDTH_KINDS[type(schedule)], name=schedule_name)
    if not isinstance(schedule, AutoSchedule):
        return schedule, fixed_width(schedule, schedule_name) if width == "auto" else int(width)
    if width != "auto":
        schedule.widths = (int(width),)
    decoder_width = min(AUTO_MAX_WIDTH, model.max_positions + 1) if width == "auto" else int(width)
    if isinstance(cost, Mapping):
        cost = CostModel.from_mapping(cost)
    deterministic = width_changes_output(order, rule)
    if cost is None:
        if deterministic:
            cost = NOMINAL_COST
        else:
            cost = cost_model_for(model, host_s=lambda: decoder_overhead(model, builder, order, rule))
    schedule.bind(cost, lambda plan: builder.build(plan).num_rows, deterministic=deterministic)
    return schedule, decoder_width


def fixed_width(schedule: Schedule, schedule_name: str) -> int:
    """The width ``width: "auto"`` means for a schedule whose width no cost model chooses: its ``auto_width``.

    Raises:
        ConfigError: If the schedule declares none (a plugin schedule, by default): running it at a width
            nobody chose, while the run is reported as ``auto``, would mislabel it.
    """
    declared = getattr(schedule, "auto_width", None)
    if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1:
        return declared
    if declared is not None:
        raise ConfigError(f"schedule {schedule_name!r} declares auto_width={declared!r}; it must be an integer >= 1")
    kinds = ", ".join(sorted({k for kinds in _AUTO_WIDTH_KINDS.values() for k in kinds} - {"ar"}))
    raise ConfigError(
        f'schedule {schedule_name!r} cannot have its width chosen: width "auto" (the default) chooses widths '
        f"only for {kinds} and auto; give a width (width: 8, --width 8, bench --widths 8), or, as the schedule's "
        'author, declare the width it runs at under "auto" with the class attribute auto_width'
    )


def decoder_overhead(
    model: ModelBackend, builder: MaskBuilder, order: OrderPolicy, rule: AcceptanceRule
) -> tuple[float, float]:
    """The decoder's seconds per call outside the model: a fixed part and a part per row.

    Measured on two short runs, plain AR (one row per call) and Packed-SS at W = 4 (about ten), each the
    fastest of 3 (like the model's table: the machine's cost, not a burst of load), and fitted as a line
    through the two.
    """
    from specframe.decoder import Decoder
    from specframe.schedules.ar import ARSchedule

    special = {model.mask_token_id, *model.eos_token_ids}
    ordinary = [t for t in range(min(model.vocab_size, 64)) if t not in special]
    prompt = [ordinary[(7 * i) % len(ordinary)] for i in range(8)]
    points = []
    saved = model.eos_token_ids
    model.eos_token_ids = ()  # run the full 16 tokens
    try:
        for schedule, width in ((ARSchedule(), 1), (PackedSchedule(), 4)):
            decoder = Decoder(model, builder, schedule, order, rule, width=width, max_new_tokens=16, seed=0)
            runs = [decoder.generate(prompt_ids=prompt).metrics for _ in range(3)]
            rows = [r for m in runs for r in m.rows_per_call[1:]]  # after the prompt call
            points.append((sum(rows) / max(len(rows), 1), min(m.non_model_s / max(m.nfe, 1) for m in runs)))
    finally:
        model.eos_token_ids = saved
    (r0, h0), (r1, h1) = points
    per_row = max((h1 - h0) / (r1 - r0), 0.0) if r1 > r0 else 0.0
    return max(h0 - per_row * r0, 0.0), per_row
