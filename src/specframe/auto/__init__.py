"""The width chooser: a pure policy (:mod:`~specframe.auto.policy`), its statistics, rates and cost model.

The dispatching schedule is :mod:`~specframe.auto.schedule` (registered as the built-in schedule ``auto``);
:mod:`~specframe.auto.setup` binds it when a decoder is composed; ``specframe calibrate`` shows or refreshes the
cost model. The wing stands above the schedules it dispatches to, and nothing below it imports it. Nothing is
imported here, so that importing one module of the wing imports only what it needs.
"""
