"""The decoding loop: plan -> mask builder -> model -> result -> schedule update, with metrics.

One iteration, as data::

    plan    = schedule.plan(state)              # CallPlan: logical, family-free
    call    = builder.physical(plan)            # PhysicalCall: rows, positions, attention (templated)
    logits  = model.forward(cache, call)        # one forward over cached prefix + new rows
    result  = builder.read(call, logits)        # CallResult: verifier / drafter logits
    outcome = schedule.update(state, plan, result)   # the verdict (and the next draft, stored)
    ledger.settle(schedule, plan, call, outcome)     # accept, stopping rules, commit the valid rows

A :class:`Stepper` runs one iteration of one request at a time (``prepare`` up to the call, ``finish``
after it), so that :meth:`Decoder.generate` and the batched :meth:`Decoder.generate_many` (which packs many
requests' calls into one forward, see :mod:`specframe.batching`) drive the same code.
"""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from specframe import batching
from specframe.acceptance.base import AcceptanceRule
from specframe.blame import contract_error, entry_of, plugin_failure, remember
from specframe.errors import ConfigError, InputError, SpecframeError
from specframe.exactness import is_exact
from specframe.ledger import CacheLedger
from specframe.masks.base import MaskBuilder
from specframe.metrics import Metrics
from specframe.models.base import ModelBackend
from specframe.models.cache import KVCache
from specframe.orders.base import OrderPolicy
from specframe.plan import CallPlan, PhysicalCall, PrefillCall
from specframe.schedules.base import Schedule
from specframe.specs import as_integer
from specframe.state import DecodeContext, DecodeState
from specframe.streaming import IncrementalText

MAX_SEED = 2**64 - 1  # torch generators take 64-bit seeds


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
        stepper = self.stepper(prompt, prompt_ids=prompt_ids, max_new_tokens=max_new_tokens, seed=seed)
        return next(p.generation for p in batching.run([stepper], 1) if p.generation is not None)

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
        stepper = self.stepper(prompt, prompt_ids=prompt_ids, max_new_tokens=max_new_tokens, seed=seed)
        return (piece for _, piece in self._stream_many(batching.run([stepper], 1)))

    def generate_many(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int] | None = None,
        seeds: Sequence[int | None] | None = None,
        widths: Sequence[int] | None = None,
        max_batch: int = 8,
    ) -> list[Generation]:
        """Generate many requests with continuous batching; each result is what :meth:`generate` returns alone.

        Up to ``max_batch`` requests are in flight; each step packs one call of every active request into one
        :meth:`~specframe.models.base.ModelBackend.forward_many`, a finished request leaves between steps and
        the next waiting one joins. Outputs equal decoding each request alone (token for token; with the
        same seed, the same samples: every request has its own generator). Metrics are per request: a
        batched call counts one NFE of each request in it and its whole time as each one's model time
        (``metrics.batch_rows`` records the batch's rows of each call).

        Args:
            prompts: Per request, prompt text or a list of token ids.
            max_new_tokens: One output limit for all, or one per request (``None``: the decoder's).
            seeds: One seed per request (``None`` entries or no list: the decoder's seed, as :meth:`generate`).
            widths: One speculative width per request (``None``: the decoder's width).
            max_batch: Most requests in flight at once (>= 1).

        Returns:
            One :class:`Generation` per prompt, in the order given.

        Raises:
            InputError: As :meth:`generate`, naming the request, or for lists whose lengths differ from
                ``prompts``; raised before anything is decoded.
        """
        results: list[Generation | None] = [None] * len(prompts)
        for progress in self._batched(prompts, max_new_tokens, seeds, widths, max_batch):
            if progress.generation is not None:
                results[progress.key] = progress.generation
        return results  # type: ignore[return-value]

    def stream_many(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int] | None = None,
        seeds: Sequence[int | None] | None = None,
        widths: Sequence[int] | None = None,
        max_batch: int = 8,
    ) -> Iterator[tuple[int, StreamPiece]]:
        """:meth:`generate_many`, yielding ``(request index, piece)`` as each request's calls add tokens.

        Each request's pieces are exactly those :meth:`stream` yields for it alone, its last piece
        (``piece.done``) carrying its :class:`Generation`; requests' pieces interleave in step order.

        Raises:
            InputError: As :meth:`generate_many` (raised at once, before the first piece).
        """
        steps = self._batched(prompts, max_new_tokens, seeds, widths, max_batch)
        return self._stream_many(steps)

    def _stream_many(self, steps: Iterator[batching.Progress]) -> Iterator[tuple[int, StreamPiece]]:
        pieces: dict[int, Pieces] = {}
        for progress in steps:
            stream = pieces.get(progress.key)
            if stream is None:  # the request's first call
                stream = pieces[progress.key] = Pieces(self)
            if progress.generation is not None:
                yield progress.key, pieces.pop(progress.key).last(progress)
                continue
            piece = stream.next(progress)
            if piece is not None:
                yield progress.key, piece

    def stepper(
        self,
        prompt: str | None = None,
        *,
        prompt_ids: Sequence[int] | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
        width: int | None = None,
    ) -> Stepper:
        """One request as a :class:`Stepper`, to drive one model call at a time from outside.

        Arguments as :meth:`generate`, plus ``width`` (the request's speculative width; the decoder's by
        default). The request plans with its own copy of the decoder's schedule (:meth:`Schedule.for_request`),
        so steppers of one decoder can be driven in any interleaving: each gives what its request gives alone.

        Raises:
            InputError: As :meth:`generate`.
        """
        state = self._request(prompt, prompt_ids, max_new_tokens, seed, width)
        return Stepper(self, state, self._schedule_for_request())

    def _schedule_for_request(self) -> Schedule:
        """The decoder's schedule's copy for one request, blamed on the same plugin."""
        schedule = self.schedule
        try:
            copied = schedule.for_request()
        except Exception as exc:
            failure = plugin_failure(exc, (schedule,))
            if failure is None:
                raise
            raise failure from exc
        if not isinstance(copied, Schedule):
            problem = f"for_request() returned {type(copied).__name__}, not a Schedule"
            raise contract_error(schedule, "schedule", problem)
        entry = entry_of(schedule)
        if entry is not None:
            remember(copied, entry)
        return copied

    def _batched(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int | Sequence[int] | None,
        seeds: Sequence[int | None] | None,
        widths: Sequence[int] | None,
        max_batch: int,
    ) -> Iterator[batching.Progress]:
        """Validate every request, then run them with continuous batching (see :func:`specframe.batching.run`)."""
        if as_integer(max_batch) is None or max_batch < 1:
            raise InputError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise InputError(f"prompts must be a list of prompt texts or token-id lists, got {type(prompts).__name__}")
        count = len(prompts)
        limits = _per_request(max_new_tokens, count, "max_new_tokens")
        seeds = _per_request(seeds, count, "seeds")
        widths = _per_request(widths, count, "widths")
        states = []
        for index, prompt in enumerate(prompts):
            text, ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)
            try:
                states.append(self._request(text, ids, limits[index], seeds[index], widths[index]))
            except InputError as exc:
                raise InputError(f"request {index}: {exc}") from None
        steppers = [Stepper(self, state, self._schedule_for_request()) for state in states]
        return batching.run(steppers, max_batch)

    def _request(
        self,
        prompt: str | None,
        prompt_ids: Sequence[int] | None,
        max_new_tokens: int | None,
        seed: Any,
        width: Any = None,
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
        if width is not None and (as_integer(width) is None or width < 1):
            raise InputError(f"width must be an integer >= 1, got {width!r}")
        if width is not None and as_integer(width) > self.model.max_positions + 1:
            context = self.model.max_positions + 1
            raise InputError(
                f"width {as_integer(width)} exceeds the model's context of {context} positions: a window can never "
                f"be wider than that; use a width <= {context}"
            )
        seed = self.seed if seed is None else as_integer(seed)
        return DecodeState(ids, limit, self._context(seed, self.width if width is None else as_integer(width)))

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

    @functools.cached_property
    def stop_strings(self) -> list[str]:
        """The stop sequences as text, then the stop texts (what a stream holds back until it is sure)."""
        return [self.model.decode(s) for s in self.stop_sequences] + list(self.stop_texts)

    def sync(self) -> None:
        """Wait for the model's device to finish queued work (so that a forward's time is its own)."""
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    def _context(self, seed: int | None, width: int) -> DecodeContext:
        # Every rule gets the request's seeded generator, whatever its ``stochastic`` says: a plugin rule that
        # samples but forgot the flag would otherwise draw from torch's global generator, and a seed would
        # not reproduce its output. (A generator costs a few microseconds per request.)
        generator = torch.Generator(device=self.model.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        return DecodeContext(
            width=width,
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


class Stepper:
    """One request decoded one model call at a time, driven from outside (a batch, a server, :meth:`Decoder.generate`).

    A driver repeats: ``call = stepper.prepare()`` (``None`` once the request is done), evaluates the call
    against ``stepper.cache`` (alone, or packed with other requests' calls into one
    :meth:`~specframe.models.base.ModelBackend.forward_many`), then ``stepper.finish(logits, seconds,
    batch_rows)``. Make one with :meth:`Decoder.stepper`.

    Attributes:
        state: The request's decoding state.
        schedule: The schedule planning this request.
        cache: The request's KV cache (allocated by the first :meth:`prepare`).
        ledger: The request's :class:`~specframe.ledger.CacheLedger` (which gets the cache with it).
        metrics: What the request has cost so far.
    """

    def __init__(self, decoder: Decoder, state: DecodeState, schedule: Schedule) -> None:
        self.decoder, self.state, self.schedule = decoder, state, schedule
        self.model = decoder.model
        #: Most prompt tokens one call evaluates: a longer prompt is cached in chunks of this many rows before
        #: the schedule's first call (chunked prefill, so that a long prompt does not stall a batch's step);
        #: ``None``: the whole prompt in the first call.
        self.prefill_chunk: int | None = None
        self._prefills = 0
        #: Makes the request's cache at its first call (the model's ``new_cache``; a batch with a block pool
        #: gives its pool's instead, see :class:`specframe.batching.Batch`).
        self.new_cache = decoder.model.new_cache
        self.metrics = Metrics()
        self.cache: KVCache | None = None
        self.ledger = CacheLedger(state)
        self._plan: CallPlan | None = None
        self._call: PhysicalCall | None = None
        # Each call resolves at least one position or is a drafting-only call followed by one that does;
        # a schedule that loops without progress is a bug, reported instead of hanging.
        self._budget = 4 * (state.max_new_tokens + 2) * max(state.ctx.width, 1) + 8

    @property
    def done(self) -> bool:
        """Whether the request is complete."""
        return self.state.done

    @property
    def capacity(self) -> int:
        """KV cache rows the request needs: prompt, output, and staging room for its largest call."""
        state, builder = self.state, self.decoder.builder
        width = min(state.ctx.width, state.max_new_tokens)  # a window never spans more positions than the output
        return len(state.prompt) + state.max_new_tokens + builder.max_rows(width, 0)

    def prepare(self) -> PhysicalCall | PrefillCall | None:
        """Plan the request's next call and lay it out; ``None`` when the request is done.

        A long prompt's first calls are :class:`~specframe.plan.PrefillCall` chunks when
        :attr:`prefill_chunk` is set.

        Raises:
            PluginError: A plugin's plan is not a ``CallPlan``, or a plugin's code raised.
        """
        state, schedule = self.state, self.schedule
        if state.done:
            return None
        started = time.perf_counter()
        try:
            if self.cache is None:
                self.cache = self.ledger.cache = self.new_cache(self.capacity)
            chunk = self.prefill_chunk
            if chunk is not None and state.first_call and len(state.pending) > chunk:
                self._plan, self._call = None, PrefillCall.of(state.pending[:chunk], self.model.device)
                self.metrics.wall_s += time.perf_counter() - started
                return self._call
            if self.metrics.nfe - self._prefills >= self._budget:
                raise RuntimeError(f"schedule {schedule.name!r} made no progress after {self.metrics.nfe} calls")
            plan = schedule.plan(state)
            if not isinstance(plan, CallPlan):
                raise contract_error(schedule, "schedule", f"plan() returned {type(plan).__name__}, not a CallPlan")
            self._plan, self._call = plan, self.decoder.builder.physical(plan)
        except Exception as exc:
            failure = self._blamed(exc)
            if failure is None:
                raise
            raise failure from exc
        self.metrics.wall_s += time.perf_counter() - started
        return self._call

    def finish(self, logits: torch.Tensor, seconds: float, batch_rows: int | None = None) -> None:
        """Apply the logits of the prepared call: the schedule judges, the ledger accepts and commits.

        Args:
            logits: The model's output for the call.
            seconds: Wall time of the forward that evaluated it (the whole batched forward's, in a batch).
            batch_rows: Rows of the batched forward (``None`` when the call ran alone).

        Raises:
            PluginError: The schedule's outcome breaks its contract, or a plugin's code raised.
        """
        started = time.perf_counter()
        plan, call, schedule, metrics = self._plan, self._call, self.schedule, self.metrics
        if call is None:
            raise RuntimeError("finish() without a prepared call: call prepare() first")
        self._call = None
        metrics.model_s += seconds
        metrics.wall_s += seconds
        metrics.nfe += 1
        metrics.rows_per_call.append(call.num_rows)
        metrics.batch_rows.append(call.num_rows if batch_rows is None else batch_rows)
        metrics.call_s.append(seconds)
        if isinstance(call, PrefillCall):  # a chunk of the prompt: cached as it is, nothing to judge
            metrics.choices.append(("prefill", 0))
            metrics.prompt_calls.append(metrics.nfe)  # the prompt's call is the one after its chunks
            self._prefills += 1
            self.ledger.prefill(call.pairs)
            metrics.wall_s += time.perf_counter() - started
            return
        metrics.choices.append((schedule.label(), plan.width))
        try:
            # What the call cost, seen before its result changes the state (the width chooser's timing).
            schedule.observe_call(self.state, call.num_rows, seconds, batch_rows)
            outcome = schedule.update(self.state, plan, self.decoder.builder.read(call, logits))
            self.ledger.settle(schedule, plan, call, outcome)
        except Exception as exc:
            failure = self._blamed(exc)
            if failure is None:
                raise
            raise failure from exc
        metrics.wall_s += time.perf_counter() - started

    def sync(self) -> None:
        """Wait for the model's device (see :meth:`Decoder.sync`)."""
        self.decoder.sync()

    def output_ids(self) -> list[int]:
        """The output token ids accepted so far, in textual order."""
        return self.state.output_ids()

    def result(self) -> Generation:
        """The request's result so far (its whole result once :attr:`done`)."""
        state, metrics, model = self.state, self.metrics, self.decoder.model
        output = state.output_ids()
        metrics.generated_tokens = len(output)
        metrics.verifications = list(state.verifications)
        return Generation(
            text=model.decode(output),
            prompt_ids=list(state.prompt),
            output_ids=output,
            stop_reason=_stop_reason(state, output, state.max_new_tokens),
            metrics=metrics,
            exact=self.decoder.exact,
        )

    def _blamed(self, exc: Exception) -> Exception | None:
        """A ``PluginError`` naming the third-party plugin whose code raised ``exc`` (``None``: none did)."""
        if isinstance(exc, SpecframeError):
            return None
        decoder = self.decoder
        return plugin_failure(exc, (self.schedule, decoder.order, decoder.rule, decoder.builder))


class Pieces:
    """The stream pieces of one request, made from its :class:`~specframe.batching.Progress`: text and tokens.

    Args:
        decoder: The request's decoder (its tokenizer and stop strings).
    """

    def __init__(self, decoder: Decoder) -> None:
        self.text, self.ids = IncrementalText(decoder.model.decode, decoder.stop_strings), []

    def next(self, progress: batching.Progress) -> StreamPiece | None:
        """The piece a call added (``None`` when it added no output token)."""
        if not progress.ids:
            return None
        self.ids += progress.ids
        return StreamPiece(self.text.update(self.ids), list(progress.ids))

    def last(self, progress: batching.Progress) -> StreamPiece:
        """The last piece, with the :class:`Generation`."""
        result = progress.generation
        return StreamPiece(self.text.finish(result.output_ids, result.text), list(progress.ids), result)


def _per_request(value: Any, count: int, name: str) -> list[Any]:
    """``value`` for each of ``count`` requests: one value (or ``None``) for all, or a list of one per request."""
    if value is None or as_integer(value) is not None:
        return [value] * count
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InputError(f"{name} must be one integer or a list of one per prompt, got {type(value).__name__}")
    if len(value) != count:
        raise InputError(f"{name} has {len(value)} entries for {count} prompts; give one per prompt")
    return list(value)


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
