"""Training a small model of either family on the standard-library corpus, resumably, and exporting it.

A run lives in a work folder::

    work/
      hub/            the checkpoint in the family's Hub layout (config.json, model.safetensors, tokenizer.json)
      data.pt         the tokenized corpus (training stream, held-out documents and their file names)
      state.pt        the latest training state (weights, optimizer, step, random state), for resuming
      log.jsonl       one record per logged step and per evaluation
      summary.json    sizes, wall time and held-out perplexity of the finished run

``config.json`` is written by :func:`specframe.models.export.write_config` (the family's real field names),
the network is built from that config by the family's own reader, and the trained weights are exported
under the family's tensor names (its key layout applied to the network's ``state_dict()``) with
:func:`specframe.models.export.write_tensors`, so :func:`specframe.models.load_model` reads the result like
any Hub checkpoint.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from specframe.models import nemotron, setdlm
from specframe.models.export import checkpoint_tensors, write_config, write_tensors
from specframe.models.loading import Checkpoint
from specframe.models.tokenizer import HubTokenizer
from specframe.models.transformer import DecoderNetwork, NetworkConfig, SpecialTokens
from specframe_training.corpus import (
    MIN_BPE_ENTRIES,
    corpus_files,
    encode_documents,
    smallest_vocab,
    split_files,
    spread_windows,
    train_tokenizer,
)
from specframe_training.distill import DistillConfig, distillation_batch, greedy_rollouts
from specframe_training.forward import TrainingForward
from specframe_training.objectives import (
    AnyOrderObjective,
    Batch,
    BlockDiffusionObjective,
    batch_losses,
    check_objective_options,
)

NEMOTRON, SETDLM = nemotron.FAMILY, setdlm.FAMILY
FAMILY_MODULES = {NEMOTRON: nemotron, SETDLM: setdlm}
FAMILY_ALIASES = {"nemotron": NEMOTRON, NEMOTRON: NEMOTRON, "setdlm": SETDLM}


_MAY_BE_ZERO = frozenset({"seed", "warmup", "distill_steps"})  # integer settings for which 0 makes sense


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run.

    Attributes:
        family: ``"nemotron-labs-diffusion"`` or ``"setdlm"``.
        vocab_size: Tokenizer and embedding size, special tokens included.
        hidden_size: Model width.
        num_hidden_layers: Transformer blocks.
        intermediate_size: SwiGLU width.
        num_attention_heads: Query heads.
        num_key_value_heads: Key/value heads.
        head_dim: Head size.
        max_position_embeddings: Context the config declares (inference may run past the training windows).
        rope_theta: RoPE base.
        seq_len: Tokens per training window.
        batch_size: Windows per step.
        steps: Optimizer steps.
        lr: Peak learning rate (linear warm-up, cosine decay to ``lr * min_lr_ratio``).
        min_lr_ratio: Final learning rate as a share of the peak.
        warmup: Warm-up steps.
        weight_decay: AdamW weight decay of matrices (not of norms).
        grad_clip: Gradient-norm clip.
        seed: Seed of initialisation and sampling.
        bf16: Run matrix products in bfloat16 autocast (weights and optimizer stay float32).
        eval_every: Steps between held-out evaluations.
        eval_windows: Held-out windows per periodic evaluation.
        save_every: Steps between saved training states.
        log_every: Steps between log records.
        objective: Options of the family's objective (see :mod:`specframe_training.objectives`).
        distill_steps: Steps of drafter self-distillation after the main ``steps`` (see
            :mod:`specframe_training.distill`; Nemotron-Labs-Diffusion only).
        distill: Options of the distillation stage (:class:`~specframe_training.distill.DistillConfig`).
    """

    family: str
    vocab_size: int = 2048
    hidden_size: int = 256
    num_hidden_layers: int = 4
    intermediate_size: int = 768
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 1200
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    bf16: bool = True
    eval_every: int = 100
    eval_windows: int = 32
    save_every: int = 50
    log_every: int = 10
    objective: dict[str, Any] = field(default_factory=dict)
    distill_steps: int = 0
    distill: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_values()
        if self.distill_steps and FAMILY_ALIASES.get(self.family, self.family) != NEMOTRON:
            raise ValueError(
                f"distill_steps: drafter distillation is implemented for {NEMOTRON} only, not {self.family}"
            )
        DistillConfig(**self.distill)  # unknown or invalid options fail here, before any training
        family = FAMILY_ALIASES.get(self.family, self.family)
        if family in FAMILY_MODULES:  # likewise the objective's (preset() has refused an unknown family)
            if self.vocab_size < smallest_vocab(family):
                raise ValueError(
                    f"vocab_size must be at least {smallest_vocab(family)} for {family} (its special tokens and "
                    f"{MIN_BPE_ENTRIES} byte-level BPE entries), got {self.vocab_size}"
                )
            objective = BlockDiffusionObjective if family == NEMOTRON else AnyOrderObjective
            check_objective_options(objective, self.objective, family)

    def _check_values(self) -> None:
        """Refuse values of the wrong type or range before any data is prepared (``--set hidden_size=abc``)."""
        for item in fields(self):
            value = getattr(self, item.name)
            if item.type == "int":
                floor = 0 if item.name in _MAY_BE_ZERO else 1
                if isinstance(value, bool) or not isinstance(value, int) or value < floor:
                    raise ValueError(f"{item.name} must be an integer >= {floor}, got {value!r}")
            elif item.type == "float":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                    raise ValueError(f"{item.name} must be a finite number >= 0, got {value!r}")
            elif item.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"{item.name} must be true or false, got {value!r}")
            elif item.type.startswith("dict") and not isinstance(value, dict):
                raise ValueError(f"{item.name} must be a JSON object of options, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    def hub_fields(self) -> dict[str, Any]:
        """The model-size fields of ``config.json`` (this config's fields of the same names), in bfloat16."""
        sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
        sizes += ("num_key_value_heads", "head_dim", "max_position_embeddings")
        return {name: getattr(self, name) for name in sizes} | {"torch_dtype": "bfloat16"}


# The shipped models (scripts/train_bundled.sh): each trains in under 30 minutes on 2 CPU cores. Their folder
# names under specframe/assets/models; the Nemotron one is the default model (specframe.models.hub.DEFAULT_MODEL).
BUNDLED = {NEMOTRON: "nemotron-stdlib-tiny", SETDLM: "setdlm-stdlib-tiny"}
PRESETS = {
    NEMOTRON: TrainConfig(family=NEMOTRON, distill_steps=24),
    SETDLM: TrainConfig(family=SETDLM, objective={"ltr_prob": 0.5}),
}


def family_name(name: str) -> str:
    """The canonical family name of ``name`` (``nemotron`` is short for ``nemotron-labs-diffusion``).

    Raises:
        ValueError: For an unknown family.
    """
    try:
        return FAMILY_ALIASES[name]
    except KeyError:
        raise ValueError(f"unknown family {name!r}; use one of {sorted(FAMILY_ALIASES)}") from None


# -- corpus --------------------------------------------------------------------------------------------------
@dataclass
class Corpus:
    """A tokenized corpus.

    Attributes:
        train: The training documents concatenated (int32).
        heldout: Held-out documents, one tensor each.
        heldout_files: Their paths relative to the standard library.
    """

    train: torch.Tensor
    heldout: list[torch.Tensor]
    heldout_files: list[str]

    def windows(self, length: int, count: int | None = None) -> torch.Tensor:
        """Non-overlapping ``[N, length]`` held-out windows from the concatenated held-out documents.

        With ``count``, ``count`` windows spread evenly over the held-out text (deterministic).
        """
        return spread_windows(torch.cat(self.heldout), length, count)


def _special_ids(family: str, tokenizer: HubTokenizer) -> dict[str, int]:
    if family == NEMOTRON:
        return dict(nemotron.SPECIAL_IDS)
    ids = {name: tokenizer.token_to_id(token) for name, token in setdlm.CONFIG_TOKENS.items()}
    return {k: v for k, v in ids.items() if v is not None}


def prepare(config: TrainConfig, work: Path, log: Callable[[str], None] = print) -> tuple[Path, Corpus]:
    """Write the Hub folder's config.json and tokenizer.json and tokenize the corpus (once per work folder).

    Returns:
        The Hub folder and the tokenized corpus.
    """
    hub = work / "hub"
    data_path = work / "data.pt"
    if (hub / "tokenizer.json").is_file() and data_path.is_file():
        data = torch.load(data_path, weights_only=True)
        return hub, Corpus(data["train"], data["heldout"], data["heldout_files"])
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    train_files, heldout_files = split_files(corpus_files())
    tokenizer = train_tokenizer(config.family, [f.text for f in train_files], config.vocab_size)
    hub.mkdir(parents=True, exist_ok=True)
    (hub / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    ids = _special_ids(config.family, HubTokenizer(tokenizer))
    _write_config(config, hub, ids)
    if config.family == NEMOTRON:
        bos, eos = ids["bos_token_id"], ids["eos_token_id"]
    else:
        bos, eos = None, ids["pad_token_id"]  # <|endoftext|> separates documents
    train = encode_documents(tokenizer, [f.text for f in train_files], bos=bos, eos=eos)
    heldout = encode_documents(tokenizer, [f.text for f in heldout_files], bos=bos, eos=eos)
    corpus = Corpus(torch.cat(train), heldout, [f.relative for f in heldout_files])
    torch.save({"train": corpus.train, "heldout": corpus.heldout, "heldout_files": corpus.heldout_files}, data_path)
    log(
        f"corpus: {len(train_files)} training files ({corpus.train.numel()} tokens), {len(heldout_files)} held-out "
        f"files ({sum(d.numel() for d in heldout)} tokens); tokenizer and corpus in "
        f"{time.perf_counter() - started:.0f}s"
    )
    return hub, corpus


def _write_config(config: TrainConfig, hub: Path, ids: dict[str, int]) -> None:
    """config.json in the family's Hub layout."""
    fields = config.hub_fields()
    if config.family == NEMOTRON:
        rope = {
            "rope_theta": config.rope_theta,
            "factor": 4.0,
            "original_max_position_embeddings": config.max_position_embeddings // 4,
        }
        block = config.objective.get("max_block", BlockDiffusionObjective.max_block) - 1
        write_config(NEMOTRON, hub, rope_parameters=rope, block_size=block, **fields, **ids)
    else:
        write_config(SETDLM, hub, rope_theta=config.rope_theta, **fields, **ids)
        raw = json.loads((hub / "config.json").read_text(encoding="utf-8"))
        raw["torch_dtype"] = "bfloat16"  # at the top level too (write_config puts the sizes' dtype nested)
        (hub / "config.json").write_text(json.dumps(raw, indent=2), encoding="utf-8")


def network_config(family: str, hub: Path) -> tuple[NetworkConfig, SpecialTokens]:
    """The network settings and special ids the family's loader reads from ``hub``."""
    raw = json.loads((hub / "config.json").read_text(encoding="utf-8"))
    checkpoint = Checkpoint(hub, raw, str(hub), torch.device("cpu"), torch.float32)
    backend = nemotron.NemotronLabsDiffusion if family == NEMOTRON else setdlm.SetDLM
    config, special, _ = backend.read_checkpoint(checkpoint)
    return config, special


def objective_for(config: TrainConfig, special: SpecialTokens) -> BlockDiffusionObjective | AnyOrderObjective:
    """The family's training objective."""
    if config.family == NEMOTRON:
        return BlockDiffusionObjective(mask_id=special.mask, **config.objective)
    return AnyOrderObjective(mask_id=special.mask, **config.objective)


# -- model ---------------------------------------------------------------------------------------------------
def init_network(network: DecoderNetwork, seed: int) -> None:
    """GPT-2-style initialisation: N(0, 0.02), residual outputs scaled by ``1/sqrt(2 * layers)``, norms 1."""
    generator = torch.Generator().manual_seed(seed)
    residual = 0.02 / math.sqrt(2 * len(network.body.layers))
    with torch.no_grad():
        for name, parameter in network.named_parameters():
            if parameter.dim() == 1:
                parameter.fill_(1.0)
            else:
                std = residual if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)


def hub_tensors(network: DecoderNetwork, family: str, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The network's weights under the family's Hub tensor names (its module's ``LAYOUT``), in ``dtype``."""
    return checkpoint_tensors(network, FAMILY_MODULES[family].LAYOUT, dtype)


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up then cosine decay."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = min((step - config.warmup) / max(config.steps - config.warmup, 1), 1.0)
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def optimizer_for(network: DecoderNetwork, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only."""
    matrices = [p for p in network.parameters() if p.dim() > 1]
    vectors = [p for p in network.parameters() if p.dim() <= 1]
    groups = [{"params": matrices, "weight_decay": config.weight_decay}, {"params": vectors, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8)


def distill_optimizer_for(network: DecoderNetwork, settings: DistillConfig) -> torch.optim.AdamW:
    """The distillation stage's own AdamW: constant learning rate, no weight decay."""
    return torch.optim.AdamW(network.parameters(), lr=settings.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def build_run(
    config: TrainConfig, hub: Path
) -> tuple[DecoderNetwork, TrainingForward, BlockDiffusionObjective | AnyOrderObjective, torch.optim.AdamW]:
    """A freshly initialised network for the config in ``hub``, its training forward, objective and optimizer."""
    net_config, special = network_config(config.family, hub)
    network = DecoderNetwork(net_config)
    init_network(network, config.seed)
    return network, TrainingForward(network), objective_for(config, special), optimizer_for(network, config)


def optimizer_step(
    forward: TrainingForward, optimizer: torch.optim.Optimizer, batch: Batch, config: TrainConfig
) -> tuple[float, float, dict[str, float]]:
    """One update on ``batch``: the loss, the gradient norm before clipping and the loss terms."""
    loss, terms = run_batch(forward, batch, config.bf16)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(forward.network.parameters(), config.grad_clip))
    optimizer.step()
    return float(loss.detach()), grad_norm, terms


def run_batch(forward: TrainingForward, batch: Batch, bf16: bool) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and per-term means of one batch."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = forward.logits(batch.input_ids, batch.position_ids, batch.mask, batch.loss_rows)
    return batch_losses(logits, batch)


@torch.no_grad()
def heldout_loss(
    forward: TrainingForward,
    objective: BlockDiffusionObjective | AnyOrderObjective,
    windows: torch.Tensor,
    *,
    batch_size: int = 16,
    bf16: bool = False,
) -> float:
    """Mean held-out next-token (AR) cross-entropy in nats per token over ``windows``."""
    total, count = 0.0, 0
    for start in range(0, windows.shape[0], batch_size):
        batch = objective.heldout(windows[start : start + batch_size])
        loss, _ = run_batch(forward, batch, bf16)
        rows = int(batch.loss_rows.sum())
        total, count = total + float(loss) * rows, count + rows
    return total / max(count, 1)


@torch.no_grad()
def heldout_objective(
    forward: TrainingForward,
    objective: BlockDiffusionObjective | AnyOrderObjective,
    windows: torch.Tensor,
    seed: int,
    bf16: bool,
) -> dict[str, float]:
    """The training objective's terms on held-out windows (fixed noise)."""
    generator = torch.Generator().manual_seed(seed)
    _, terms = run_batch(forward, objective.batch(windows, generator), bf16)
    return terms


# -- the loop ------------------------------------------------------------------------------------------------
def train(
    config: TrainConfig, work: Path, *, threads: int | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Train (or resume training) in ``work`` and export the Hub folder; returns the run's summary.

    A run resumes from ``work/state.pt`` when its settings match the saved ones; only ``steps`` and the
    distillation settings may differ (a longer run continues on the new learning-rate schedule; a finished run
    with new ``distill_steps`` goes on with the distillation stage).

    Args:
        config: The run's settings (a resumed run must use the same ones).
        work: The work folder (see the module docstring).
        threads: ``torch.set_num_threads`` (default: leave torch's choice).
        log: Where progress lines go.
    """
    if threads:
        torch.set_num_threads(threads)
    work.mkdir(parents=True, exist_ok=True)
    settings_path = work / "train_config.json"
    if settings_path.is_file() and (work / "state.pt").is_file():
        saved = json.loads(settings_path.read_text(encoding="utf-8"))
        stages = ("steps", "distill_steps", "distill")
        if {k: v for k, v in saved.items() if k not in stages} != {
            k: v for k, v in asdict(config).items() if k not in stages
        }:
            raise ValueError(f"{work} holds a run with other settings ({settings_path}); use a new work folder")
    settings_path.write_text(json.dumps(asdict(config), indent=2), encoding="utf-8")
    hub, corpus = prepare(config, work, log)
    network, forward, objective, optimizer = build_run(config, hub)
    generator = torch.Generator().manual_seed(config.seed + 1)
    step, elapsed = 0, 0.0
    distill_step, distill_elapsed = 0, 0.0
    distill_settings = DistillConfig(**config.distill)
    distill_optimizer = distill_optimizer_for(network, distill_settings)
    state_path = work / "state.pt"
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        network.load_state_dict(state["network"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        step, elapsed = state["step"], state["elapsed"]
        distill_step, distill_elapsed = state.get("distill_step", 0), state.get("distill_elapsed", 0.0)
        if "distill_optimizer" in state:
            distill_optimizer.load_state_dict(state["distill_optimizer"])
            for group in distill_optimizer.param_groups:
                group["lr"] = distill_settings.lr
        log(f"resumed at step {step} ({elapsed:.0f}s trained), distillation step {distill_step}")
    params = sum(p.numel() for p in network.parameters())
    log(
        f"{config.family}: {params / 1e6:.2f}M parameters, {config.steps} steps of {config.batch_size}x{config.seq_len}"
    )
    eval_windows = corpus.windows(config.seq_len, config.eval_windows)
    log_path = work / "log.jsonl"
    train_tokens = corpus.train

    def record(entry: dict[str, Any]) -> None:
        with log_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    record({"start": True, "step": step, "elapsed": elapsed, "threads": torch.get_num_threads()})

    def save() -> None:
        state = {
            "network": network.state_dict(),
            "optimizer": optimizer.state_dict(),
            "generator": generator.get_state(),
            "step": step,
            "elapsed": elapsed,
            "distill_optimizer": distill_optimizer.state_dict(),
            "distill_step": distill_step,
            "distill_elapsed": distill_elapsed,
        }
        torch.save(state, work / "state.tmp")
        (work / "state.tmp").replace(state_path)

    def evaluate() -> None:
        network.eval()
        ar = heldout_loss(forward, objective, eval_windows, bf16=config.bf16)
        terms = heldout_objective(forward, objective, eval_windows[:16], config.seed, config.bf16)
        network.train()
        record(
            {
                "eval": True,
                "step": step,
                "distill_step": distill_step,
                "elapsed": elapsed + distill_elapsed,
                "heldout_ar_loss": ar,
                "heldout_terms": terms,
            }
        )
        log(f"step {step}: held-out AR loss {ar:.3f} (ppl {math.exp(ar):.2f}), objective {_fmt(terms)}")

    network.train()
    while step < config.steps:
        started = time.perf_counter()
        windows = sample_windows(train_tokens, config.seq_len, config.batch_size, generator)
        lr = learning_rate(config, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        value, grad_norm, terms = optimizer_step(forward, optimizer, objective.batch(windows, generator), config)
        step += 1
        elapsed += time.perf_counter() - started
        if step % config.log_every == 0 or step == 1:
            record({"step": step, "elapsed": elapsed, "lr": lr, "loss": value, "grad_norm": grad_norm, **terms})
            log(f"step {step}/{config.steps} {elapsed:.0f}s lr {lr:.2e} loss {value:.3f} {_fmt(terms)}")
        if step % config.eval_every == 0 or step == config.steps:
            evaluate()
        if step % config.save_every == 0 or step == config.steps:
            save()
    if distill_step < config.distill_steps:
        log(
            f"drafter distillation: {config.distill_steps} steps of {distill_settings.batch_size} greedy rollouts of "
            f"{distill_settings.rollout} tokens after {distill_settings.prefix} real ones"
        )
    while distill_step < config.distill_steps:
        started = time.perf_counter()
        prefixes = sample_windows(train_tokens, distill_settings.prefix, distill_settings.batch_size, generator)
        windows = greedy_rollouts(forward, prefixes, distill_settings.rollout)
        batch = distillation_batch(objective, windows, distill_settings.prefix, generator)
        value, grad_norm, terms = optimizer_step(forward, distill_optimizer, batch, config)
        distill_step += 1
        distill_elapsed += time.perf_counter() - started
        record(
            {"step": step, "distill_step": distill_step, "elapsed": elapsed + distill_elapsed, "loss": value, **terms}
        )
        log(f"distillation step {distill_step}/{config.distill_steps} {distill_elapsed:.0f}s loss {value:.3f}")
        if distill_step % 5 == 0 or distill_step == config.distill_steps:
            save()
        if distill_step == config.distill_steps:
            evaluate()
    return finish(config, work, hub, network, forward, objective, corpus, elapsed, log, distill_elapsed)


def sample_windows(stream: torch.Tensor, length: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``[count, length]`` windows of the training stream at random offsets."""
    offsets = torch.randint(0, stream.numel() - length, (count,), generator=generator)
    return torch.stack([stream[o : o + length] for o in offsets.tolist()])


def step_seconds(config: TrainConfig, hub: Path, *, steps: int = 4, threads: int | None = None) -> float:
    """Median wall time of one training step of ``config`` on this machine (random tokens, after a warm-up step).

    Args:
        config: Run settings (sizes, batch, objective).
        hub: A Hub folder with the run's config.json and tokenizer.json (e.g. a shipped model).
        steps: Timed steps.
        threads: ``torch.set_num_threads`` for the measurement (restored afterwards).
    """
    saved_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        _, forward, objective, optimizer = build_run(config, hub)
        generator = torch.Generator().manual_seed(config.seed)
        times = []
        for _ in range(steps + 1):
            started = time.perf_counter()
            windows = torch.randint(0, config.vocab_size, (config.batch_size, config.seq_len), generator=generator)
            optimizer_step(forward, optimizer, objective.batch(windows, generator), config)
            times.append(time.perf_counter() - started)
        return sorted(times[1:])[len(times[1:]) // 2]
    finally:
        torch.set_num_threads(saved_threads)


def finish(
    config: TrainConfig,
    work: Path,
    hub: Path,
    network: DecoderNetwork,
    forward: TrainingForward,
    objective: BlockDiffusionObjective | AnyOrderObjective,
    corpus: Corpus,
    elapsed: float,
    log: Callable[[str], None] = print,
    distill_elapsed: float = 0.0,
) -> dict[str, Any]:
    """Export the bfloat16 Hub checkpoint and write the summary with the full held-out perplexity."""
    network.eval()
    write_tensors(hub_tensors(network, config.family), hub)
    windows = corpus.windows(config.seq_len)
    float_loss = heldout_loss(forward, objective, windows)
    rounded = DecoderNetwork(network.config)
    rounded.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in network.state_dict().items()})
    rounded_loss = heldout_loss(TrainingForward(rounded), objective, windows)
    summary = {
        "family": config.family,
        "parameters": sum(p.numel() for p in network.parameters()),
        "train_seconds": elapsed,
        "distill_seconds": distill_elapsed,
        "total_train_seconds": elapsed + distill_elapsed,
        "train_tokens": config.steps * config.batch_size * config.seq_len,
        "corpus_train_tokens": corpus.train.numel(),
        "heldout_files": len(corpus.heldout_files),
        "heldout_tokens": int(windows.numel()),
        "heldout_ar_loss": rounded_loss,
        "heldout_ppl": math.exp(rounded_loss),
        "heldout_ppl_float32_weights": math.exp(float_loss),
        "threads": torch.get_num_threads(),
        "config": asdict(config),
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    log(f"exported {hub}: held-out AR perplexity {summary['heldout_ppl']:.3f} (bf16 weights)")
    return summary


def ship(work: Path, target: Path, records: Path | None = None) -> Path:
    """Copy a finished run's Hub folder (config.json, model.safetensors, tokenizer.json) to ``target``.

    Args:
        work: The run's work folder.
        target: The model folder to write (e.g. ``src/specframe/assets/models/<name>``).
        records: Where to copy the run's ``summary.json`` and ``log.jsonl`` (for the docs page), if anywhere.
    """
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy2(work / "hub" / name, target / name)
    if records is not None:
        records.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "log.jsonl", "train_config.json"):
            shutil.copy2(work / name, records / name)
    return target


def preset(family: str, **overrides: Any) -> TrainConfig:
    """The shipped model's settings for ``family``, with ``overrides``."""
    return replace(PRESETS[family_name(family)], **overrides)


def _fmt(terms: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.3f}" for k, v in terms.items())
