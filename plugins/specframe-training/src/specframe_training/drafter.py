"""Training a drafter for a converted AR model: a proposal-only LoRA, on the model's own greedy text.

A model converted from an AR checkpoint (``specframe convert``) verifies exactly as the source model, but its
diffusion mode (MASK rows predicting their own position) was never trained. This module trains the
proposal-only LoRA on ``o_proj``, and optionally a second one on the MLP's ``down_proj`` (``mlp_rank``), in
the PEFT layout that :mod:`specframe.models.lora` loads (the adapters run on drafting rows only, so
verification, and so every schedule's output, stays the base model's) with the base frozen:

1. **Self-distilled data.** The base model continues a prompt set the project writes
   (:mod:`specframe_training.prompts`) greedily, in batches with a key/value prefix. Greedy verification
   accepts a draft token exactly when it equals the base model's argmax, so these continuations are what the
   drafter must learn to propose.
2. **Drafting blocks.** Each step takes windows ``[prompt | continuation]``; the clean rows run once without
   gradients (their keys and values are captured per layer), then drafting blocks laid out as at inference
   (``[last token, MASK x W]`` at a random point of the continuation, sometimes seedless ``MASK x (W + 1)``)
   attend to the clean rows before them and bidirectionally within the block, with the adapter on. A masked
   row's loss is the cross-entropy against the base model's token at its position.
3. **Evaluation** on held-out continuations: the top-1 agreement of the drafter with the base model by offset
   after the seed (offset 1 is the token right after the last accepted one), which bounds the acceptance
   rate of a draft at that offset.

A run lives in a work folder (``data.pt``, ``state.pt``, ``log.jsonl``, ``summary.json``, ``curves.png``,
``adapter/``) and resumes from its last saved state.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specframe.errors import ConfigError
from specframe.models.layers import LowRankUpdate
from specframe.models.lora import ACCEPTANCE_FILE, TARGETS
from specframe.models.transformer import DecoderNetwork
from specframe_training.forward import TrainingForward

ADAPTER_FOLDER = "adapter"
#: Settings a resumed run may change (how long it runs, how often it reports and on what, when it stops).
_MAY_CHANGE = frozenset({"steps", "eval_every", "save_every", "patience", "fit_eval"})
#: What a run folder written before a setting existed trained with (its settings.json lacks the key).
_BEFORE = {"near_weight": 1.0, "distill": 0.0, "init_from": None, "patience": 0, "mlp_rank": 0, "mlp_alpha": None}
#: Offsets whose agreement decides when a run has flattened (what Packed-SS verifies).
_WATCHED = ("2", "3", "4")


@dataclass(frozen=True)
class DrafterConfig:
    """Settings of a drafter training run.

    Attributes:
        prompts: Training prompts continued by the base model.
        held_out: Of those, prompts kept for evaluation only.
        new_tokens: Greedy tokens generated per prompt.
        max_prompt_tokens: Longest prompt kept (longer ones are skipped).
        rank: LoRA rank (of the adapter on each layer's attention ``o_proj``).
        alpha: LoRA alpha (the update is scaled by ``alpha / rank``); ``None``, the default: ``2 * rank``, so
            that the scale stays 2 whatever the rank.
        mlp_rank: Rank of a second LoRA, on each layer's MLP ``down_proj`` (saved as PEFT's ``rank_pattern``);
            0, the default: none.
        mlp_alpha: Its alpha; ``None``, the default: ``2 * mlp_rank`` (no value without an MLP adapter).
        steps: Optimizer steps.
        batch_size: Windows per step.
        blocks: Drafting blocks per window.
        max_width: Largest draft width W of a block (``W + 1`` rows with its seed).
        seedless_prob: Chance a block has no seed (the first call's layout).
        lr: Peak AdamW learning rate (linear warm-up, cosine decay to a tenth).
        warmup: Warm-up steps.
        eval_every: Steps between evaluations.
        save_every: Steps between saved states.
        gen_batch: Prompts generated at once.
        seed: Seed of the prompt choice, initialisation and block sampling.
        bf16: Run matrix products in bfloat16 autocast (weights and optimizer stay float32).
        near_weight: Loss weight of rows at offset 0 or 1 (offsets 2 and beyond weigh 1). Packed-SS drafts one
            call ahead, so every draft it verifies sits at offset 2 or more; Linear-SS verifies offset 1 first.
        distill: Share of the loss that is the KL divergence from the base model's distribution at the row's
            position (the rest: cross-entropy against its greedy token), so a drafter learns the base model's
            second choices, which decide near-ties, and not its argmax only.
        init_from: An adapter folder (PEFT layout) to start from, e.g. the drafter shipped with a model;
            ``None``: fresh adapters. Its ``o_proj`` adapter must have ``rank``; a ``down_proj`` adapter in it
            must have ``mlp_rank``, and without one a run with ``mlp_rank`` > 0 starts its MLP adapter fresh.
        patience: Stop after this many evaluations without the mean agreement at offsets 2-4 rising by 0.003
            over its best (0: run all ``steps``).
        fit_eval: Training continuations evaluated beside the held-out ones at every evaluation (the first
            ones of the shuffled training set; 0: none), logged as ``fit``: the gap between the two curves says
            whether a drafter is short of fit (both low) or of data (fit high, held-out low). Evaluation only:
            it changes nothing the run trains on, and a resumed run may change it.
    """

    prompts: int = 640
    held_out: int = 48
    new_tokens: int = 128
    max_prompt_tokens: int = 192
    rank: int = 64
    alpha: float | None = None
    mlp_rank: int = 0
    mlp_alpha: float | None = None
    steps: int = 600
    batch_size: int = 4
    blocks: int = 32
    max_width: int = 8
    seedless_prob: float = 0.1
    lr: float = 1e-3
    warmup: int = 20
    eval_every: int = 50
    save_every: int = 25
    gen_batch: int = 32
    seed: int = 0
    bf16: bool = True
    near_weight: float = 0.35
    distill: float = 0.5
    init_from: str | None = None
    patience: int = 0
    fit_eval: int = 48

    def __post_init__(self) -> None:
        if self.alpha is None and isinstance(self.rank, int):
            object.__setattr__(self, "alpha", 2.0 * self.rank)  # frozen: set once, as the default of this rank
        if self.mlp_alpha is None and isinstance(self.mlp_rank, int) and self.mlp_rank > 0:
            object.__setattr__(self, "mlp_alpha", 2.0 * self.mlp_rank)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"drafter setting {f.name} must be an integer, got {value!r}")
        positive = (
            "prompts",
            "new_tokens",
            "max_prompt_tokens",
            "rank",
            "steps",
            "batch_size",
            "blocks",
            "max_width",
            "eval_every",
            "save_every",
            "gen_batch",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"drafter setting {name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.held_out < self.prompts:
            raise ConfigError(f"held_out must be in [0, prompts), got {self.held_out}")
        for name in ("lr", "alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"drafter setting {name} must be a number > 0, got {value!r}")
        for name in ("seedless_prob", "near_weight", "distill"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ConfigError(f"drafter setting {name} must be a number in [0, 1], got {value!r}")
        if self.patience < 0:
            raise ConfigError(f"drafter setting patience must be >= 0, got {self.patience}")
        if self.fit_eval < 0:
            raise ConfigError(f"drafter setting fit_eval must be >= 0 (0: no fit evaluation), got {self.fit_eval}")
        if self.mlp_rank < 0:
            raise ConfigError(f"drafter setting mlp_rank must be >= 0 (0: no MLP adapter), got {self.mlp_rank}")
        if self.mlp_rank == 0 and self.mlp_alpha is not None:
            raise ConfigError(
                f"drafter setting mlp_alpha={self.mlp_alpha!r} needs an MLP adapter: give --set mlp_rank=N too"
            )
        value = self.mlp_alpha
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ConfigError(f"drafter setting mlp_alpha must be a number > 0, got {value!r}")
        if self.init_from is not None and not isinstance(self.init_from, str):
            raise ConfigError(f"drafter setting init_from must be an adapter folder path, got {self.init_from!r}")


# -- self-distilled data ------------------------------------------------------------------------------------
@torch.no_grad()
def batched_greedy(
    forward: TrainingForward, prompts: list[list[int]], new_tokens: int, eos: set[int], autocast: bool
) -> list[list[int]]:
    """Greedy continuations of ``prompts`` (each up to ``new_tokens`` tokens, ending at an EOS), batched.

    The prompts are left-padded; padding rows are seen by no row. Each step runs one row per sequence over the
    keys and values captured so far.
    """
    size, longest = len(prompts), max(len(p) for p in prompts)
    device = forward.device
    ids = torch.zeros(size, longest, dtype=torch.long)
    valid = torch.zeros(size, longest, dtype=torch.bool)
    for b, prompt in enumerate(prompts):
        ids[b, longest - len(prompt) :] = torch.tensor(prompt)
        valid[b, longest - len(prompt) :] = True
    ids, valid = ids.to(device), valid.to(device)
    positions = (valid.cumsum(1) - 1).clamp(min=0)
    eye = torch.eye(longest, dtype=torch.bool, device=device)
    mask = (torch.ones(longest, longest, dtype=torch.bool, device=device).tril() & valid[:, None, :]) | eye
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        capture: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden = forward.hidden(ids, positions, mask, capture=capture)
        following = forward.network.logits(hidden[:, -1]).float().argmax(-1)
        prefix, seen = capture, valid
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        outputs = [[] for _ in prompts]
        done = [False] * size
        for step in range(new_tokens):
            tokens = following.tolist()  # one host read per step
            for b in range(size):
                if not done[b]:
                    outputs[b].append(tokens[b])
                    done[b] = tokens[b] in eos
            if all(done) or step == new_tokens - 1:
                break
            seen = torch.cat([seen, torch.ones(size, 1, dtype=torch.bool, device=device)], dim=1)
            capture = []
            hidden = forward.hidden(
                following[:, None], (lengths + step)[:, None], seen[:, None, :], prefix=prefix, capture=capture
            )
            prefix = capture  # the keys and values of the prefix and this row
            following = forward.network.logits(hidden[:, -1]).float().argmax(-1)
    return outputs


# -- drafting blocks ----------------------------------------------------------------------------------------
@dataclass
class BlockBatch:
    """Clean windows and the drafting blocks laid over them, as two row sets.

    Attributes:
        clean: ``[B, L]`` token ids (right-padded).
        clean_mask: ``[B, L, L]`` causal mask over real tokens.
        query: ``[B, Q]`` block rows (seed token or MASK).
        query_positions: ``[B, Q]`` their positions.
        query_mask: ``[B, Q, L + Q]`` what each block row sees: clean rows before its block, its own block.
        targets: ``[B, Q]`` the base model's token at a masked row's position, -100 elsewhere.
        offsets: ``[B, Q]`` a masked row's distance from its block's seed (0 for a seedless block's first).
    """

    clean: torch.Tensor
    clean_mask: torch.Tensor
    query: torch.Tensor
    query_positions: torch.Tensor
    query_mask: torch.Tensor
    targets: torch.Tensor
    offsets: torch.Tensor

    def to(self, device: torch.device) -> BlockBatch:
        """The same batch on ``device`` (itself when it is there already)."""
        if self.clean.device == torch.device(device):
            return self
        return BlockBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def block_batch(
    windows: list[tuple[list[int], int]], config: DrafterConfig, mask_id: int, generator: torch.Generator
) -> BlockBatch:
    """Lay ``config.blocks`` drafting blocks over each ``(tokens, prompt_length)`` window's continuation."""
    size = len(windows)
    longest = max(len(tokens) for tokens, _ in windows)
    clean = torch.zeros(size, longest, dtype=torch.long)
    real = torch.zeros(size, longest, dtype=torch.bool)
    rows: list[list[tuple[int, int, int, int, int]]] = []  # (input, position, block start, target, offset)
    for b, (tokens, prompt) in enumerate(windows):
        clean[b, : len(tokens)] = torch.tensor(tokens)
        real[b, : len(tokens)] = True
        mine = []
        for block in range(config.blocks):
            seed = int(torch.randint(prompt - 1, len(tokens) - 1, (1,), generator=generator))
            width = int(torch.randint(1, config.max_width + 1, (1,), generator=generator))
            width = min(width, len(tokens) - 1 - seed)
            seedless = float(torch.rand((), generator=generator)) < config.seedless_prob and seed >= prompt
            mine.append((mask_id if seedless else tokens[seed], seed, block, tokens[seed] if seedless else -100, 0))
            for offset in range(1, width + 1):
                mine.append((mask_id, seed + offset, block, tokens[seed + offset], offset))
        rows.append(mine)
    length = max(len(r) for r in rows)
    query = torch.full((size, length), mask_id, dtype=torch.long)
    positions = torch.zeros(size, length, dtype=torch.long)
    targets = torch.full((size, length), -100, dtype=torch.long)
    offsets = torch.zeros(size, length, dtype=torch.long)
    starts = torch.zeros(size, length, dtype=torch.long)
    blocks = torch.full((size, length), -1, dtype=torch.long)
    for b, mine in enumerate(rows):
        for r, (token, position, block, target, offset) in enumerate(mine):
            query[b, r], positions[b, r], targets[b, r], offsets[b, r] = token, position, target, offset
            blocks[b, r] = block
        starts[b, : len(mine)] = torch.tensor([m[1] - m[4] for m in mine])
    columns = torch.arange(longest)
    sees_clean = (columns[None, None, :] < starts[:, :, None]) & real[:, None, :]
    within = (blocks[:, :, None] == blocks[:, None, :]) & (blocks[:, :, None] >= 0)
    within |= torch.eye(length, dtype=torch.bool)[None]  # padding rows see themselves only
    causal = torch.ones(longest, longest, dtype=torch.bool).tril()
    clean_mask = (causal[None] & real[:, None, :]) | torch.eye(longest, dtype=torch.bool)[None]
    return BlockBatch(
        clean=clean,
        clean_mask=clean_mask,
        query=query,
        query_positions=positions,
        query_mask=torch.cat([sees_clean, within], dim=2),
        targets=targets,
        offsets=offsets,
    )


def block_logits(forward: TrainingForward, batch: BlockBatch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafter and base logits of the masked block rows.

    Returns:
        ``[N, vocab]`` logits of the rows with a target (the adapter on block rows), and the base model's
        logits for the same positions (from the clean rows before them, without gradients).
    """
    batch = batch.to(forward.device)
    rows = batch.targets != -100
    with torch.autocast(forward.device.type, dtype=torch.bfloat16, enabled=autocast):
        capture: list[tuple[torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            positions = torch.arange(batch.clean.shape[1], device=forward.device).expand_as(batch.clean)
            clean = forward.hidden(batch.clean, positions, batch.clean_mask, capture=capture)
            owner = torch.arange(batch.clean.shape[0], device=forward.device)[:, None].expand_as(rows)[rows]
            base = forward.network.logits(clean[owner, batch.query_positions[rows] - 1]).float()
        hidden = forward.hidden(
            batch.query,
            batch.query_positions,
            batch.query_mask,
            adapter_rows=torch.ones_like(batch.query, dtype=torch.bool),
            prefix=[(k.detach(), v.detach()) for k, v in capture],
        )
        return forward.network.logits(hidden[rows]).float(), base


def drafting_loss(logits: torch.Tensor, base: torch.Tensor, batch: BlockBatch, config: DrafterConfig) -> torch.Tensor:
    """The training loss of the masked rows.

    Cross-entropy against the base model's greedy token mixed with the KL divergence from its distribution
    (``config.distill``); rows at offset <= 1 weigh ``config.near_weight``, the rest 1.
    """
    batch = batch.to(logits.device)
    rows = batch.targets != -100
    loss = F.cross_entropy(logits, batch.targets[rows], reduction="none") * (1 - config.distill)
    if config.distill > 0:
        teacher = F.log_softmax(base, dim=-1)
        kl = (teacher.exp() * (teacher - F.log_softmax(logits, dim=-1))).sum(-1)
        loss = loss + config.distill * kl
    near = batch.offsets[rows] <= 1
    weights = torch.where(near, torch.full_like(loss, config.near_weight), torch.ones_like(loss))
    return (loss * weights).sum() / weights.sum().clamp(min=1e-6)


# -- the adapter --------------------------------------------------------------------------------------------
def attach_trainable_lora(
    network: DecoderNetwork,
    rank: int,
    alpha: float,
    generator: torch.Generator,
    mlp_rank: int = 0,
    mlp_alpha: float | None = None,
    mlp_generator: torch.Generator | None = None,
) -> list[torch.nn.Parameter]:
    """Give every attention ``o_proj`` (and MLP ``down_proj``) a fresh trainable LoRA; freeze everything else.

    A fresh LoRA has A random and B zero, so it changes nothing until it trains.

    Args:
        network: The network (its adapters are replaced).
        rank: Rank of the ``o_proj`` adapters.
        alpha: Their alpha.
        generator: Draws the ``o_proj`` adapters' A.
        mlp_rank: Rank of fresh adapters on every MLP ``down_proj`` as well (0: none; any present are removed).
        mlp_alpha: Their alpha (``None``: ``2 * mlp_rank``).
        mlp_generator: Draws their A (``None``: ``generator``, after the ``o_proj`` ones); a generator of its own
            leaves ``generator`` where a run without an MLP adapter leaves it.

    Returns:
        The trainable parameters: each layer's ``o_proj`` A and B, then each layer's ``down_proj`` A and B.
    """
    for parameter in network.parameters():
        parameter.requires_grad_(False)
    trainable = []
    for layer in network.body.layers:
        layer.self_attn.o_lora = _fresh_update(layer.self_attn.o_proj, rank, alpha, generator)
        trainable += [layer.self_attn.o_lora.lora_A, layer.self_attn.o_lora.lora_B]
    down_alpha = 2.0 * mlp_rank if mlp_alpha is None else mlp_alpha
    mlp_generator = generator if mlp_generator is None else mlp_generator
    for layer in network.body.layers:
        layer.mlp.down_lora = None
        if mlp_rank > 0:
            layer.mlp.down_lora = _fresh_update(layer.mlp.down_proj, mlp_rank, down_alpha, mlp_generator)
            trainable += [layer.mlp.down_lora.lora_A, layer.mlp.down_lora.lora_B]
    return trainable


def _fresh_update(linear: torch.nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> LowRankUpdate:
    """A trainable LoRA for ``linear`` on its device: A uniform in +-1/sqrt(in), B zero (no change yet)."""
    update = LowRankUpdate(linear.in_features, linear.out_features, rank, alpha / rank)
    bound = 1 / math.sqrt(linear.in_features)
    with torch.no_grad():
        update.lora_A.uniform_(-bound, bound, generator=generator)  # drawn on the CPU: the same on any device
    return update.to(linear.weight.device)


def _slots(network: DecoderNetwork) -> list[tuple[str, torch.nn.Module, str]]:
    """``(target, block, adapter attribute)`` of every adapter place: each layer's ``o_proj``, then ``down_proj``."""
    return [
        (target, getattr(layer, block), attribute)
        for target, (block, _, attribute) in TARGETS.items()
        for layer in network.body.layers
    ]


def write_adapter(network: DecoderNetwork, folder: Path, config: DrafterConfig, base: str) -> None:
    """Save the LoRA(s) in the PEFT layout that :func:`specframe.models.lora.attach_lora` reads (bfloat16).

    The ``o_proj`` adapter has ``r`` / ``lora_alpha``; an MLP adapter (``config.mlp_rank`` > 0) adds
    ``down_proj`` to ``target_modules`` and its rank and alpha as ``rank_pattern`` / ``alpha_pattern``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    targets = ["o_proj"] + (["down_proj"] if config.mlp_rank else [])
    tensors = {}
    for index, layer in enumerate(network.body.layers):
        for target in targets:
            block, _, attribute = TARGETS[target]
            update = getattr(getattr(layer, block), attribute)
            stem = f"base_model.model.encoder.layers.{index}.{block}.{target}"
            tensors[f"{stem}.lora_A.weight"] = update.lora_A.detach().cpu().to(torch.bfloat16).contiguous()
            tensors[f"{stem}.lora_B.weight"] = update.lora_B.detach().cpu().to(torch.bfloat16).contiguous()
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    settings = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": config.rank,
        "lora_alpha": config.alpha,
        "target_modules": targets,
        "bias": "none",
        "lora_dropout": 0.0,
        "base_model_name_or_path": base,
    }
    if config.mlp_rank:
        settings |= {"rank_pattern": {"down_proj": config.mlp_rank}, "alpha_pattern": {"down_proj": config.mlp_alpha}}
    (folder / "adapter_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")


def write_acceptance(folder: Path, evaluation: dict[str, Any], sequences: int) -> None:
    """Write the adapter's measured agreement by offset beside it (width ``auto``'s prior when it is loaded).

    Args:
        folder: The adapter folder.
        evaluation: A log entry with ``agreement`` by offset (``"1"``, ``"2"``, ...) and ``step``.
        sequences: The held-out sequences it was measured on.
    """
    agreement = evaluation["agreement"]
    by_offset = [round(float(agreement[str(d)]), 4) for d in range(1, len(agreement) + 1)]
    record = {"by_offset": by_offset, "step": evaluation.get("step"), "held_out_sequences": sequences}
    (folder / ACCEPTANCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def start_from_adapter(network: DecoderNetwork, folder: Path, config: DrafterConfig) -> None:
    """Copy the LoRA(s) saved in ``folder`` (PEFT layout) into the network's fresh trainable adapters.

    The saved ``o_proj`` adapter is required, with ``config.rank``. A saved ``down_proj`` adapter is copied too
    and needs ``config.mlp_rank``; without one, the fresh MLP adapter (if any) starts as it is (B zero: the
    network drafts as the saved adapter does).

    Raises:
        ConfigError: If the folder holds no adapter that fits this model with ``config.rank`` and
            ``config.mlp_rank``.
    """
    from specframe.errors import CheckpointError
    from specframe.models.lora import attach_lora

    slots = _slots(network)
    fresh = [getattr(block, attribute) for _, block, attribute in slots]
    where = f"init_from={str(folder)!r}"
    try:
        device = network.body.layers[0].self_attn.o_proj.weight.device
        attach_lora(network, folder, module_prefix="encoder", device=device, dtype=torch.float32)
    except CheckpointError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    finally:
        saved = [getattr(block, attribute) for _, block, attribute in slots]
        for (_, block, attribute), update in zip(slots, fresh, strict=True):
            setattr(block, attribute, update)
    for target, setting in (("o_proj", "rank"), ("down_proj", "mlp_rank")):
        pairs = [(new, old) for (t, _, _), new, old in zip(slots, fresh, saved, strict=True) if t == target]
        loaded = [(new, old) for new, old in pairs if old is not new]
        if not loaded and target == "down_proj":
            continue  # an adapter without an MLP part: this run's MLP adapter, if any, starts fresh
        if len(loaded) < len(pairs):
            raise ConfigError(f"{where} has no {target} adapter for every layer of this model")
        for new, old in loaded:
            if new is None or old.lora_A.shape != new.lora_A.shape:
                raise ConfigError(
                    f"{where} has {target} rank {old.lora_A.shape[0]}; give --set {setting}={old.lora_A.shape[0]} "
                    "to start from it"
                )
            with torch.no_grad():  # the same update (its scale) B A, whatever this run's alpha: B carries the ratio
                new.lora_A.copy_(old.lora_A)
                new.lora_B.copy_(old.lora_B * (old.scale / new.scale))


def flattened(log_path: Path, patience: int) -> bool:
    """Whether a run's agreement curve has flattened.

    True when the last ``patience`` evaluations in ``log_path`` left the best mean agreement at offsets 2-4
    (what Packed-SS verifies) without a rise of 0.003; ``patience`` 0: never.
    """
    if patience < 1 or not log_path.is_file():
        return False
    means = []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        agreement = json.loads(line)["agreement"] if line else {}
        watched = [agreement[k] for k in _WATCHED if k in agreement]
        if watched:
            means.append(sum(watched) / len(watched))
    if len(means) <= patience:
        return False
    return max(means[-patience:]) < max(means[:-patience]) + 0.003


# -- evaluation ---------------------------------------------------------------------------------------------
@torch.no_grad()
def offset_agreement(
    forward: TrainingForward, windows: list[tuple[list[int], int]], config: DrafterConfig, mask_id: int
) -> dict[str, Any]:
    """Held-out loss and top-1 agreement with the base model by draft offset (fixed blocks, seed 1234)."""
    generator = torch.Generator().manual_seed(1234)
    hits = torch.zeros(config.max_width + 1)
    counts = torch.zeros(config.max_width + 1)
    loss_sum, rows_seen = 0.0, 0
    for start in range(0, len(windows), config.batch_size):
        batch = block_batch(windows[start : start + config.batch_size], config, mask_id, generator)
        batch = batch.to(forward.device)
        logits, _ = block_logits(forward, batch, config.bf16)
        rows = batch.targets != -100
        targets, offsets = batch.targets[rows], batch.offsets[rows].cpu()  # counted on the host
        loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
        rows_seen += int(targets.numel())
        right = (logits.argmax(-1) == targets).float().cpu()
        hits.index_add_(0, offsets, right)
        counts.index_add_(0, offsets, torch.ones_like(right))
    agreement = {str(k): round(float(hits[k] / counts[k]), 4) for k in range(1, config.max_width + 1) if counts[k]}
    return {"loss": round(loss_sum / max(rows_seen, 1), 4), "agreement": agreement}


# -- the run ------------------------------------------------------------------------------------------------
def train_drafter(
    model_folder: Path,
    work: Path,
    config: DrafterConfig,
    *,
    threads: int = 2,
    device: str | torch.device = "cpu",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train (or resume) a drafter for the converted model in ``model_folder``; the adapter lands in ``work``.

    ``device`` runs the base model, the data generation and the training there (``"cuda"`` where a GPU is
    present); block sampling and the run's state stay on the CPU, so a run resumes on either.

    Returns:
        The run's summary (also written to ``work/summary.json``).

    Raises:
        ConfigError: If ``work`` holds a run with other settings, or the model is not a Nemotron-layout model.
    """
    from specframe.models import load_model
    from specframe.models.nemotron import FAMILY as NEMOTRON

    torch.set_num_threads(threads)
    work.mkdir(parents=True, exist_ok=True)
    settings_path = work / "settings.json"
    settings = {"model": str(model_folder.resolve()), **asdict(config)}
    if settings_path.is_file():
        earlier = json.loads(settings_path.read_text(encoding="utf-8"))
        changed = sorted(k for k in settings if k not in _MAY_CHANGE and earlier.get(k, _BEFORE.get(k)) != settings[k])
        if changed:
            stored = ", ".join(f"{k}={json.dumps(earlier.get(k))}" for k in changed)
            given = ", ".join(f"{k}={json.dumps(settings[k])}" for k in changed)
            again = [f"the model {earlier.get('model')}"] if "model" in changed else []
            again += [f"--set {k}={json.dumps(earlier.get(k))}" for k in changed if k != "model"]
            raise ConfigError(
                f"{work} holds a drafter run with other settings (stored: {stored}; given: {given}): to resume "
                f"that run, give what it stored ({', '.join(again)}); to train with the new settings, use a new "
                "--work-dir"
            )
    settings_path.write_text(json.dumps(settings, indent=2), encoding="utf-8")
    model = load_model(model_folder, dtype="float32", device=device)
    if model.family != NEMOTRON:
        raise ConfigError(f"drafter training supports {NEMOTRON} models (converted Llama/Mistral), not {model.family}")
    network: DecoderNetwork = model.network
    forward = TrainingForward(network)
    mask_id = model.mask_token_id
    data = _self_distilled_data(model, model_folder, forward, config, work / "data.pt", log)
    train_windows, held_out = data["train"], data["held_out"]
    fit_windows = train_windows[: config.fit_eval]

    def evaluation() -> dict[str, Any]:  # held out, and on training continuations (own seed: training unmoved)
        entry = offset_agreement(forward, held_out, config, mask_id)
        if fit_windows:
            entry["fit"] = offset_agreement(forward, fit_windows, config, mask_id)
        return entry

    generator = torch.Generator().manual_seed(config.seed)
    mlp_generator = torch.Generator().manual_seed(config.seed + 1)  # the block sampling stays that of no MLP adapter
    trainable = attach_trainable_lora(
        network, config.rank, config.alpha, generator, config.mlp_rank, config.mlp_alpha, mlp_generator
    )
    if config.init_from is not None:
        start_from_adapter(network, Path(config.init_from), config)
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=0.0)
    step, wall = 0, 0.0
    state_path = work / "state.pt"
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False, map_location="cpu")
        with torch.no_grad():
            for parameter, saved in zip(trainable, state["adapter"], strict=True):
                parameter.copy_(saved)
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        step, wall = state["step"], state["wall"]
        log(f"resumed at step {step}")
    log_file = (work / "log.jsonl").open("a", encoding="utf-8")
    if step == 0:
        _record(log_file, {"step": 0, **evaluation()}, log)
    order = torch.randperm(len(train_windows), generator=generator).tolist()
    started = time.perf_counter() - wall
    while step < config.steps and not flattened(work / "log.jsonl", config.patience):
        chosen = [train_windows[order[(step * config.batch_size + i) % len(order)]] for i in range(config.batch_size)]
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config, step)
        batch = block_batch(chosen, config, mask_id, generator).to(forward.device)  # one transfer a step
        logits, base = block_logits(forward, batch, config.bf16)
        loss = drafting_loss(logits, base, batch, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        step += 1
        elapsed = time.perf_counter() - started
        _progress(step, config.steps, float(loss.detach()), elapsed)
        if step % config.eval_every == 0 or step == config.steps:
            _record(
                log_file,
                {
                    "step": step,
                    "train_loss": round(float(loss.detach()), 4),
                    "wall_s": round(elapsed, 1),
                    **evaluation(),
                },
                log,
            )
            _plot(work)
        if step % config.save_every == 0 or step == config.steps:
            state = {
                "adapter": [p.detach().cpu().clone() for p in trainable],
                "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(),
                "step": step,
                "wall": elapsed,
            }
            torch.save(state, work / "state.pt.tmp")
            (work / "state.pt.tmp").replace(state_path)
    if step < config.steps:
        log(f"stopped at step {step}: agreement at offsets 2-4 flat for {config.patience} evaluations")
    log_file.close()
    write_adapter(network, work / ADAPTER_FOLDER, config, str(model_folder))
    final = [json.loads(line) for line in (work / "log.jsonl").read_text(encoding="utf-8").splitlines() if line]
    write_acceptance(work / ADAPTER_FOLDER, final[-1], len(held_out))
    summary = {
        "model": str(model_folder),
        "steps": step,
        "wall_s": round(time.perf_counter() - started, 1),
        "train_sequences": len(train_windows),
        "held_out_sequences": len(held_out),
        "first": final[0],
        "last": final[-1],
        "config": asdict(config),
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


def _self_distilled_data(
    model: Any, folder: Path, forward: TrainingForward, config: DrafterConfig, path: Path, log: Callable[[str], None]
) -> dict[str, list[tuple[list[int], int]]]:
    if path.is_file():
        return torch.load(path, weights_only=False)
    from specframe.models.chat import read_chat_template, render_chat
    from specframe_training.prompts import training_prompts

    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ConfigError("the model folder has no tokenizer.json; drafter training needs one")
    template = read_chat_template(folder)
    encoded = []
    for text, is_chat in training_prompts(config.prompts, seed=config.seed):
        chat = is_chat and template is not None
        rendered = render_chat(template, [{"role": "user", "content": text}]) if chat else text
        ids = tokenizer.encode(rendered)
        if 0 < len(ids) <= config.max_prompt_tokens:
            encoded.append(ids)
    eos = set(model.eos_token_ids)
    sequences = []
    started = time.perf_counter()
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # similar lengths pad little
    for start in range(0, len(order), config.gen_batch):
        chunk = [encoded[i] for i in order[start : start + config.gen_batch]]
        for prompt, continuation in zip(
            chunk, batched_greedy(forward, chunk, config.new_tokens, eos, config.bf16), strict=True
        ):
            if len(continuation) >= 2:
                sequences.append((prompt + continuation, len(prompt)))
        elapsed = time.perf_counter() - started
        done = min(start + config.gen_batch, len(order))
        log(
            f"self-distilled data: {done}/{len(order)} prompts, {elapsed:.0f} s, "
            f"ETA {elapsed / done * (len(order) - done):.0f} s"
        )
    shuffle = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(config.seed)).tolist()
    sequences = [sequences[i] for i in shuffle]
    data = {"held_out": sequences[: config.held_out], "train": sequences[config.held_out :]}
    torch.save(data, path)
    return data


def _learning_rate(config: DrafterConfig, step: int) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _record(file, entry: dict[str, Any], log: Callable[[str], None]) -> None:
    file.write(json.dumps(entry) + "\n")
    file.flush()
    log(json.dumps(entry))


def _progress(step: int, total: int, loss: float, elapsed: float) -> None:
    eta = elapsed / step * (total - step)
    line = f"step {step}/{total}  loss {loss:.3f}  {elapsed / step:.2f} s/step  ETA {eta / 60:.1f} min"
    if sys.stderr.isatty():
        print("\r" + line, end="" if step < total else "\n", file=sys.stderr, flush=True)
    elif step % 10 == 0 or step == total:
        print(line, file=sys.stderr, flush=True)


def _plot(work: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    entries = [json.loads(line) for line in (work / "log.jsonl").read_text(encoding="utf-8").splitlines() if line]
    steps = [e["step"] for e in entries]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.plot(steps, [e["loss"] for e in entries], marker="o", label="held-out")
    trained = [e for e in entries if "train_loss" in e]
    left.plot([e["step"] for e in trained], [e["train_loss"] for e in trained], marker=".", label="train (one step)")
    left.set_xlabel("step")
    left.set_ylabel("drafting loss")
    left.legend()
    for offset in sorted({k for e in entries for k in e["agreement"]}, key=int):
        (line,) = right.plot(steps, [e["agreement"].get(offset) for e in entries], marker=".", label=f"offset {offset}")
        fit = [(e["step"], e["fit"]["agreement"].get(offset)) for e in entries if "fit" in e]
        if fit and offset in _WATCHED:  # training continuations, dashed: the gap is what data would buy
            right.plot(*zip(*fit, strict=True), linestyle="--", color=line.get_color())
    right.set_xlabel("step")
    right.set_ylabel("top-1 agreement with the base model")
    if any("fit" in e for e in entries):
        right.set_title("dashed: on training continuations (offsets 2-4)", fontsize=8)
    right.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(work / "curves.png", dpi=110)
    plt.close(figure)
