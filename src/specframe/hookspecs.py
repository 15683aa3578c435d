"""The plugin interfaces of specframe, as pluggy hook specifications: five for decoding, one for commands.

Each hook hands the plugin a ``register(name, factory, **extras)`` callback; a factory is usually the
implementation's class itself, called with the configuration's options. The host stamps each entry
with the plugin that registered it, rejects duplicate names and reports a broken plugin without breaking
the others. A plugin module implements any subset of the hooks with :data:`hookimpl`::

    from specframe import hookimpl

    @hookimpl
    def register_schedules(register):
        register("my-schedule", MySchedule)

Built-in implementations are plugin modules registered exactly like third-party ones.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

hookspec = pluggy.HookspecMarker("specframe")
hookimpl = pluggy.HookimplMarker("specframe")

Register = Callable[..., None]


@hookspec
def register_model_backends(register: Register) -> None:
    """Register model families: ``register(family, loader, model_types=[...])``.

    ``loader(checkpoint)`` returns a :class:`specframe.models.ModelBackend` for the located
    :class:`specframe.models.loading.Checkpoint` (folder, parsed config.json, name, device and dtype, each
    resolved once by ``load_model``); a loader that also takes ``adapter`` supports the proposal-only adapter.
    ``model_types`` lists the ``model_type`` values of ``config.json`` that the family reads.
    """


@hookspec
def register_mask_builders(register: Register) -> None:
    """Register mask builders: ``register(family, factory)``; ``factory(model)`` returns a MaskBuilder."""


@hookspec
def register_order_policies(register: Register) -> None:
    """Register verification orders: ``register(name, factory)``; ``factory(**options)`` returns an OrderPolicy."""


@hookspec
def register_acceptance_rules(register: Register) -> None:
    """Register acceptance rules: ``register(name, factory)``; ``factory(**options)`` returns an AcceptanceRule."""


@hookspec
def register_schedules(register: Register) -> None:
    """Register schedules: ``register(name, factory, family=None)``.

    ``factory(**options)`` returns a Schedule. ``family`` restricts the entry to one model family (used by
    ``native``, which is each family's own diffusion decoder); ``None`` means it works on every family.
    """


@hookspec
def register_commands(register: Register) -> None:
    """Register command-line commands: ``register(name, "package.module:add_parser", help="...")``.

    ``add_parser(subparsers)`` adds the command's argparse parser (named ``name``) and sets its ``handler``,
    which takes the parsed arguments and returns the exit status. The module is imported only when the command
    runs: ``specframe --help`` lists the command with its ``help`` alone.
    """
