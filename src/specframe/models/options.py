"""Turning user-given ``device`` and ``dtype`` options into torch objects, with clear errors."""

from __future__ import annotations

import torch

from specframe.errors import ConfigError

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
    elif resolved.type not in ("cpu", "meta"):
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
        dtype = DTYPES.get(saved.lower(), torch.float32)
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
