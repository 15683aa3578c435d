"""Reading a checkpoint's weight files, one tensor at a time, and assigning them to a module.

Supported layouts (``stem`` is ``model`` for models and ``adapter_model`` for PEFT adapters):

* ``{stem}.safetensors``, or shards listed in ``{stem}.safetensors.index.json``;
* ``pytorch_model.bin`` / ``adapter_model.bin``, or shards listed in ``pytorch_model.bin.index.json``,
  read with ``torch.load(weights_only=True)`` (memory-mapped where the file format allows).

Safetensors take precedence when both are present. A family describes its checkpoint names with a
:class:`KeyLayout` (prefix renames plus keys to ignore). :func:`load_state` checks every name and shape first
and reports all missing, unexpected and mis-shaped tensors in one error; only then does it read the
tensors, one at a time, converting each to the target device and dtype, and assign them to the module
(``load_state_dict(assign=True)``), so that the weights are allocated once, in their final place: a model
is never held twice in memory.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from specframe.errors import CheckpointError, NonFiniteWeightsError, UnsafeWeightsError
from specframe.kernels.quant import BLOCK, QUANTIZED, dequantize, format_of

_CORRUPT_HINT = (
    "it is probably truncated or corrupted: delete it (for a Hub download, the cached snapshot in the "
    "Hugging Face cache) and download it again"
)
_LIST_LIMIT = 8


class TensorSource:
    """Names, shapes and lazily loaded tensors of a checkpoint's weight files.

    Use :func:`open_weights` to build one. Close it (or use it as a context manager) to release file handles.
    """

    def __init__(self, description: str) -> None:
        self.description = description
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._files: dict[str, object] = {}
        self._quantized: dict[str, tuple[str, str]] = {}  # name -> (stored name, block format)
        self._stack = ExitStack()

    def names(self) -> list[str]:
        """Every tensor name, in file order."""
        return list(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` (read from the file header, without loading the data)."""
        return self._shapes[name]

    def load(self, name: str) -> torch.Tensor:
        """Read tensor ``name`` onto the CPU.

        Raises:
            CheckpointError: If the data cannot be read.
        """
        if name in self._quantized:
            fmt, blocks = self.blocks(name)  # type: ignore[misc]
            return dequantize(blocks, fmt)
        return self._read(name)

    def blocks(self, name: str) -> tuple[str, torch.Tensor] | None:
        """``(format, uint8 blocks)`` of a matrix stored block-quantized (``NAME.q4_1`` and so on), else ``None``.

        Such a matrix is listed under ``NAME`` with its ``[out, in]`` shape; :meth:`load` returns its float32
        values (as llama.cpp decodes them) and this its blocks, which specframe's kernels run as they are.

        Raises:
            CheckpointError: If the blocks cannot be read or are not whole blocks of their format.
        """
        if name not in self._quantized:
            return None
        stored, fmt = self._quantized[name]
        blocks = self._read(stored)
        rows, length = self._shapes[name][0], self._shapes[name][1] // BLOCK * format_of(fmt).block_bytes
        if blocks.dtype != torch.uint8 or tuple(blocks.shape) != (rows, length):
            raise CheckpointError(
                f"tensor {stored!r} in {self.description} should hold {rows}x{length} {fmt} bytes, "
                f"found {blocks.dtype} {list(blocks.shape)}; {_CORRUPT_HINT}"
            )
        return fmt, blocks

    def _read(self, name: str) -> torch.Tensor:
        handle = self._files[name]
        if isinstance(handle, dict):
            return handle[name]
        try:
            return handle.get_tensor(name)  # type: ignore[attr-defined]
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(
                f"cannot read tensor {name!r} from {self.description} ({exc}); {_CORRUPT_HINT}"
            ) from exc

    def close(self) -> None:
        """Release open files."""
        self._stack.close()
        self._files.clear()

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add(self, name: str, shape: tuple[int, ...], handle: object, path: Path) -> None:
        stem, _, suffix = name.rpartition(".")
        if suffix in QUANTIZED and len(shape) == 2:  # a block-quantized matrix: listed under its float name
            block_bytes = format_of(suffix).block_bytes
            if shape[1] % block_bytes:
                raise CheckpointError(
                    f"tensor {name!r} in {path} has rows of {shape[1]} bytes, not whole {suffix} blocks of "
                    f"{block_bytes}; {_CORRUPT_HINT}"
                )
            self._quantized[stem] = (name, suffix)
            self._files[name] = handle
            name, shape = stem, (shape[0], shape[1] // block_bytes * BLOCK)
        if name in self._shapes:
            raise CheckpointError(f"tensor {name!r} appears twice in {self.description} (again in {path.name})")
        self._shapes[name] = shape
        self._files[name] = handle


def weight_files(folder: Path, stem: str = "model") -> tuple[str, list[Path]] | None:
    """The format (``"safetensors"`` or ``"bin"``) and files of the weights in ``folder``, or ``None``.

    Raises:
        CheckpointError: If an index file is unreadable or names shards that are missing.
    """
    bin_stem = "pytorch_model" if stem == "model" else stem
    for fmt, single, index in (
        ("safetensors", f"{stem}.safetensors", f"{stem}.safetensors.index.json"),
        ("bin", f"{bin_stem}.bin", f"{bin_stem}.bin.index.json"),
    ):
        if _present(folder / index):
            return fmt, _shards(folder / index)
        if _present(folder / single):
            return fmt, [folder / single]
    return None


def _present(path: Path) -> bool:
    """Whether a weight file is at ``path`` (``False`` when nothing is).

    Raises:
        CheckpointError: If something is there that is no readable file: a symlink loop, a link to nothing, a
            folder (any of which would otherwise read as "no weights").
    """
    if path.is_file():
        return True
    try:
        os.stat(path)
    except FileNotFoundError:
        if not path.is_symlink():
            return False
        raise CheckpointError(
            f"{path} is a symbolic link to {os.readlink(path)}, which does not exist; restore or re-download the "
            "weights"
        ) from None
    except OSError as exc:
        reason = "a symbolic link loop" if exc.errno == errno.ELOOP else f"unreadable ({exc.strerror or exc})"
        raise CheckpointError(f"{path} is {reason}; restore or re-download the weights") from None
    kind = "a folder" if path.is_dir() else "not a regular file"
    raise CheckpointError(f"{path} is {kind}, not a weight file; put the weight file there, or remove it")


def _shards(index_path: Path) -> list[Path]:
    try:
        data = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"weight index {index_path} is not valid JSON ({exc}); restore or re-download it"
        ) from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f"weight index {index_path} has no 'weight_map' object mapping tensor names to shard files; restore "
            "or re-download it"
        )
    folder = index_path.parent.resolve()
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or not name or not (folder / name).resolve().is_relative_to(folder):
            raise CheckpointError(
                f"weight index {index_path}: {tensor} -> {name!r} is not a shard file name inside "
                f"{index_path.parent}; restore or re-download the index"
            )
    files = [index_path.parent / name for name in dict.fromkeys(weight_map.values())]
    missing = [f.name for f in files if not _present(f)]
    if missing:
        raise CheckpointError(
            f"weight index {index_path} names shard(s) {', '.join(missing)} that are not in {index_path.parent}; "
            "the download is incomplete: download the missing files again"
        )
    return files


def open_weights(folder: Path, stem: str = "model") -> TensorSource:
    """Open the weight files of ``folder`` for reading.

    Args:
        folder: Checkpoint folder.
        stem: ``"model"`` for model weights, ``"adapter_model"`` for a PEFT adapter.

    Raises:
        CheckpointError: If no weight file is found or a file is unreadable (truncated, corrupted).
    """
    found = weight_files(folder, stem)
    if found is None:
        bin_stem = "pytorch_model" if stem == "model" else stem
        raise CheckpointError(
            f"no weights in {folder}: expected {stem}.safetensors, {stem}.safetensors.index.json, "
            f"{bin_stem}.bin or {bin_stem}.bin.index.json"
        )
    fmt, files = found
    where = str(files[0]) if len(files) == 1 else f"{len(files)} shards in {folder}"
    source = TensorSource(where)
    try:
        for path in files:
            _open_file(source, path, fmt)
    except BaseException:
        source.close()
        raise
    return source


def _open_file(source: TensorSource, path: Path, fmt: str) -> None:
    if fmt == "safetensors":
        try:
            handle = source._stack.enter_context(safe_open(str(path), framework="pt"))
            entries: Iterable[tuple[str, tuple[int, ...]]] = [
                (name, tuple(handle.get_slice(name).get_shape())) for name in handle.keys()
            ]
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path} is not a readable safetensors file ({exc}); {_CORRUPT_HINT}") from exc
    else:
        handle = _torch_load(path)
        entries = [(name, tuple(t.shape)) for name, t in handle.items()]
    for name, shape in entries:
        source._add(name, shape, handle, path)


def _torch_load(path: Path) -> dict[str, torch.Tensor]:
    errors = []
    for mmap in (True, False):  # memory-map where the (zip) format allows, else read it whole
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
            break
        except Exception as exc:  # torch raises several types for unreadable pickles and zips
            errors.append(exc)
    else:
        unsafe = next((e for e in errors if isinstance(e, pickle.UnpicklingError) and "Weights only" in str(e)), None)
        if unsafe is not None:
            found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\n|$)", str(unsafe), re.S)
            detail = f" ({' '.join(found.group(1).split())[:200]})" if found else ""
            raise UnsafeWeightsError(
                f"{path} holds Python objects that are not tensors{detail}, and specframe did not load it, for "
                "safety: unpickling them could run arbitrary code. Use the model's .safetensors weights instead "
                "(or, if you trust its source, re-save the tensors alone with safetensors)"
            )
        raise CheckpointError(f"{path} is not a readable PyTorch weight file ({errors[-1]}); {_CORRUPT_HINT}")
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise CheckpointError(f"{path} does not hold a flat dict of named tensors (a state dict)")
    return state


@dataclass(frozen=True)
class KeyLayout:
    """How checkpoint tensor names map to module parameter names.

    Attributes:
        renames: ``(checkpoint prefix, module prefix)`` pairs; the first pair matching a name applies.
        ignored: Regular expressions of checkpoint names to skip (buffers such as ``rotary_emb.inv_freq``).
    """

    renames: tuple[tuple[str, str], ...]
    ignored: tuple[str, ...] = (r"(^|\.)rotary_emb\.inv_freq$",)

    def to_module(self, name: str) -> str | None:
        """The module name for checkpoint ``name``; ``None`` if it is ignored; ``name`` itself if unknown."""
        if any(re.search(pattern, name) for pattern in self.ignored):
            return None
        for checkpoint_prefix, module_prefix in self.renames:
            if name.startswith(checkpoint_prefix):
                return module_prefix + name[len(checkpoint_prefix) :]
        return "\0" + name  # cannot collide with a module name

    def to_checkpoint(self, name: str) -> str:
        """The checkpoint name a module parameter is expected under."""
        for checkpoint_prefix, module_prefix in self.renames:
            if name.startswith(module_prefix):
                return checkpoint_prefix + name[len(module_prefix) :]
        return name


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:_LIST_LIMIT])
    return shown + (f" and {len(items) - _LIST_LIMIT} more" if len(items) > _LIST_LIMIT else "")


def match_names(module: nn.Module, source: TensorSource, layout: KeyLayout, *, where: str) -> dict[str, str]:
    """Map each module parameter to its checkpoint tensor, checking names and shapes.

    Returns:
        ``{module name: checkpoint name}`` for every parameter of ``module``.

    Raises:
        CheckpointError: Naming every missing, unexpected and mis-shaped tensor.
    """
    expected = {name: tuple(t.shape) for name, t in module.state_dict(keep_vars=True).items()}
    mapping: dict[str, str] = {}
    unexpected, misshaped = [], []
    for checkpoint_name in source.names():
        target = layout.to_module(checkpoint_name)
        if target is None:
            continue
        if target not in expected:
            unexpected.append(checkpoint_name)
            continue
        if target in mapping:
            unexpected.append(f"{checkpoint_name} (duplicates {mapping[target]})")
            continue
        mapping[target] = checkpoint_name
        found = source.shape(checkpoint_name)
        if found != expected[target]:
            misshaped.append(f"{checkpoint_name} has shape {list(found)}, expected {list(expected[target])}")
    missing = [layout.to_checkpoint(name) for name in expected if name not in mapping]
    problems = []
    if missing:
        problems.append(f"missing tensor(s) {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected tensor(s) {_listing(unexpected)}")
    if misshaped:
        problems.append(f"mis-shaped tensor(s): {_listing(misshaped)}")
    if problems:
        raise CheckpointError(
            f"{where} ({source.description}) does not match its config: "
            + "; ".join(problems)
            + ". Check that config.json belongs to these weights and that the files are complete."
        )
    return mapping


def load_state(
    module: nn.Module,
    source: TensorSource,
    layout: KeyLayout,
    *,
    device: torch.device,
    dtype: torch.dtype,
    where: str,
) -> None:
    """Fill ``module`` (built on the meta device) with the checkpoint's tensors on ``device`` in ``dtype``.

    Matrices stored block-quantized are loaded as their float values, and their blocks are kept in
    ``module.specframe_blocks`` (``{parameter name: (format, blocks)}``) for the kernels.

    Raises:
        CheckpointError: If names or shapes do not match, a tensor cannot be read, or a weight is not
            floating point (integer weights would be converted into nonsense).
        NonFiniteWeightsError: If a weight holds NaN or infinite values once loaded (see :class:`FiniteCheck`).
    """
    mapping = match_names(module, source, layout, where=where)
    finite = FiniteCheck(source, where)
    state, blocks = {}, {}
    for target, checkpoint_name in mapping.items():
        stored = source.blocks(checkpoint_name)
        if stored is not None:
            blocks[target] = stored
        tensor = source.load(checkpoint_name)
        if not tensor.is_floating_point():
            raise CheckpointError(
                f"{where}: weight {checkpoint_name} holds {tensor.dtype} values, not floating-point ones; quantized "
                "or damaged checkpoints are not supported: use the published bfloat16/float16/float32 weights"
            )
        state[target] = finite.add(checkpoint_name, tensor.to(device=device, dtype=dtype))
    finite.check()
    module.load_state_dict(state, strict=True, assign=True)
    freeze(module.parameters())
    module.specframe_blocks = blocks  # parameter name -> (format, blocks): what the kernels run, as stored


class FiniteCheck:
    """Refuses weights holding NaN or infinite values, naming each such tensor.

    A damaged file, or a checkpoint saved after training diverged, decodes junk without any other sign; so
    does a float32 weight whose values overflow float16 when loaded with ``dtype="float16"``. :meth:`add` sums
    each tensor as it is loaded (a NaN or an infinity makes the sum non-finite; summing at once reads a
    tensor that is still in the CPU's caches), and :meth:`check` reads all sums back in one host sync. Only a
    tensor whose sum is not finite is scanned element by element, so a sum that merely overflows is no error.

    Args:
        source: Where the tensors are read from (to tell a damaged file from a dtype overflow).
        where: How to name the checkpoint in messages.
    """

    def __init__(self, source: TensorSource, where: str) -> None:
        self.source = source
        self.where = where
        self._tensors: dict[str, torch.Tensor] = {}
        self._sums: list[torch.Tensor] = []

    def add(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Record checkpoint tensor ``name`` as loaded (on its device, in its dtype); returns it."""
        self._tensors[name] = tensor
        self._sums.append(tensor.sum().to(torch.float32))
        return tensor

    def check(self) -> None:
        """Raise if any recorded tensor holds NaN or infinite values.

        Raises:
            NonFiniteWeightsError: Naming the tensors, how many values are NaN or infinite, and what to do.
        """
        if not self._sums:
            return
        finite = torch.isfinite(torch.stack(self._sums)).tolist()
        bad, overflowed = [], []
        for (name, tensor), ok in zip(self._tensors.items(), finite, strict=True):
            if ok:
                continue
            nan = int(torch.isnan(tensor).sum())
            inf = int(torch.isinf(tensor).sum())
            if not nan and not inf:
                continue  # the sum overflowed, the values are fine
            stored = self.source.load(name)
            if stored.dtype != tensor.dtype and bool(torch.isfinite(stored).all()):
                overflowed.append(name)
            bad.append(f"{name} ({nan} NaN and {inf} infinite of {tensor.numel()} values)")
        if not bad:
            return
        if len(overflowed) == len(bad):
            dtype = str(next(iter(self._tensors.values())).dtype).removeprefix("torch.")
            advice = (
                f"the values in the file are finite but do not fit {dtype}: load the model in bfloat16 or "
                "float32 (dtype= / --dtype)"
            )
        else:
            advice = (
                "the weight file is damaged or the checkpoint was saved after training diverged: download it "
                "again (for a Hub model, delete its cached snapshot), or use an earlier checkpoint"
            )
        raise NonFiniteWeightsError(f"{self.where}: weight(s) {_listing(bad)} hold NaN or infinite values; {advice}")


def freeze(parameters: Iterable[nn.Parameter]) -> None:
    """Turn off gradients: backends only ever run inference."""
    for parameter in parameters:
        parameter.requires_grad_(False)
