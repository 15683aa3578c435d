"""The width chooser: a pure policy (:mod:`~specframe.auto.policy`), its statistics, rates and cost model.

The dispatching schedule is :mod:`specframe.schedules.auto`; :mod:`~specframe.auto.setup` binds it when a
decoder is composed, and :mod:`~specframe.auto.cli` is ``specframe calibrate``. Nothing is imported here, so
that importing one module of the wing imports only what it needs.
"""
