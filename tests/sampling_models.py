"""A tiny model with a context-sensitive drafter and its exact output distribution, for the sampling suite.

:class:`TableModel` is a real :class:`~specframe.models.base.ModelBackend` that follows either family's
conventions, so it runs through the real mask builders, schedules, acceptance rules and decoder loop:

* Nemotron: a clean (causal) row at position ``i`` is the verifier for position ``i + 1``; a MASK row at
  ``i`` is the drafter for ``i``;
* SetDLM: every MASK row at ``i`` predicts position ``i``; it is the verifier when its visible clean tokens
  are exactly the prefix before ``i``.

A row's logits are a fixed pseudo-random vector chosen by (row kind, target position, the set of clean
``(position, token)`` pairs it sees, cached or in the call). So the drafter's proposal changes completely
with its context: a sampler that verifies a draft token against a distribution computed from another context
than the one it was drawn from (another draft group's, an older prefix's) is wrong by a wide margin, which a
goodness-of-fit test detects with a few thousand samples. The keys the model caches encode
``(position, token)``, which is how it reads back what a row sees.

:func:`exact_distribution` enumerates every output of length up to ``length`` by plain AR forward passes over
all prefixes (a fresh cache each time), with the same temperature / top-k / top-p warp as the sampler.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from oracles import stage_pairs
from specframe.acceptance.rejection import SamplingWarp
from specframe.models.base import ModelBackend, ModelCall
from specframe.models.cache import KVCache
from specframe.testing.reference import ar_distribution, goodness_of_fit

NEMOTRON = "nemotron-labs-diffusion"
SETDLM = "setdlm"


class TableModel(ModelBackend):
    """Logits looked up from a pseudo-random table keyed by what each row sees.

    Args:
        family: ``"nemotron-labs-diffusion"`` or ``"setdlm"`` (selects the mask builder and conventions).
        ordinary: Number of ordinary tokens (ids ``0 .. ordinary-1``); then EOS, then the mask token.
        verifier_scale: Spread of the verifier's logits (larger: sharper AR distribution).
        drafter_scale: Spread of the drafter's logits (larger: sharper, more context-dependent proposals).
        eos_bias: Added to the EOS logit (negative: fewer early stops).
        seed: Selects the table.
    """

    num_parameters = 1_000  # a scripted stand-in: the thread policy gives it one thread

    def __init__(
        self,
        family: str,
        *,
        ordinary: int = 3,
        verifier_scale: float = 1.0,
        drafter_scale: float = 2.0,
        eos_bias: float = -1.5,
        seed: int = 0,
    ) -> None:
        self.family = family
        self.name = f"table-{family}-{seed}"
        self.vocab_size = ordinary + 2
        self.eos_token_ids = (ordinary,)
        self.mask_token_id = ordinary + 1
        self.max_positions = 1 << 12
        self.num_layers, self.num_kv_heads, self.head_dim = 1, 1, 2
        self.dtype = torch.float64
        self.scales = {"verifier": verifier_scale, "drafter": drafter_scale}
        self.eos_bias = eos_bias
        self.seed = seed
        self._table: dict[tuple, torch.Tensor] = {}

    # -- the table ---------------------------------------------------------------------------------------
    def row_logits(self, kind: str, target: int, visible: frozenset[tuple[int, int]]) -> torch.Tensor:
        """Logits of a ``kind`` row (``"verifier"`` or ``"drafter"``) for ``target`` seeing ``visible``."""
        key = (kind, target, visible)
        if key not in self._table:
            text = repr((self.seed, kind, target, sorted(visible))).encode()
            seed = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
            noise = np.random.default_rng(seed).standard_normal(self.vocab_size)
            logits = torch.tensor(noise * self.scales[kind], dtype=torch.float64)
            logits[self.eos_token_ids[0]] += self.eos_bias
            logits[self.mask_token_id] = float("-inf")
            self._table[key] = logits
        return self._table[key]

    def verifier_logits(self, prefix: Sequence[int]) -> torch.Tensor:
        """The AR verifier's logits for the position after ``prefix`` (prompt and output tokens)."""
        visible = frozenset(enumerate(prefix))
        kind = "verifier"
        return self.row_logits(kind, len(prefix), visible)

    # -- the backend -------------------------------------------------------------------------------------
    def forward(self, cache: KVCache, call: ModelCall):
        """Look every row's logits up from what it sees (cached rows plus the call's rows it attends to)."""
        input_ids, position_ids, attention = call.input_ids, call.position_ids, call.attention
        output_rows = call.output_rows
        rows = input_ids.shape[0]
        cached = set(stage_pairs(cache, input_ids, position_ids))
        tokens, positions = input_ids.tolist(), position_ids.tolist()
        attend = attention.tolist()
        wanted = range(rows) if output_rows is None else output_rows.tolist()
        out = []
        for row in wanted:
            visible = set(cached)
            visible.update(
                (positions[j], tokens[j]) for j in range(rows) if attend[row][j] and tokens[j] != self.mask_token_id
            )
            seen = frozenset(visible)
            assert len({p for p, _ in seen}) == len(seen), f"row {row} sees two tokens at one position: {seen}"
            is_mask = tokens[row] == self.mask_token_id
            if self.family == NEMOTRON:
                kind, target = ("drafter", positions[row]) if is_mask else ("verifier", positions[row] + 1)
            else:
                target = positions[row]
                kind = "verifier" if {p for p, _ in seen} == set(range(target)) else "drafter"
            if kind == "verifier" and {p for p, _ in seen} != set(range(target)):
                raise AssertionError(f"verifier row for {target} sees {sorted(seen)}, not the whole prefix")
            out.append(self.row_logits(kind, target, seen))
        return torch.stack(out)


def exact_distribution(
    model: ModelBackend,
    prompt: Sequence[int],
    length: int,
    warp: SamplingWarp,
    next_logits: Callable[[list[int]], torch.Tensor] | None = None,
) -> dict[tuple[int, ...], float]:
    """Probability of every output (up to ``length`` tokens, ending early at EOS) under AR sampling.

    ``next_logits(ids)`` gives the verifier's logits after prompt and output ids ``ids``; by default one
    cache-free forward of a :class:`TableModel` (:func:`ar_logits`).
    """
    return ar_distribution(model, prompt, length, warp, next_logits or (lambda ids: ar_logits(model, ids)))


def ar_logits(model: TableModel, prefix: Sequence[int]) -> torch.Tensor:
    """The verifier's logits after ``prefix`` from one forward pass over the whole prefix, cache-free."""
    n = len(prefix)
    cache = model.new_cache(n + 2)
    attention = torch.ones(n, n, dtype=torch.bool).tril()
    if model.family == NEMOTRON:
        ids, positions, row = list(prefix), list(range(n)), n - 1
    else:  # a mask query at position n that sees the whole prefix
        ids, positions, row = [*prefix, model.mask_token_id], [*range(n), n], n
        attention = torch.ones(n + 1, n + 1, dtype=torch.bool).tril()
    logits = model.forward(cache, ModelCall(torch.tensor(ids), torch.tensor(positions), attention, torch.tensor([row])))
    return logits[0]


def gof_pvalue(counts: Mapping[tuple[int, ...], int], exact: Mapping[tuple[int, ...], float]) -> float:
    """Chi-square goodness of fit of sampled outputs to the exact distribution (the public helper's test)."""
    return goodness_of_fit(counts, exact)


def sample_counts(generate: Callable[[int], Sequence[int]], samples: int, first_seed: int = 0) -> Counter:
    """Outputs of ``generate(seed)`` for ``samples`` consecutive seeds."""
    return Counter(tuple(generate(seed)) for seed in range(first_seed, first_seed + samples))
