"""The files of a benchmark output folder: ``run.json`` (settings), ``records.jsonl`` (one line per response).

Records are appended and flushed one at a time, so a run that is killed loses at most the response in
flight; a torn last line is dropped when the folder is opened again. A record is identified by
``(prompt_index, repeat, schedule, width)``, with the concurrency appended when it is not 1 (so folders made
before ``--concurrency`` existed, whose records are all concurrency 1, keep their keys). A run holds a lock
on its folder (:func:`lock_folder`), so a second run on the same folder is refused instead of recording every
response again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from specframe.bench.settings import BenchSettings, Method, differences
from specframe.errors import OutputError, SpecframeError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks of this kind
    fcntl = None  # type: ignore[assignment]

RUN_FILE = "run.json"
RECORDS_FILE = "records.jsonl"
SUMMARY_FILE = "summary.json"
LOCK_FILE = ".specframe-bench.lock"

Key = tuple[Any, ...]


def response_key(prompt_index: int, repeat: int, method: Method) -> Key:
    """``(prompt_index, repeat, schedule, width)``, plus ``concurrency`` when it is not 1, of one response."""
    key: Key = (int(prompt_index), int(repeat), method.schedule, method.width)
    return key if method.concurrency == 1 else (*key, method.concurrency)


def record_key(record: Mapping[str, Any]) -> Key:
    """The key (:func:`response_key`) of a record."""
    return response_key(record["prompt_index"], record["repeat"], record_method(record))


def record_method(record: Mapping[str, Any]) -> Method:
    """The method a record belongs to (records without ``concurrency`` predate it: concurrency 1)."""
    return Method(str(record["schedule"]), record.get("width"), int(record.get("concurrency") or 1))


def prepare_folder(out: str | Path, *, option: str = "--out") -> Path:
    """Create the output folder (and its parents) and check that files can be written in it.

    Args:
        out: The folder.
        option: The command-line option that named it, for messages.

    Raises:
        OutputError: If the path is an existing file, lies under a file, or cannot be created or written.
    """
    folder = Path(out).expanduser()
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{option} {out} is an existing file, not a folder; give a folder path for the results")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".specframe-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise OutputError(
            f"{option} {out} cannot be used as the output folder ({reason}: {exc.filename or folder}); give a "
            "writable folder path (one that is not inside a file or a system folder such as /proc)"
        ) from exc
    return folder


@contextlib.contextmanager
def lock_folder(folder: Path, *, option: str = "--out") -> Iterator[None]:
    """Hold an exclusive lock on an output folder while a run writes into it.

    The lock is an ``flock`` on :data:`LOCK_FILE` inside the folder, so the operating system releases it when
    the process ends, however it ends. Where files cannot be locked (no ``fcntl``, or a file system without
    locks) the run goes ahead unlocked.

    Args:
        folder: The output folder (it exists).
        option: The command-line option that named it, for messages.

    Raises:
        OutputError: If another process holds the lock, or the lock file cannot be created.
    """
    path = folder / LOCK_FILE
    try:
        handle = open(path, "a+b")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise write_failed(path, exc, "give a writable folder") from exc
    try:
        if fcntl is not None:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputError(
                    f"{option} {folder} is in use: another specframe bench is running there (it holds {path}); "
                    f"wait for it to end, or give another {option} folder"
                ) from None
            except OSError:
                pass  # a file system without locks
        yield
    finally:
        handle.close()


def read_records(path: str | Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """The records of a ``records.jsonl`` file (an empty list if it does not exist).

    Args:
        path: The file.
        repair: Cut a torn (unterminated) last line off the file, as left by a killed run.

    Raises:
        SpecframeError: If a line other than the last one is not valid JSON.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1  # every record is written with its newline in one call
    if complete < len(data) and repair:
        with open(path, "r+b") as handle:
            handle.truncate(complete)
    records = []
    for number, line in enumerate(data[:complete].split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            raise SpecframeError(
                f"{path}, line {number} is not valid JSON; the records file is damaged: delete that line to resume "
                "with the other records, or use a new --out folder"
            ) from None
    return records


RESUME_AFTER_FAILURE = (
    "the responses stored before it are kept: make room (or fix the folder), then rerun the same command to resume"
)


def write_failed(path: str | Path, exc: OSError, hint: str = RESUME_AFTER_FAILURE) -> OutputError:
    """The error for a file of an output folder that could not be written (a full disk, a lost permission).

    Args:
        path: The file.
        exc: The operating system's error.
        hint: What the user can do.
    """
    reason = exc.strerror or str(exc) or type(exc).__name__
    return OutputError(f"cannot write {path} ({reason}); {hint}")


class RecordWriter:
    """Appends records to ``records.jsonl``, flushing each line to disk.

    Raises:
        OutputError: From the constructor and :meth:`write`, naming the file, when it cannot be written.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise write_failed(self.path, exc) from exc

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record and flush it (a line cut short by a failure is dropped on resume)."""
        try:
            self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise write_failed(self.path, exc) from exc

    def close(self) -> None:
        """Close the file (after a failed write, what the failure left in the buffer is given up)."""
        try:
            self._handle.close()
        except OSError:
            pass  # only after a failed write, which raised already: every record is flushed when written

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_records(path: str | Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write a whole records file (used by merge).

    Raises:
        OutputError: Naming the file, when it cannot be written.
    """
    try:
        with open(path, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise write_failed(path, exc, "make room (or fix the folder), then rerun the same command") from exc


def read_run(folder: str | Path) -> dict[str, Any] | None:
    """The ``run.json`` of an output folder, or ``None`` when there is none.

    Raises:
        SpecframeError: If it exists but cannot be parsed.
    """
    path = Path(folder) / RUN_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecframeError(f"{path} is unreadable ({exc}); remove it or use a new --out folder") from exc


def write_json(path: str | Path, data: Any) -> None:
    """Write JSON atomically (a temporary file renamed into place).

    Raises:
        OutputError: Naming the file, when it cannot be written (the file keeps its previous content).
    """
    path = Path(path)
    temporary = path.with_suffix(path.suffix + ".tmp")
    try:
        temporary.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise write_failed(path, exc) from exc


RESUME_HINT = "rerun with the stored settings to resume it, or use a new --out folder"


def check_same_run(stored: Mapping[str, Any], current: BenchSettings, where: str, hint: str = RESUME_HINT) -> None:
    """Refuse to mix records made under different settings.

    Args:
        stored: The settings a folder's ``run.json`` holds.
        current: The settings compared with them.
        where: The folder, as the message names it.
        hint: What the message tells the user to do.

    Raises:
        SpecframeError: Listing each differing setting.
    """
    diff = differences(stored, current.to_dict())
    if diff:
        raise SpecframeError(f"{where} holds a run with different settings ({'; '.join(diff)}); {hint}")
