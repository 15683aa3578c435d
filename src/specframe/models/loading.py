"""``load_model``: find a checkpoint, settle device and dtype, and let its model family load it.

Each thing is resolved once, in this order: the device (so that a bad one fails before any download), the
folder (local, bundled or downloaded from the Hub), ``config.json``, the family (by ``model_type``), the
dtype (which may depend on ``config.json``). The family's loader receives the result as a
:class:`Checkpoint` and only builds the network.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specframe.errors import CheckpointError, ConfigError, PluginError, SpecframeError
from specframe.kernels.quant import QUANTIZED
from specframe.models.base import ModelBackend
from specframe.models.config_json import checkpoint_dtype, read_config
from specframe.models.hub import resolve_source
from specframe.plugins import PluginEntry, get_registry

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}
_SUPPORTED = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """A usable torch device (``None`` means CPU).

    Raises:
        ConfigError: If the name is invalid or the device is not available on this machine.
    """
    if device is None:
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"invalid device {device!r} ({exc}); use e.g. 'cpu', 'cuda' or 'cuda:1'") from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {device!r} is unavailable: this PyTorch build or machine has no CUDA; use device='cpu' "
                "or install a CUDA build of torch"
            )
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise ConfigError(f"device {device!r} is unavailable: only {count} CUDA device(s) are visible")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    elif resolved.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"device {device!r} is unavailable on this machine; use device='cpu'")
    elif resolved.type == "cpu":
        if resolved.index not in (None, 0):
            raise ConfigError(f"device {device!r} does not exist: the CPU is one device; use 'cpu'")
    else:  # 'meta' holds no data, other types have no kernels here
        raise ConfigError(f"unsupported device type {resolved.type!r}; use 'cpu', 'cuda' or 'mps'")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device, saved: str | None = None) -> torch.dtype:
    """The dtype to run a model in.

    Args:
        dtype: Requested dtype (name or torch dtype); ``None`` picks float32 on the CPU and the checkpoint's
            own dtype (``saved``, default float32) on accelerators.
        device: Target device.
        saved: The checkpoint's ``torch_dtype``, if recorded.

    Raises:
        ConfigError: If the dtype is unknown or unsupported (on this device).
    """
    if dtype is None:
        if device.type == "cpu" or saved is None:
            return torch.float32
        dtype = DTYPES.get(saved.lower().removeprefix("torch."), torch.float32)
    if isinstance(dtype, str):
        key = dtype.lower().removeprefix("torch.")
        if key not in DTYPES:
            raise ConfigError(f"unsupported dtype {dtype!r}; use one of {', '.join(sorted(DTYPES))}")
        dtype = DTYPES[key]
    if not isinstance(dtype, torch.dtype) or dtype not in _SUPPORTED:
        names = ", ".join(str(d).removeprefix("torch.") for d in _SUPPORTED)
        raise ConfigError(f"unsupported dtype {dtype!r}; models run in {names}")
    if dtype == torch.float64 and device.type == "mps":
        raise ConfigError("float64 is not supported on MPS; use float32 or run on the CPU")
    return dtype


def check_saved_dtype(saved: object, folder: os.PathLike[str]) -> None:
    """Refuse a ``torch_dtype`` in config.json that names no dtype specframe runs in.

    The saved dtype is the default on accelerators, and it says what the weights are; an unknown name (a typo,
    or a quantized format such as ``int8``) is reported on every device rather than replaced by float32.
    An explicit ``dtype`` skips this check: then the saved one is not used.

    Raises:
        CheckpointError: Naming the file, the value and the two ways out.
    """
    if saved is None or (isinstance(saved, str) and saved.lower().removeprefix("torch.") in DTYPES):
        return
    raise CheckpointError(
        f"{folder}/config.json has torch_dtype {saved!r}, which is not a dtype specframe runs models in "
        "(float32, bfloat16, float16, float64; quantized checkpoints are not supported); fix the value in "
        "config.json, or choose the dtype yourself with dtype=... (--dtype)"
    )


@dataclass(frozen=True)
class Checkpoint:
    """A located checkpoint and the device and dtype to load it on: what a family's loader receives.

    Attributes:
        folder: Local folder with config.json and the weights.
        config: The parsed config.json.
        name: How the user named the model (repo id, bundled name or folder): the loaded model's ``name``.
        device: Target device.
        dtype: Target dtype.
        cpu_tuning: Whether the CPU kernels of :mod:`specframe.models.cpu` apply (``None``: the
            ``SPECFRAME_CPU_TUNING`` environment switch), known before any weight is packed.
        quant: A block format (``"q8_0"``, ``"q4_0"``, ``"q4_1"``) to quantize the float projections to at
            load, or ``None`` (a checkpoint's stored blocks are used either way).
    """

    folder: Path
    config: dict[str, Any]
    name: str
    device: torch.device
    dtype: torch.dtype
    cpu_tuning: bool | None = None
    quant: str | None = None

    @property
    def where(self) -> str:
        """The folder, for messages."""
        return str(self.folder)


def load_model(
    source: str | os.PathLike[str] | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    revision: str | None = None,
    family: str | None = None,
    adapter: bool | str | os.PathLike[str] | None = None,
    cpu_tuning: bool | None = None,
    quant: str | None = None,
) -> ModelBackend:
    """Load a model from the Hub, a local folder, or the bundled default.

    Args:
        source: Hub repo id (e.g. ``"nvidia/Nemotron-Labs-Diffusion-8B"``), a local folder in the Hub layout
            (config.json, safetensors or .bin weights, tokenizer.json), a bundled model's name
            (``"setdlm-stdlib-tiny"``), or ``None`` for the bundled default (``"nemotron-stdlib-tiny"``).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        dtype: ``"float32"``/``"fp32"``, ``"bfloat16"``/``"bf16"``, ``"float16"``, ``"float64"`` or a torch
            dtype; default float32 on CPU and the checkpoint's own dtype on accelerators.
        revision: Hub branch, tag or commit.
        family: Force a model family (e.g. ``"setdlm"``) instead of choosing by ``model_type``.
        adapter: Load the family's proposal-only adapter (``True``, or an adapter folder); ``None`` (the
            default) loads the drafter adapter the checkpoint declares as its own (config.json's
            ``specframe_drafter``, which converted models with a trained drafter carry), and none otherwise.
        cpu_tuning: Turn the CPU kernels of :mod:`specframe.models.cpu` on or off for a model that has them
            (``set_cpu_tuning``); ``None``: the ``SPECFRAME_CPU_TUNING`` environment switch (on by default).
        quant: Quantize the float projections at load to a GGUF block format (``"q8_0"``, ``"q4_0"``,
            ``"q4_1"``), run by specframe's CPU kernels; ``None`` keeps them as loaded (a checkpoint converted
            with ``specframe convert --quant`` runs its stored blocks either way).

    Returns:
        The loaded backend.

    Raises:
        CheckpointError: If the checkpoint cannot be found, read or recognised.
        ConfigError: If the device or dtype is unavailable, or the family has no adapter.
        UnknownPluginError: If ``family`` names no registered family.
    """
    if source is not None and not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"the model source must be a Hub repo id, a folder path or a bundled model's name (a str or path), "
            f"got {type(source).__name__} {source!r:.60}; pass None for the bundled default model"
        )
    if adapter is not None and not isinstance(adapter, (bool, str, os.PathLike)):
        raise ConfigError(f"adapter must be True, False, None or an adapter folder path, got {adapter!r}")
    resolved_device = resolve_device(device)  # fail before any download
    folder = resolve_source(source, revision=revision, adapter=adapter is True)
    config = read_config(folder)
    if adapter is None:
        adapter = declared_drafter(config, folder)
    entry = _pick_family(config, family, folder)
    options: dict[str, object] = {}
    if adapter is not False:
        if "adapter" not in inspect.signature(entry.factory).parameters:
            raise ConfigError(
                f"model family {entry.name!r} has no proposal-only adapter; drop adapter=True (--adapter on the "
                "command line)"
            )
        options["adapter"] = adapter
    saved = checkpoint_dtype(config)
    if dtype is None:
        check_saved_dtype(saved, folder)
    resolved_dtype = resolve_dtype(dtype, resolved_device, saved if isinstance(saved, str) else None)
    shown = os.fspath(source) if source is not None else ""
    name = shown if Path(shown).name not in ("", "..") else str(folder)  # ".": the folder, not "."
    if quant is not None and quant not in QUANTIZED:
        raise ConfigError(f"unknown quantization {quant!r}; use one of {', '.join(QUANTIZED)}, or leave it unset")
    checkpoint = Checkpoint(folder, config, name, resolved_device, resolved_dtype, cpu_tuning, quant)
    origin = f"model family {entry.name!r} (plugin {entry.plugin!r}, distribution {entry.distribution!r})"
    try:
        model = entry.factory(checkpoint, **options)
    except SpecframeError:
        raise
    except Exception as exc:
        raise PluginError(
            f"{origin} failed to load {folder}: {type(exc).__name__}: {exc}; this is a bug in that plugin "
            "(report it to its authors)"
        ) from exc
    if not isinstance(model, ModelBackend):
        raise PluginError(f"{origin}: its loader returned {type(model).__name__}, not a ModelBackend")
    if cpu_tuning is not None and getattr(model, "cpu_tuning", cpu_tuning) != cpu_tuning:
        model.set_cpu_tuning(cpu_tuning)  # a family that ignored the checkpoint's setting
    return model


def load_configured(settings: Any) -> ModelBackend:
    """:func:`load_model` with the loading settings an object carries (a decoder config, bench settings).

    ``settings`` has ``model``, ``device``, ``dtype``, ``revision``, ``adapter`` and ``quant`` attributes.
    """
    return load_model(
        settings.model,
        device=settings.device or "cpu",
        dtype=settings.dtype,
        revision=settings.revision,
        adapter=settings.adapter,
        quant=settings.quant,
    )


def attach_drafter(adapter: Path | None, model: Path, name: str = "linear_spec_lora") -> None:
    """Make ``adapter`` the drafter of the checkpoint ``model``: copied to ``model/name`` and declared in config.json.

    Args:
        adapter: A PEFT adapter folder, or ``None`` to remove the checkpoint's declared drafter.
        model: The checkpoint folder.
        name: The adapter's folder name inside the checkpoint.
    """
    target = model / name
    if target.exists():
        shutil.rmtree(target)
    config_path = model / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("specframe_drafter", None)
    if adapter is not None:
        shutil.copytree(adapter, target)
        config["specframe_drafter"] = name
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def declared_drafter(config: dict, folder: Path) -> Path | bool:
    """The adapter folder a checkpoint declares as its drafter (config.json ``specframe_drafter``), or False.

    Raises:
        CheckpointError: If the declared folder is not a plain name inside the checkpoint, or is missing.
    """
    name = config.get("specframe_drafter")
    if name is None:
        return False
    where = Path(folder) / "config.json"
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise CheckpointError(f"{where}: specframe_drafter must name a folder inside the checkpoint, got {name!r}")
    adapter = Path(folder) / name
    if not adapter.is_dir():
        raise CheckpointError(
            f"{where} declares the drafter adapter {name!r}, but {adapter} is missing; restore it (e.g. "
            "`specframe pull` again) or load with adapter=False (--no-adapter)"
        )
    return adapter


def _pick_family(config: dict, family: str | None, folder: os.PathLike[str]) -> PluginEntry:
    registry = get_registry()
    if family is not None:
        return registry.get("model_backend", family)
    model_type = config.get("model_type")
    known: dict[str, PluginEntry] = {}
    for entry in registry.entries("model_backend"):
        for name in entry.extras.get("model_types", ()):
            known.setdefault(name, entry)
    if model_type in known:
        return known[model_type]
    listing = ", ".join(f"{name!r} ({entry.name})" for name, entry in sorted(known.items())) or "none"
    found = f"model_type {model_type!r}" if model_type is not None else "no model_type"
    raise CheckpointError(
        f"{folder}/config.json has {found}; known model types: {listing}. A transformers or GGUF checkpoint of "
        f"an AR model (Llama, Mistral, Qwen3) is converted first: `specframe convert {folder} --out NEW-FOLDER`, "
        "then load NEW-FOLDER (--model NEW-FOLDER). Otherwise install the plugin for this model type, or, from "
        "Python, pass family=... (load_model) to load the folder as a specific family"
    )
