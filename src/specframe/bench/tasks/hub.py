"""Download one data file of a Hugging Face *dataset* repo into the Hub cache (honouring offline mode).

Without network (no connection to the Hub opens, see :func:`~specframe.models.hub.hub_unreachable`) the
cache is used at once, as with ``HF_HUB_OFFLINE=1``, instead of after ``huggingface_hub``'s retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specframe.errors import SpecframeError


@dataclass(frozen=True)
class HubSource:
    """A data file in a Hub dataset repository.

    Attributes:
        repo_id: Dataset repository, e.g. ``openai/gsm8k``.
        filename: File inside the repository, e.g. ``main/test-00000-of-00001.parquet``.
        revision: Branch, tag or commit (pinned where the file moved in later commits).
    """

    repo_id: str
    filename: str
    revision: str | None = None

    def describe(self) -> str:
        """``repo_id/filename@revision``."""
        at = f"@{self.revision[:12]}" if self.revision else ""
        return f"hf://datasets/{self.repo_id}/{self.filename}{at}"


def download_dataset_file(source: HubSource, *, hint: str = "") -> Path:
    """The local path of ``source``, downloaded into (or found in) the Hugging Face cache.

    Args:
        source: The file to fetch.
        hint: What the user can do instead (e.g. pass ``--task-file``); added to every error.

    Raises:
        SpecframeError: When offline without a cached copy, or the file cannot be downloaded.
    """
    from huggingface_hub import hf_hub_download

    from specframe.models.hub import hub_cache_dir, hub_offline, hub_unreachable

    offline = hub_offline()
    unreachable = None if offline else hub_unreachable()
    try:
        return Path(
            hf_hub_download(
                source.repo_id,
                source.filename,
                repo_type="dataset",
                revision=source.revision,
                cache_dir=hub_cache_dir(),
                local_files_only=offline or unreachable is not None,  # no network: the cache, without retries
            )
        )
    except Exception as exc:  # network, missing file, offline cache miss: all end in the same advice
        if offline:
            why = "offline mode is on (HF_HUB_OFFLINE=1) and it is not in the Hugging Face cache"
        elif unreachable:
            why = f"it is not in the Hugging Face cache, and {unreachable}"
        else:
            why = f"{type(exc).__name__}: {exc}"
        raise SpecframeError(f"cannot get {source.describe()}: {why}. {hint}".strip()) from exc
