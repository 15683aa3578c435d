"""The schedule interface and the verification steps every speculative schedule shares.

A schedule turns the decoding state into one :class:`~specframe.plan.CallPlan` per model call and folds the
call's result back into the state. It never sees physical rows or model families; what a family's layout can
express reaches it as :class:`~specframe.plan.LayoutTraits`.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from specframe.acceptance.base import DraftRef, Proposals, Verdict, draft_tokens
from specframe.blame import contract_error
from specframe.hostread import read_together
from specframe.plan import CallPlan, CallResult, DraftGroup, Guess
from specframe.state import DecodeState

#: Widths ``width: "auto"`` considers (up to the decoder's width, at most 16).
AUTO_WIDTHS = (*range(1, 9), 10, 12, 16)


class Schedule(ABC):
    """Plans model calls and applies their results.

    One schedule object plans one request. The decoder composes a template and gives every request its own
    :meth:`for_request` copy, so a schedule keeps what it must remember between the calls of a request on
    ``self``, and requests (interleaved streams, batches, a server's clients) never see each other's. What the
    requests of a decoder share must be an object the schedule holds on purpose (the built-in ``auto`` width
    chooser's :class:`~specframe.auto.policy.Learning`), and sharing it may change how fast a request decodes,
    never what it outputs.
    """

    #: Registered name (for metrics and error messages).
    name: str = ""

    #: Whether the decoder's width W means anything to this schedule. ``compose`` refuses a width other than
    #: ``"auto"`` (or 1) for a schedule that sets this to False, such as ``ar``, rather than ignore it.
    takes_width: bool = True

    #: The steady-state chain by which ``width: "auto"`` predicts this schedule's tokens per call: ``packed``,
    #: ``kbranch``, ``quadratic`` or ``linear`` (see :mod:`specframe.auto.rates`; a subclass of a built-in
    #: schedule inherits its own). ``None`` (the default): its width is not chosen per call.
    rate_model: str | None = None
    #: The fixed width W this schedule runs at under ``width: "auto"`` (the default) when it declares no
    #: ``rate_model``. ``None`` (the default): ``"auto"`` is then a ``ConfigError`` that asks for a width, so a
    #: plugin schedule never runs at a width nobody chose. The built-in ``native`` schedules set 8.
    auto_width: int | None = None
    #: Whether the schedule commits only what the acceptance rule verified, so that the output is the
    #: verifier's: ``True`` for the built-in speculative schedules, ``False`` for a lossy one (the ``native``
    #: decoders), ``None`` when not declared (then not assumed exact). A schedule that is not declared
    #: ``False`` commits only tokens with a verdict: its ``update`` returns a ``Verdict`` (from
    #: :func:`verify_planned_chain` or :func:`verify_and_propose`), never a :class:`~specframe.plan.Guess`;
    #: the decoder raises a ``PluginError`` naming it otherwise. A subclass of a built-in schedule declares
    #: its own (see :mod:`specframe.exactness`).
    exact: bool | None = None

    @abstractmethod
    def plan(self, state: DecodeState) -> CallPlan:
        """The next call to make (only called while ``state.done`` is False)."""

    @abstractmethod
    def update(self, state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict | Guess | None:
        """Judge the result of ``plan``'s call and store the next draft (and scores); accept nothing yourself.

        Returns:
            What the call decided, for the request's :class:`~specframe.ledger.CacheLedger` to accept: the
            ``Verdict`` of :func:`verify_planned_chain` / :func:`verify_and_propose` when the plan verified
            something (``num_verify > 0``), ``None`` for a drafting-only call, or a
            :class:`~specframe.plan.Guess` of unverified tokens from a lossy schedule (``exact = False``).
            Drafts stored here at positions the verdict resolves are dropped when it is accepted.
        """

    def for_request(self) -> Schedule:
        """This schedule's planner for one request (the decoder calls it once per request).

        A shallow copy: attributes set on ``self`` while planning a request stay that request's, and objects
        the template holds are shared by all its requests. Override it where a copy must not share an object
        (give it a fresh one) or must hold a copy of a wrapped schedule (call its ``for_request``).
        """
        return copy.copy(self)

    def width_candidates(self, maximum: int) -> tuple[int, ...]:
        """The widths ``width: "auto"`` chooses among for this schedule, up to ``maximum``; 0 is a plain AR call.

        Empty when the schedule declares no ``rate_model`` (then ``"auto"`` means ``auto_width``). Packed-SS
        and k-branch start at 2 (at W = 1 they draft only the position their own verifier fills), and
        Packed-SS also falls back to plain AR calls. Override it to offer other widths.
        """
        if self.rate_model is None:
            return ()
        widths = tuple(w for w in AUTO_WIDTHS if w <= maximum) or (maximum,)
        if self.rate_model in ("packed", "kbranch") and len(widths) > 1:
            widths = widths[1:]
        return (0, *widths) if self.rate_model == "packed" else widths

    def observe_call(self, state: DecodeState, rows: int, seconds: float, batch_rows: int | None = None) -> None:
        """What the decoder measured of the model call this schedule just planned for ``state``: a no-op here.

        Args:
            state: The request's state (its ``first_call`` is still True for the prompt's call).
            rows: This request's rows in the call.
            seconds: Wall time of the forward.
            batch_rows: Total rows of the forward when it was shared with other requests; ``None`` alone.
        """
        return None

    def describe(self) -> dict[str, object]:
        """JSON-friendly description."""
        return {"name": self.name}

    def label(self) -> str:
        """What planned the last call, for the metrics' histogram (a schedule that delegates names its pick)."""
        return self.name


class VerificationWindow(NamedTuple):
    """The active window in verification order, with the draft chain that covers its leading ranks.

    (A named tuple: made once per call, and cheaper to make than a frozen dataclass, which sets each field
    through ``object.__setattr__``; see ``docs/performance.md#host-side-choices``.)

    Attributes:
        order: Window positions in rank order, possibly followed by one bonus position.
        chain: Stored drafts for the leading ranks (kappa of them).
        num_verify: Ranks that need a verifier distribution (m).
        window_size: Unresolved positions in the window (u), excluding any bonus position.
    """

    order: tuple[int, ...]
    chain: tuple[DraftRef, ...]
    num_verify: int
    window_size: int

    @property
    def window(self) -> tuple[int, ...]:
        """The window's positions in increasing order (no bonus position)."""
        return tuple(sorted(self.order[: self.window_size]))


def verification_window(state: DecodeState) -> VerificationWindow:
    """Order the active window and find the draft chain to verify (Algorithm 3, lines 3-6).

    The chain is the run of leading ranks that hold a stored draft token. The verifier scores ranks up to
    one past the chain, inside the window; a family with a free bonus (a shifted next-token verifier) also
    scores the position right after a fully drafted, left-to-right window.
    """
    ctx = state.ctx
    window = state.window()
    order = ctx.order.order(window, state.scores)
    in_order = order == window  # (a left-to-right policy's order needs no further check)
    if not in_order and sorted(order) != window:
        raise contract_error(
            ctx.order, "order policy", f"order() returned {order} for the window {window}, not a permutation of it"
        )
    if not in_order and ctx.order.left_to_right:
        raise contract_error(
            ctx.order,
            "order policy",
            f"it sets left_to_right = True, but order() returned {order} for the window {window}; set it to False "
            "unless the order is always increasing",
        )
    chain = list(map(state.drafts.get, order))  # the stored drafts by rank, up to the first rank without one
    if None in chain:
        del chain[chain.index(None) :]
    size = len(order)
    num_verify = min(len(chain) + 1, size)
    if len(chain) == size and size and ctx.traits.free_bonus:
        bonus = order[-1] + 1
        if (
            bonus <= state.end
            and not state.is_resolved(bonus)
            and order[-1] - order[0] == size - 1
            and (in_order or order == list(range(order[0], bonus)))
        ):
            order = [*order, bonus]
            num_verify = size + 1
    return VerificationWindow(tuple(order), tuple(chain), num_verify, size)


def planned_chain(state: DecodeState, plan: CallPlan) -> tuple[DraftRef, ...]:
    """The stored drafts (with their proposals) that ``plan``'s chain was built from."""
    drafts = state.drafts
    return tuple([drafts[p] for p in plan.order[: len(plan.chain)]])


def verify_planned_chain(state: DecodeState, plan: CallPlan, result: CallResult) -> Verdict:
    """Run the acceptance rule on ``plan``'s chain; returns the verdict (for ``update`` to return)."""
    ctx = state.ctx
    chain = planned_chain(state, plan)
    verdict = ctx.rule.verify(chain, result.verify_logits, ctx.generator)
    if not isinstance(verdict, Verdict):
        raise contract_error(ctx.rule, "acceptance rule", f"verify() returned {type(verdict).__name__}, not a Verdict")
    return verdict


def verify_and_propose(state: DecodeState, plan: CallPlan, result: CallResult) -> tuple[Verdict, Proposals | None]:
    """Verify ``plan``'s chain and propose its first draft group from one call (Packed-SS's step).

    The acceptance rule treats verifier and drafter rows together (:meth:`AcceptanceRule.propose_and_verify`),
    and the verdict and the proposals reach the host in one transfer. The proposals are for :func:`store_drafts`
    (``None`` when the group has no targets); ``update`` returns the verdict.
    """
    ctx = state.ctx
    chain = planned_chain(state, plan)
    num_verify = plan.num_verify  # the builder returns one verifier row per rank, one drafter row per target
    rows = num_verify + len(plan.drafts[0].targets)
    logits = result.logits
    if logits is None:
        logits = torch.cat([result.verify_logits, result.draft_logits[0]])
    elif logits.shape[0] != rows:
        logits = logits[:rows]
    pair = ctx.rule.propose_and_verify(chain, logits, num_verify, ctx.generator)
    problem = _pair_problem(pair)
    if problem:
        raise contract_error(ctx.rule, "acceptance rule", problem)
    proposals, verdict = pair
    if proposals is not None and ctx.order.uses_scores:
        proposals.with_scores()
    read_together(verdict, proposals)
    return verdict, proposals


def _pair_problem(pair: object) -> str | None:
    """What is wrong with ``pair`` as the ``(Proposals or None, Verdict)`` of ``propose_and_verify``, if anything."""
    if not isinstance(pair, tuple) or len(pair) != 2:
        return f"propose_and_verify() returned {type(pair).__name__}, not a pair (Proposals or None, Verdict)"
    if pair[0] is not None and not isinstance(pair[0], Proposals):
        return f"its proposals (from propose() or propose_and_verify()) are a {type(pair[0]).__name__}, not Proposals"
    if not isinstance(pair[1], Verdict):
        return f"its verdict (from verify() or propose_and_verify()) is a {type(pair[1]).__name__}, not a Verdict"
    return None


def store_drafts(
    state: DecodeState, targets: tuple[int, ...], proposals: Proposals | None, *, keep_scores: bool = False
) -> None:
    """Make ``proposals`` (one per target, in order) the state's draft, at targets still unresolved.

    Args:
        state: The decoding state.
        targets: Positions the proposals are for.
        proposals: The drafter's proposals (``None`` when there are no targets).
        keep_scores: Keep the state's existing confidence scores instead of the proposals' (Linear-SS
            orders by the verifier's confidence, not the drafter's).
    """
    if not targets:
        state.set_drafts({}, state.scores if keep_scores else {})
        return
    drafts = {p: DraftRef(proposals, i) for i, p in enumerate(targets)}
    if keep_scores:
        scores = state.scores
    elif state.ctx.order.uses_scores:
        scores = dict(zip(targets, proposals.score_list, strict=True))
    else:
        scores = {}
    state.set_drafts(drafts, scores)


def propose(state: DecodeState, logits) -> Proposals | None:
    """Draft tokens from drafter logits with the request's acceptance rule (``None`` for no targets)."""
    if logits.shape[0] == 0:
        return None
    proposals = state.ctx.rule.propose(logits, state.ctx.generator)
    return proposals.with_scores() if state.ctx.order.uses_scores else proposals


def store_group(
    state: DecodeState, plan: CallPlan, result: CallResult, group: int = 0, *, keep_scores: bool = False
) -> None:
    """Propose ``plan``'s draft group ``group`` from its drafter logits and make that the stored draft.

    The proposals (with the distributions they were drawn from) are kept at the group's targets that are
    still unresolved; see :func:`store_drafts` for ``keep_scores``.
    """
    proposals = propose(state, result.draft_logits[group])
    store_drafts(state, plan.drafts[group].targets, proposals, keep_scores=keep_scores)


def draft_plan(state: DecodeState, targets: tuple[int, ...]) -> CallPlan:
    """A drafting-only plan: nothing to verify, one draft group over ``targets`` from the verified prefix."""
    return CallPlan(
        pending=state.pending,
        order=(),
        chain=(),
        num_verify=0,
        drafts=(DraftGroup(context=0, targets=targets),),
        width=state.width,
    )


def verify_only_plan(state: DecodeState) -> CallPlan:
    """A plan that verifies the stored draft over the window and drafts nothing (an AR call if none is stored)."""
    return window_plan(state, verification_window(state))


def window_plan(
    state: DecodeState, window: VerificationWindow, drafts: tuple = (), *, width: int | None = None
) -> CallPlan:
    """A plan that verifies ``window`` and proposes ``drafts`` in the same call."""
    return CallPlan(
        pending=state.pending,
        order=window.order,
        chain=draft_tokens(window.chain),
        num_verify=window.num_verify,
        drafts=tuple(drafts),
        width=state.width if width is None else width,
    )
