"""The decoding loop: plan -> mask builder -> model -> result -> schedule update, with metrics.

One iteration, as data::

    plan   = schedule.plan(state)              # CallPlan: logical, family-free
    call   = builder.physical(plan)            # PhysicalCall: rows, positions, attention (templated)
    logits = model.forward(cache, call)        # one forward over cached prefix + new rows
    result = builder.read(call, logits)        # CallResult: verifier / drafter logits
    accepted = schedule.update(state, plan, result)  # acceptance, next draft; accepted drafts
    commit pending + accepted draft rows       # rollback is free: the rest is never committed
"""

from __future__ import annotations

import operator
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from specframe.acceptance.base import AcceptanceRule
from specframe.blame import contract_error, plugin_failure
from specframe.errors import ConfigError, InputError, SpecframeError
from specframe.exactness import is_exact
from specframe.masks.base import MaskBuilder
from specframe.metrics import Metrics
from specframe.models.base import ModelBackend
from specframe.models.cache import KVCache
from specframe.orders.base import OrderPolicy
from specframe.plan import CallPlan, PhysicalCall
from specframe.schedules.base import Schedule
from specframe.specs import as_integer
from specframe.state import DecodeContext, DecodeState
from specframe.streaming import IncrementalText

MAX_SEED = 2**64 - 1  # torch generators take 64-bit seeds


def _draft_count(value: object, plan: CallPlan) -> bool:
    """Whether ``value``, returned by a schedule's ``update`` for ``plan``, is a valid count of accepted drafts."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= len(plan.chain)


def fits_context(prompt_tokens: int, max_new_tokens: int, model: ModelBackend) -> bool:
    """Whether a prompt of ``prompt_tokens`` tokens plus ``max_new_tokens`` output tokens fit ``model``'s context.

    The last output token is never fed back, so ``prompt_tokens + max_new_tokens - 1`` positions are needed of
    the ``model.max_positions + 1`` the model has.
    """
    return prompt_tokens + max_new_tokens - 1 <= model.max_positions


def seed_problem(seed: Any) -> str | None:
    """What is wrong with a seed (``None`` when it is a valid one: an integer in ``[0, 2**64 - 1]``)."""
    if as_integer(seed) is None:
        return f"must be an integer in [0, 2**64 - 1] (or None for a fresh random seed), got {seed!r}"
    seed = as_integer(seed)
    if not 0 <= seed <= MAX_SEED:
        return f"must lie in [0, 2**64 - 1], got {seed}; use a non-negative integer below 2**64"
    return None


@dataclass
class Generation:
    """The result of one request.

    Attributes:
        text: Decoded text of the generated tokens (empty when the model has no tokenizer).
        prompt_ids: Prompt token ids.
        output_ids: Generated token ids only, EOS / stop tokens included.
        stop_reason: ``"eos"``, ``"stop_sequence"`` or ``"length"``.
        metrics: What the generation cost.
        exact: Whether the decoder reproduces the verifier's output (its acceptance rule and schedule both
            declare ``exact = True``; see :mod:`specframe.exactness`). When False, the output is not the AR
            model's: a lossy component, or one that did not say.
    """

    text: str
    prompt_ids: list[int]
    output_ids: list[int]
    stop_reason: str
    metrics: Metrics = field(default_factory=Metrics)
    exact: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``specframe generate --json`` prints: every field, the metrics as their dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"metrics": self.metrics.to_dict()}


@dataclass
class StreamPiece:
    """One increment of a streamed generation (see :meth:`Decoder.stream`).

    Attributes:
        text: Text added since the previous piece. It can be empty although tokens were added: text is held
            back while it ends in an incomplete multi-byte character or could be the start of a stop string.
        token_ids: Output token ids added since the previous piece, in textual order.
        generation: The whole result (text, ids, stop reason, metrics) on the last piece; ``None`` before.
    """

    text: str
    token_ids: list[int]
    generation: Generation | None = None

    @property
    def done(self) -> bool:
        """Whether this is the last piece."""
        return self.generation is not None


class Decoder:
    """A composed decoder: one model, its family's mask builder, a schedule, an order and an acceptance rule.

    Build one with :func:`specframe.compose` rather than by hand.

    Args:
        model: The model backend.
        builder: The family's mask builder.
        schedule: The decoding schedule.
        order: The verification order policy.
        rule: The acceptance rule.
        width: Speculative width W (>= 1).
        max_new_tokens: Default output length limit L (>= 1).
        seed: Seed of the random generator (``None``: a fresh random seed per request).
        stop_sequences: Token sequences that end generation once fully accepted.
        stop_texts: Texts that end generation at the output token whose text completes one, whatever tokens
            spell it (needs the model's tokenizer).
        config: The configuration this decoder was composed from (for reports).
    """

    def __init__(
        self,
        model: ModelBackend,
        builder: MaskBuilder,
        schedule: Schedule,
        order: OrderPolicy,
        rule: AcceptanceRule,
        *,
        width: int,
        max_new_tokens: int,
        seed: int | None = 0,
        stop_sequences: Sequence[Sequence[int]] = (),
        stop_texts: Sequence[str] = (),
        config: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.builder = builder
        self.schedule = schedule
        self.order = order
        self.rule = rule
        self.width = width
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.stop_sequences = tuple(tuple(int(t) for t in s) for s in stop_sequences)
        self.stop_texts = tuple(stop_texts)
        if self.stop_texts and model.tokenizer is None:
            raise ConfigError(f"stop strings need a tokenizer, and model {model.name!r} has none; give token ids")
        self.config = dict(config or {})
        #: Whether this decoder reproduces the verifier's output (see :mod:`specframe.exactness`).
        self.exact = is_exact(rule, schedule)

    # -- public API ------------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | None = None,
        *,
        prompt_ids: Sequence[int] | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
    ) -> Generation:
        """Generate a continuation of ``prompt`` (text) or ``prompt_ids`` (token ids).

        Args:
            prompt: Prompt text, tokenized with the model's tokenizer (BOS added per the family).
            prompt_ids: Prompt token ids, used as given.
            max_new_tokens: Override of the decoder's output limit.
            seed: Override of the decoder's seed for this request.

        Raises:
            InputError: No prompt, both kinds given, an empty prompt, unknown token ids, or a prompt plus
                output that does not fit the model's context.
        """
        state = self._request(prompt, prompt_ids, max_new_tokens, seed)
        metrics = Metrics()
        for _ in self._steps(state, metrics):
            pass
        return self._result(state, metrics)

    def stream(
        self,
        prompt: str | None = None,
        *,
        prompt_ids: Sequence[int] | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
    ) -> Iterator[StreamPiece]:
        """Generate like :meth:`generate`, yielding the text and tokens each model call adds.

        The tokens are exactly those :meth:`generate` returns for the same request and seed; the pieces'
        texts concatenate to its ``text``. The last piece carries the whole :class:`Generation`; time spent
        by the caller between pieces is not counted in its metrics. Example::

            for piece in decoder.stream("def fib(n):"):
                print(piece.text, end="", flush=True)
            metrics = piece.generation.metrics

        Raises:
            InputError: As :meth:`generate` (raised at once, before the first piece).
        """
        state = self._request(prompt, prompt_ids, max_new_tokens, seed)
        return self._stream(state)

    def _stream(self, state: DecodeState) -> Iterator[StreamPiece]:
        metrics = Metrics()
        stops = [self.model.decode(s) for s in self.stop_sequences] + list(self.stop_texts)
        text = IncrementalText(self.model.decode, stops)
        sent = 0
        for _ in self._steps(state, metrics):
            ids = state.output_ids()
            if len(ids) > sent:
                piece = StreamPiece(text.update(ids), ids[sent:])
                sent = len(ids)
                yield piece
        result = self._result(state, metrics)
        yield StreamPiece(text.finish(result.output_ids, result.text), result.output_ids[sent:], result)

    def _request(
        self, prompt: str | None, prompt_ids: Sequence[int] | None, max_new_tokens: int | None, seed: Any
    ) -> DecodeState:
        """Validate one request and build its state."""
        ids = self._prompt_ids(prompt, prompt_ids)
        given = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        limit = as_integer(given)
        if limit is None or limit < 1:
            raise InputError(f"max_new_tokens must be an integer >= 1, got {given!r}")
        if not fits_context(len(ids), limit, self.model):
            raise InputError(
                f"prompt of {len(ids)} tokens plus max_new_tokens={limit} exceeds the model's context of "
                f"{self.model.max_positions + 1} positions; shorten the prompt or lower max_new_tokens"
            )
        if seed is not None and seed_problem(seed):
            raise InputError(f"seed {seed_problem(seed)}")
        return DecodeState(ids, limit, self._context(self.seed if seed is None else as_integer(seed)))

    def _result(self, state: DecodeState, metrics: Metrics) -> Generation:
        output = state.output_ids()
        metrics.generated_tokens = len(output)
        metrics.verifications = list(state.verifications)
        return Generation(
            text=self.model.decode(output),
            prompt_ids=list(state.prompt),
            output_ids=output,
            stop_reason=_stop_reason(state, output, state.max_new_tokens),
            metrics=metrics,
            exact=self.exact,
        )

    def describe(self) -> dict[str, Any]:
        """The composed pieces and settings, JSON-friendly."""
        return {
            "model": self.model.describe(),
            "schedule": self.schedule.describe(),
            "order": self.order.describe(),
            "acceptance": self.rule.describe(),
            "width": self.width,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
            "exact": self.exact,
        }

    # -- the loop ----------------------------------------------------------------------------------------
    def _steps(self, state: DecodeState, metrics: Metrics) -> Iterator[None]:
        """Run the decoding loop, yielding after each model call; the clock stops while the caller runs."""
        model, builder, schedule = self.model, self.builder, self.schedule
        # Staging room for the largest call: a window never spans more positions than the output.
        width = min(self.width, state.max_new_tokens)
        cache = model.new_cache(len(state.prompt) + state.max_new_tokens + builder.max_rows(width, 0))
        # Each call resolves at least one position or is a drafting-only call followed by one that does;
        # a schedule that loops without progress is a bug, reported instead of hanging.
        budget = 4 * (state.max_new_tokens + 2) * max(self.width, 1) + 8
        clock, sync = time.perf_counter, self._sync if model.device.type == "cuda" else _no_sync
        rows_per_call, choices = metrics.rows_per_call, metrics.choices
        ledger = getattr(schedule, "exact", None) is not False  # a lossy schedule may commit unverified guesses
        sync()
        started = clock()
        try:
            while not state.done:
                if metrics.nfe >= budget:
                    raise RuntimeError(f"schedule {schedule.name!r} made no progress after {metrics.nfe} calls")
                plan = schedule.plan(state)
                if not isinstance(plan, CallPlan):
                    raise contract_error(schedule, "schedule", f"plan() returned {type(plan).__name__}, not a CallPlan")
                call = builder.physical(plan)
                ids = call.input_ids
                forward_started = clock()
                logits = model.forward(cache, call)
                sync()
                metrics.model_s += clock() - forward_started
                schedule.observe_call(state, ids.shape[0], clock() - forward_started)  # the width chooser's timing
                metrics.nfe += 1
                rows_per_call.append(ids.shape[0])
                choices.append((schedule.label(), plan.width))
                result = builder.read(call, logits)
                verified = len(state.verifications)
                drafts_accepted = schedule.update(state, plan, result)
                if plan.num_verify and len(state.verifications) == verified:
                    raise contract_error(
                        schedule,
                        "schedule",
                        "update() accepted nothing from a call that verified a window; pass the call's result to "
                        "verify_planned_chain (or verify_and_propose), which accepts the verdict into the state",
                    )
                if not _draft_count(drafts_accepted, plan):
                    raise contract_error(
                        schedule,
                        "schedule",
                        f"update() returned {drafts_accepted!r}, not the number of chain tokens it accepted "
                        f"(an int from 0 to {len(plan.chain)}: the verdict's accepted)",
                    )
                if ledger and state.offered != state.granted:
                    raise contract_error(schedule, "schedule", _unverified(state))
                state.calls += 1
                self._commit(state, call, cache, drafts_accepted)
                metrics.wall_s += clock() - started
                yield
                started = clock()
        except SpecframeError:
            raise
        except Exception as exc:  # name the third-party plugin whose code raised it, if any
            failure = plugin_failure(exc, (schedule, self.order, self.rule, builder))
            if failure is None:
                raise
            raise failure from exc
        sync()
        metrics.wall_s += clock() - started

    @staticmethod
    def _commit(state: DecodeState, call: PhysicalCall, cache: KVCache, drafts_accepted: int) -> None:
        """Keep the staged rows of pending tokens and accepted drafts, where the position kept that token.

        The verifier's own token (a correction or bonus) is never committed from this call, even if a row
        happens to carry the same token: it is processed as an input of the next call, as both families'
        layouts expect (appendix D).

        An EOS accepted out of order drops the tokens past it. A row that saw a dropped token is not kept:
        each pending or draft row attends to the whole cache and to the inputs before it (pending tokens in
        generation order, then the chain by rank), so nothing is kept when a cached token was dropped, and
        nothing after the first dropped input. Those tokens stay pending and the next call recomputes them.
        """
        if state.stale_cached:  # a cached token this call attended to was dropped
            cache.drop_positions(state.stale_cached)
            state.stale_cached = set()
            return
        plan, commit_rows = call.plan, call.commit_rows
        accepted = min(drafts_accepted, len(plan.chain))
        inputs = [*plan.pending, *zip(plan.order[:accepted], plan.chain[:accepted], strict=True)]
        rows, positions = [], []
        resolved_token = state.resolved_token
        for position, token in inputs:
            if resolved_token(position) != token:
                break  # dropped past an EOS: every later row of this call saw it
            entry = commit_rows.get(position)
            if entry is not None and entry[1] == token:
                rows.append(entry[0])
                positions.append(position)
        if rows:
            cache.commit(rows, positions)
            state.mark_cached(positions)

    def _context(self, seed: int | None) -> DecodeContext:
        # Every rule gets the request's seeded generator, whatever its ``stochastic`` says: a plugin rule that
        # samples but forgot the flag would otherwise draw from torch's global generator, and a seed would
        # not reproduce its output. (A generator costs a few microseconds per request.)
        generator = torch.Generator(device=self.model.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        return DecodeContext(
            width=self.width,
            order=self.order,
            rule=self.rule,
            traits=self.builder.traits,
            generator=generator,
            eos_token_ids=frozenset(self.model.eos_token_ids),
            stop_sequences=self.stop_sequences,
            stop_texts=self.stop_texts,
            decode=self.model.decode if self.stop_texts else None,
        )

    def _prompt_ids(self, prompt: Any, prompt_ids: Any) -> list[int]:
        if prompt is not None and prompt_ids is not None:
            raise InputError("give either a prompt text or prompt ids, not both")
        if prompt_ids is None:
            if prompt is None:
                raise InputError("no prompt given: pass prompt text or prompt_ids")
            if not isinstance(prompt, str):
                raise InputError(
                    f"the prompt must be text (str), got {type(prompt).__name__} {prompt!r:.60}; pass token ids "
                    "as prompt_ids=[...]"
                )
            if not prompt:
                raise InputError(
                    "the prompt text is empty; give some text, or prompt_ids=[...] (--prompt-ids) to start from "
                    "special tokens alone"
                )
            ids = self.model.encode_prompt(prompt)
        else:
            ids = token_id_list(prompt_ids, "prompt_ids")
        if not ids:
            raise InputError("the prompt is empty: give at least one token")
        bad = [t for t in ids if not 0 <= t < self.model.vocab_size]
        if bad:
            raise InputError(
                f"prompt token ids {bad[:5]} are outside the model's vocabulary [0, {self.model.vocab_size})"
            )
        return ids

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)


def _no_sync() -> None:
    """What the loop calls instead of :meth:`Decoder._sync` where the device runs synchronously (the CPU)."""


def token_id_list(value: Any, name: str) -> list[int]:
    """Validate a list of token ids (a sequence of integers or a 1-D integer tensor) without coercing it.

    Raises:
        InputError: For text, floats, booleans, ``None`` entries, nested lists or tensors that are not 1-D
            integer tensors.
    """
    hint = f"{name} must be a list of integer token ids like [1, 2, 3]"
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise InputError(f"{hint}; got a {value.dim()}-D {str(value.dtype).removeprefix('torch.')} tensor")
        return [int(t) for t in value.tolist()]
    if hasattr(value, "ndim") and hasattr(value, "dtype") and hasattr(value, "tolist"):  # a NumPy array
        if value.ndim != 1 or getattr(value.dtype, "kind", "") not in "iu":
            raise InputError(f"{hint}; got a {value.ndim}-D array of {value.dtype}")
        return [int(t) for t in value.tolist()]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        shown = f"{value!r:.60}"
        raise InputError(f"{hint}; got {type(value).__name__} {shown} (for text, pass it as the prompt)")
    ids = []
    for index, item in enumerate(value):
        if isinstance(item, bool) or type(item).__name__ == "bool_":
            raise InputError(f"{hint}; entry {index} is the boolean {item!r}")
        try:
            ids.append(operator.index(item))
        except TypeError:
            raise InputError(f"{hint}; entry {index} is {type(item).__name__} {item!r:.40}") from None
    return ids


def _unverified(state: DecodeState) -> str:
    """The ledger problem: tokens accepted into ``state`` without a verdict."""
    extra = state.offered - state.granted
    return (
        f"it accepted {extra} token(s) more than the verifier's verdicts allowed ({state.offered} accepted, "
        f"{state.granted} with a verdict); accept tokens only through verify_planned_chain, verify_and_propose "
        "or accept_verdict, or declare the schedule lossy with exact = False"
    )


def _stop_reason(state: DecodeState, output: list[int], limit: int) -> str:
    if output and output[-1] in state.ctx.eos_token_ids:
        return "eos"
    if len(output) < limit:
        return "stop_sequence"
    if state.ctx.stop_sequences and any(
        tuple(output[-len(s) :]) == s for s in state.ctx.stop_sequences if len(s) <= len(output)
    ):
        return "stop_sequence"
    if state.ctx.decode is not None and any(s in state.ctx.decode(output) for s in state.ctx.stop_texts):
        return "stop_sequence"  # generation stops where a stop text first appears: here, at the last token
    return "length"
