"""Where a model's files come from: a local folder, the Hugging Face Hub (and its cache), or the bundle.

Hub downloads go through :func:`huggingface_hub.snapshot_download`, which keeps files in the shared Hugging
Face cache. ``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` (or ``HF_HOME``) are read when a model is loaded, not
only when huggingface_hub is imported, so setting them at run time works.
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

from specframe.errors import CheckpointError, ConfigError

DEFAULT_MODEL = "nemotron-stdlib-tiny"
ADAPTER_FOLDER = "linear_spec_lora"

MODEL_PATTERNS = (
    "config.json",
    "backbone_config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model-*.bin",
    "pytorch_model.bin.index.json",
)
ADAPTER_PATTERNS = tuple(f"{ADAPTER_FOLDER}/{name}" for name in ("adapter_config.json", "adapter_model.*"))

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_TRUE = {"1", "ON", "YES", "TRUE"}


def bundled_models_folder() -> Path:
    """The folder that holds the bundled models (``specframe/assets/models``; it may be missing)."""
    return Path(str(resources.files("specframe").joinpath("assets", "models")))


def bundled_model_names() -> list[str]:
    """Names of the models shipped inside this installation (usable wherever a model is named)."""
    folder = bundled_models_folder()
    if not folder.is_dir():
        return []
    return sorted(entry.name for entry in folder.iterdir() if (entry / "config.json").is_file())


def bundled_model(name: str = DEFAULT_MODEL) -> Path:
    """The folder of a model shipped inside the package (``specframe/assets/models/<name>``).

    Raises:
        CheckpointError: If this installation does not ship that model.
    """
    folder = bundled_models_folder() / name
    if not folder.is_dir():
        raise CheckpointError(
            f"this installation of specframe ships no bundled model {name!r} "
            f"(looked for specframe/assets/models/{name}); pass a Hub repo id such as "
            "'nvidia/Nemotron-Labs-Diffusion-8B' or a local checkpoint folder"
        )
    return folder


def model_display_name(name: str) -> str:
    """A model name as a reader can reproduce it: a bundled model by its name, not this machine's path.

    Args:
        name: A Hub repo id, a checkpoint folder, or the folder of a bundled model.

    Returns:
        ``"<name> (bundled)"`` for a folder of this installation's bundled models, otherwise ``name`` unchanged.
    """
    path = Path(name)
    if path.is_dir() and path.resolve().parent == bundled_models_folder().resolve():
        return f"{path.name} (bundled)"
    return name


def hub_offline() -> bool:
    """Whether Hub access is disabled (``HF_HUB_OFFLINE``, read now)."""
    import huggingface_hub.constants as constants

    value = os.environ.get("HF_HUB_OFFLINE")
    return value.upper() in _TRUE if value is not None else bool(constants.HF_HUB_OFFLINE)


#: Seconds to wait for a TCP connection to the Hub before treating it as unreachable.
REACH_TIMEOUT_S = 3.0
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def hub_unreachable(timeout: float = REACH_TIMEOUT_S) -> str | None:
    """Why the Hub cannot be reached now, or ``None`` if a connection to it opens (or a proxy decides).

    ``huggingface_hub`` retries a failing request for about 30 seconds before it gives up (or falls back to
    its cache); one connection attempt finds a machine without network at once, so that a download can go
    straight to the cache, or fail with a message, instead. The endpoint is ``HF_ENDPOINT``'s (default
    ``https://huggingface.co``). Behind a proxy the check is skipped: only the proxy knows.
    """
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return None
    import socket
    from urllib.parse import urlsplit

    import huggingface_hub.constants as constants

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    url = urlsplit(endpoint)
    if not url.hostname:
        return None
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"the Hub at {url.hostname} cannot be reached ({exc.strerror or type(exc).__name__})"


def hub_cache_dir() -> str | None:
    """The Hugging Face cache folder named by the environment now, or ``None`` for the library default."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def _local_source(source: str | os.PathLike[str] | None) -> Path | None:
    """The folder of a local or bundled source, or ``None`` for a Hub repo id (or a missing folder)."""
    if source is None:
        return bundled_model()
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(f"{path} is a file; pass the checkpoint folder that contains config.json")
        return path if path.is_absolute() else path.resolve()  # messages name the folder, "." included
    text = os.fspath(source)
    from specframe.models.named import NAMED_MODELS, pulled_folder

    if text in NAMED_MODELS:
        return pulled_folder(text)
    return bundled_model(text) if text in bundled_model_names() else None


def resolve_source(
    source: str | os.PathLike[str] | None, *, revision: str | None = None, adapter: bool = False
) -> Path:
    """The local folder holding a model's files, downloading them from the Hub if needed.

    Args:
        source: ``None`` for the bundled default model, a local folder, the name of a bundled model (see
            :func:`bundled_model_names`; a local folder of the same name wins), or a Hub repo id.
        revision: Hub branch, tag or commit; only for a Hub repo id.
        adapter: Also fetch the proposal-only adapter folder (``linear_spec_lora/``) from the Hub.

    Raises:
        CheckpointError: If the folder does not exist or the repo cannot be found, reached or read from cache.
        ConfigError: If a revision is given for a local folder or a bundled model (it would be ignored).
    """
    local = _local_source(source)
    if local is not None:
        if revision is not None:
            shown = local.name if source is None else os.fspath(source)
            raise ConfigError(
                f"revision {revision!r} applies to Hub repo ids only, and model {shown!r} is a local folder "
                "or a bundled model; drop the revision (--revision)"
            )
        return local
    text = os.fspath(source)
    if isinstance(source, Path) or not _REPO_ID.match(text):
        raise CheckpointError(f"checkpoint folder {text!r} does not exist (and it is not a Hub repo id)")
    patterns = list(MODEL_PATTERNS) + (list(ADAPTER_PATTERNS) if adapter else [])
    try:
        return download(text, revision=revision, patterns=patterns)
    except CheckpointError as exc:
        bundled = ", ".join(bundled_model_names()) or "none"
        raise CheckpointError(
            f"{exc} (no local folder {text!r} exists either; bundled models: {bundled})"
        ) from exc.__cause__


def download(repo_id: str, *, revision: str | None, patterns: list[str], filename: str | None = None) -> Path:
    """Fetch files of a Hub repo into (or find them in) the Hugging Face cache.

    Args:
        repo_id: Hub repository id.
        revision: Branch, tag or commit.
        patterns: Files to fetch (``snapshot_download`` allow patterns), unless ``filename`` is given.
        filename: Fetch only this file and return its path.

    Returns:
        The snapshot folder (or the file's path when ``filename`` is given).

    Raises:
        CheckpointError: Explaining why the files are unavailable and what to do.
    """
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = hub_offline()
    unreachable = None if offline else hub_unreachable()
    cache = hub_cache_dir()
    where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    offline = offline or unreachable is not None  # no network: the cache alone, without 30 s of retries
    try:
        if filename is not None:
            return Path(
                hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache, local_files_only=offline)
            )
        return Path(
            snapshot_download(
                repo_id, revision=revision, cache_dir=cache, local_files_only=offline, allow_patterns=patterns
            )
        )
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise CheckpointError(
            f"Hub repo {where} was not found or is gated: check the id, or log in (`hf auth login`) if it is "
            f"private or gated ({type(exc).__name__})"
        ) from exc
    except RevisionNotFoundError as exc:
        raise CheckpointError(f"Hub repo {repo_id!r} has no revision {revision!r}") from exc
    except LocalEntryNotFoundError as exc:
        reason = unreachable or ("offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the Hub could not be reached")
        raise CheckpointError(
            f"model {where} is not in the Hugging Face cache ({cache or 'default location'}) and {reason}; "
            "download it once with network access, or pass a local checkpoint folder"
        ) from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot fetch {where} from the Hub: {type(exc).__name__}: {exc}") from exc
