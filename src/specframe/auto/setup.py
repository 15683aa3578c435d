"""How ``compose`` turns ``width: "auto"`` and ``schedule: "auto"`` into an :class:`AutoSchedule`.

Nothing here measures anything when a decoder is composed: the schedule gets the cost model given in the
configuration, the fixed :data:`~specframe.auto.costs.NOMINAL_COST`, or a function that reads this machine's
cached cost model at the schedule's first use (calibrating it first, with a one-line notice, if there is none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specframe.acceptance.base import AcceptanceRule
from specframe.auto.costs import NOMINAL_COST, CostModel, cost_model_for
from specframe.auto.schedule import AUTO_MAX_WIDTH, AutoSchedule
from specframe.errors import ConfigError
from specframe.exactness import declared_exact, width_changes_output
from specframe.masks.base import MaskBuilder
from specframe.models.base import ModelBackend
from specframe.orders.base import OrderPolicy
from specframe.schedules.base import Schedule


def check_cost(value: Any) -> None:
    """Refuse a ``cost`` config value that is not ``None``, a :class:`CostModel` or a mapping.

    Raises:
        ConfigError: Naming what was given and what to give.
    """
    if isinstance(value, Mapping):
        CostModel.from_mapping(value)
    elif value is not None and not isinstance(value, CostModel):
        raise ConfigError(
            f"cost must be None (measure this machine), a CostModel or a mapping like {{'tau': 0.007, "
            f"'delta': 0.0002}}, got {value!r}"
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

    A schedule that declares width candidates (:meth:`Schedule.width_candidates`) with ``width: "auto"``
    becomes an :class:`AutoSchedule` over them; ``schedule: "auto"`` chooses among its candidates at the given
    width, or at every width under ``"auto"``. Other schedules take ``"auto"`` as their ``auto_width``. Where
    the widths change the output (:func:`~specframe.exactness.width_changes_output`), the schedule is bound
    ``deterministic``, to ``cost`` if given, else to :data:`NOMINAL_COST`.
    """
    if width == "auto" and not isinstance(schedule, AutoSchedule) and schedule.width_candidates(AUTO_MAX_WIDTH):
        if schedule.rate_model not in ("packed", "kbranch", "quadratic", "linear"):
            raise ConfigError(
                f'schedule {schedule_name!r} declares rate_model={schedule.rate_model!r}; width "auto" knows '
                "'packed', 'kbranch', 'quadratic' and 'linear' (or give a width)"
            )
        exact = declared_exact(schedule)  # the choice is as exact as the schedule it plans with
        kind = AutoSchedule if exact is True else type("AutoSchedule", (AutoSchedule,), {"exact": exact})
        schedule = kind([schedule], name=schedule_name, k=getattr(schedule, "k", 2))
    if not isinstance(schedule, AutoSchedule):
        return schedule, fixed_width(schedule, schedule_name) if width == "auto" else int(width)
    if width != "auto":
        schedule.widths = (int(width),)
    decoder_width = min(AUTO_MAX_WIDTH, model.max_positions + 1) if width == "auto" else int(width)
    deterministic = width_changes_output(order, rule)
    if isinstance(cost, Mapping):
        cost = CostModel.from_mapping(cost)
    if cost is None:
        cost = NOMINAL_COST if deterministic else lambda: cost_model_for(model)
    acceptance = getattr(model, "drafter_acceptance", None)  # measured when the drafter was trained, if shipped
    schedule.bind(cost, lambda plan: builder.build(plan).num_rows, deterministic=deterministic, acceptance=acceptance)
    return schedule, decoder_width


def fixed_width(schedule: Schedule, schedule_name: str) -> int:
    """The width ``width: "auto"`` means for a schedule whose width is not chosen: its ``auto_width``.

    Raises:
        ConfigError: If the schedule declares none (a plugin schedule, by default).
    """
    declared = getattr(schedule, "auto_width", None)
    if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1:
        return declared
    if declared is not None:
        raise ConfigError(f"schedule {schedule_name!r} declares auto_width={declared!r}; it must be an integer >= 1")
    raise ConfigError(
        f'schedule {schedule_name!r} cannot have its width chosen: width "auto" (the default) needs a schedule '
        "that declares a rate_model (packed, linear, quadratic, kbranch and auto do); give a width (width: 8, "
        "--width 8, bench --widths 8), or, as the schedule's author, declare rate_model or the width it runs at "
        'under "auto" with the class attribute auto_width'
    )
