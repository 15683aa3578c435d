"""Per-request decoding metrics, counted as the paper counts them (appendix E.5).

One NFE per model forward, the prompt call included; rows per call are the uncached rows each forward
evaluates (Table 2's count, padding included); generated tokens include EOS and stop tokens. Wall time covers
the whole decoding loop (synchronised on GPUs) and splits into model time (the forwards) and non-model time
(planning, layout, acceptance, bookkeeping). Acceptance statistics follow vLLM's definitions.

:meth:`Metrics.merge` pools the metrics of several generations, so that every statistic of the pool (tokens
per NFE, mean acceptance length, ...) is the ratio of totals; :func:`mean_acceptance_length` and
:func:`acceptance_rate` are the two ratios for callers that only hold the totals (the benchmark summary).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from specframe.state import Verification


def mean_acceptance_length(accepted_tokens: float, num_drafts: float) -> float:
    """``1 + accepted / drafts`` (vLLM): tokens per verification that checked a draft (0 without drafts)."""
    return 1.0 + accepted_tokens / num_drafts if num_drafts else 0.0


def acceptance_rate(accepted_tokens: float, draft_tokens: float) -> float:
    """Accepted draft tokens over checked draft tokens (0 without draft tokens)."""
    return accepted_tokens / draft_tokens if draft_tokens else 0.0


@dataclass
class Metrics:
    """What one generation cost and how its drafts fared.

    Attributes:
        nfe: Model forwards.
        generated_tokens: Output tokens (EOS / stop tokens included).
        rows_per_call: Uncached rows evaluated by each forward.
        verifications: One record per verification (drafted chain length, accepted drafts, tokens added);
            for the native decoders, one per diffusion step (tokens committed).
        wall_s: Decoder wall time in seconds.
        model_s: Seconds spent in model forwards.
        prompt_calls: Indices into ``rows_per_call`` of each generation's prompt call (``[0]`` for one
            generation; one per generation after :meth:`merge`), and of its prefill chunks before it.
        choices: Per call, what planned it and at which width: ``(label, width)``, e.g. ``("packed/w4", 4)``
            or ``("ar", 0)`` under ``width: "auto"``; the schedule's name and the decoder's W otherwise;
            ``("prefill", 0)`` for a chunk of a long prompt cached ahead of the first call (chunked prefill).
        batch_rows: Per call, the rows of the forward that evaluated it: all requests' rows of a batched
            forward (:meth:`~specframe.decoder.Decoder.generate_many`), the call's own rows alone. A batched
            forward's whole time counts as each of its requests' model time.
        call_s: Per call, the seconds of the forward that evaluated it (they add up to ``model_s``), so that
            what a method's calls cost can be read by their rows and their choice.
    """

    nfe: int = 0
    generated_tokens: int = 0
    rows_per_call: list[int] = field(default_factory=list)
    verifications: list[Verification] = field(default_factory=list)
    wall_s: float = 0.0
    model_s: float = 0.0
    prompt_calls: list[int] = field(default_factory=lambda: [0])
    choices: list[tuple[str, int]] = field(default_factory=list)
    batch_rows: list[int] = field(default_factory=list)
    call_s: list[float] = field(default_factory=list)

    @classmethod
    def merge(cls, parts: Iterable[Metrics]) -> Metrics:
        """Pool the metrics of several generations: counts and times add up, per-call records concatenate.

        Every statistic of the result is pooled, a ratio of totals (``mean_acceptance_length`` is
        ``1 + all accepted / all drafts``), not a mean of per-generation ratios.
        """
        pooled = cls(prompt_calls=[])
        for part in parts:
            pooled.prompt_calls.extend(len(pooled.rows_per_call) + i for i in part.prompt_calls)
            pooled.nfe += part.nfe
            pooled.generated_tokens += part.generated_tokens
            pooled.rows_per_call.extend(part.rows_per_call)
            pooled.verifications.extend(part.verifications)
            pooled.wall_s += part.wall_s
            pooled.model_s += part.model_s
            pooled.choices.extend(part.choices)
            pooled.batch_rows.extend(part.batch_rows)
            pooled.call_s.extend(part.call_s)
        return pooled

    @property
    def tokens_per_nfe(self) -> float:
        """Generated tokens per model forward."""
        return self.generated_tokens / self.nfe if self.nfe else 0.0

    @property
    def non_model_s(self) -> float:
        """Decoder time outside model forwards."""
        return max(self.wall_s - self.model_s, 0.0)

    @property
    def rows_per_call_max(self) -> int:
        """Largest number of uncached rows in one call after the prompt call (0 if there was none)."""
        prompts = set(self.prompt_calls)
        return max((rows for i, rows in enumerate(self.rows_per_call) if i not in prompts), default=0)

    @property
    def accept_lengths(self) -> list[int]:
        """Tokens added by each verification (accepted drafts + the verifier's token)."""
        return [v.appended for v in self.verifications]

    @property
    def num_drafts(self) -> int:
        """Verifications that checked at least one draft token."""
        return sum(1 for v in self.verifications if v.drafted)

    @property
    def draft_tokens(self) -> int:
        """Draft tokens checked."""
        return sum(v.drafted for v in self.verifications)

    @property
    def accepted_tokens(self) -> int:
        """Draft tokens accepted."""
        return sum(v.accepted for v in self.verifications)

    @property
    def mean_acceptance_length(self) -> float:
        """``1 + accepted / drafts`` (vLLM): tokens per verification that checked a draft."""
        return mean_acceptance_length(self.accepted_tokens, self.num_drafts)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over checked draft tokens."""
        return acceptance_rate(self.accepted_tokens, self.draft_tokens)

    @property
    def tokens_per_verification(self) -> float:
        """Mean tokens added by the verifications that checked a draft (after stopping rules)."""
        drafted = [v.appended for v in self.verifications if v.drafted]
        return sum(drafted) / len(drafted) if drafted else 0.0

    def per_position_acceptance(self) -> list[float]:
        """At each draft rank r: the share of drafts reaching rank r whose rank-r token was accepted (vLLM)."""
        longest = max((v.drafted for v in self.verifications), default=0)
        rates = []
        for rank in range(longest):
            reached = sum(1 for v in self.verifications if v.drafted > rank)
            accepted = sum(1 for v in self.verifications if v.accepted > rank)
            rates.append(accepted / reached if reached else 0.0)
        return rates

    def width_histogram(self) -> dict[int, int]:
        """How many calls were planned at each width (0: a plain AR call)."""
        return dict(sorted(Counter(width for _, width in self.choices).items()))

    def schedule_histogram(self) -> dict[str, int]:
        """How many calls each schedule (with its width, under ``width: "auto"``) planned."""
        return dict(Counter(label for label, _ in self.choices).most_common())

    def acceptance_histogram(self) -> dict[int, int]:
        """How many verifications added each number of tokens."""
        return dict(sorted(Counter(self.accept_lengths).items()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly metrics."""
        return {
            "nfe": self.nfe,
            "generated_tokens": self.generated_tokens,
            "tokens_per_nfe": self.tokens_per_nfe,
            "rows_per_call_max": self.rows_per_call_max,
            "rows_per_call": list(self.rows_per_call),
            "batch_rows": list(self.batch_rows),
            "call_s": [round(s, 7) for s in self.call_s],
            "accept_lengths": self.accept_lengths,
            "wall_s": self.wall_s,
            "model_s": self.model_s,
            "non_model_s": self.non_model_s,
            "widths": {str(k): v for k, v in self.width_histogram().items()},
            "schedules": self.schedule_histogram(),
            "acceptance": {
                "num_drafts": self.num_drafts,
                "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens,
                "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate": self.acceptance_rate,
                "tokens_per_verification": self.tokens_per_verification,
                "per_position_acceptance": self.per_position_acceptance(),
                "histogram": {str(k): v for k, v in self.acceptance_histogram().items()},
            },
        }
