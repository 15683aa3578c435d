"""Read data-set rows from local files: JSON Lines (optionally gzipped), a JSON list, or Parquet."""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specframe.errors import SpecframeError


def read_rows(path: str | Path) -> list[Mapping[str, Any]]:
    """Rows of a data file.

    Args:
        path: ``.jsonl`` / ``.jsonl.gz`` (one JSON object per line), ``.json`` (a list of objects, or an
            object with a ``"data"`` / ``"rows"`` list), or ``.parquet`` (needs ``pyarrow``).

    Raises:
        SpecframeError: If the file is missing, unreadable or not a list of objects.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise SpecframeError(f"task file {path} is a folder, not a file; give the JSONL, JSON or Parquet file in it")
    if not path.is_file():
        raise SpecframeError(f"task file {path} does not exist; give a JSONL file with one example per line")
    name = path.name.lower()
    try:
        if name.endswith(".parquet"):
            return _parquet_rows(path)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecframeError(f"cannot read task file {path}: {exc}") from exc
    if name.endswith((".json", ".json.gz")):
        rows = _json_rows(text, path)
    else:
        rows = _jsonl_rows(text, path)
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, Mapping)), None)
    if bad is not None:
        raise SpecframeError(f"task file {path}: entry {bad + 1} is not a JSON object")
    return rows


def _jsonl_rows(text: str, path: Path) -> list[Any]:
    rows = []
    # JSON Lines ends a record at "\n" only (the file is read with universal newlines, so "\r\n" is one too):
    # str.splitlines would also split inside a string at U+2028, U+0085 and the like, which JSON allows raw.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            formats = (
                ""
                if path.name.lower().endswith((".jsonl", ".jsonl.gz"))
                else "; a task file is JSON Lines (.jsonl, .jsonl.gz), JSON (.json) or Parquet (.parquet), and one "
                f"named *{path.suffix or '(no suffix)'} is read as JSON Lines"
            )
            raise SpecframeError(f"task file {path}, line {number}: not valid JSON ({exc.msg}){formats}") from None
    return rows


def _json_rows(text: str, path: Path) -> list[Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecframeError(f"task file {path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if isinstance(data, Mapping):
        data = data.get("data", data.get("rows"))
    if not isinstance(data, list):
        raise SpecframeError(f"task file {path}: expected a list of examples (or {{'data': [...]}})")
    return data


def _parquet_rows(path: Path) -> list[Mapping[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecframeError(
            f"{path} is a Parquet file and reading it needs pyarrow (`pip install pyarrow`); or convert it to "
            "JSONL and pass it with --task-file"
        ) from None
    return pq.read_table(path).to_pylist()
