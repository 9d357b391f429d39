"""Save and load model folders in Hub layout: `config.json` + `model.safetensors` + `tokenizer.json`
(+ `README.md`, the model card, and `metrics.json`, the measured results).

`config.json` holds `{"family": ..., "architecture": ..., "config": {...}, "dtype": ...}`; weights
load with `strict=True` into a model built from that config.

`load(name)` finds a model, in order, as: a local folder, the shipped `checkpoints/<name>/`, the
local Hugging Face cache, the Hub. Offline (`HF_HUB_OFFLINE=1`, or the Hub unreachable) it uses
what is local or fails at once, saying what is missing and how to get it. `HF_ENDPOINT`,
`HF_HUB_OFFLINE` and `HF_HUB_CACHE` are read at call time, not when `huggingface_hub` is imported.
"""

import contextlib
import dataclasses
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from zoo.io import atomic_write_bytes, atomic_write_text
from zoo.models import family_of, model_from_config
from zoo.registry import UnknownModelError, Variant, find_variant, get_variant
from zoo.tokenizers import TOKENIZER_FILE, load_tokenizers, save_tokenizers

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# What `load` needs, and what a published folder holds.
LOAD_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
FOLDER_FILES = (*LOAD_FILES, "metrics.json", "README.md")
DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 3.0


class ModelNotAvailableError(FileNotFoundError):
    """The model is neither local nor downloadable now (offline, unreachable, or not on the Hub)."""


def _unique_state_dict(model: torch.nn.Module, dtype: torch.dtype | None) -> dict:
    """State dict without the duplicate entries of tied weights (safetensors refuses shared storage)."""
    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        tensor = tensor.detach().cpu()
        state[name] = (tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor).contiguous()
    return state


def save_pretrained(folder, model: torch.nn.Module, tokenizers: dict, architecture: str | None = None,
                    dtype: torch.dtype | None = None, metadata: dict | None = None) -> Path:
    """Write a model folder: config, weights (cast to `dtype`, e.g. torch.float16, when given), tokenizers.

    Every file is written atomically.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "family": family_of(model),
        "architecture": architecture,
        "config": dataclasses.asdict(model.config),
        "dtype": str(dtype or torch.float32).removeprefix("torch."),
        **(metadata or {}),
    }
    atomic_write_bytes(folder / WEIGHTS_FILE, save(_unique_state_dict(model, dtype), metadata={"format": "pt"}))
    save_tokenizers(folder, tokenizers)
    atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return folder


def read_config(folder) -> dict:
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a zoo model folder: {CONFIG_FILE} is missing")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); re-download the model") from None
    missing = [key for key in ("family", "config") if not isinstance(config, dict) or key not in config]
    if missing:
        raise ValueError(f"{path} lacks {missing}; it was not written by zoo's save_pretrained, re-export the model")
    return config


def load_folder(folder, device: str | torch.device = "cpu"):
    """Load `(model, tokenizers)` from a local model folder, in eval mode, fp32.

    Raises a clear error for a missing or corrupt weights file and for a config that does not
    match the weights.
    """
    folder = Path(folder)
    config = read_config(folder)
    model = model_from_config(config["family"], config["config"])
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{folder} has no {WEIGHTS_FILE}; re-download or re-export the model")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{weights} is corrupt or truncated ({error}); delete it and download the model again") from None
    expected = model.state_dict()
    # Tied weights are stored once; restore the aliases before the strict load.
    for name in expected:
        if name not in state:
            for other, tensor in expected.items():
                if other in state and tensor.data_ptr() == expected[name].data_ptr():
                    state[name] = state[other]
                    break
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [n for n in expected if n in state and state[n].shape != expected[n].shape]
    if missing or unexpected or mismatched:
        details = "; ".join(
            part for part in (
                f"missing {missing[:5]}" if missing else "",
                f"unexpected {unexpected[:5]}" if unexpected else "",
                ", ".join(f"{n}: weights {tuple(state[n].shape)} vs config {tuple(expected[n].shape)}" for n in mismatched[:5]),
            ) if part
        )
        raise ValueError(f"config.json in {folder} does not match its weights ({details}); the folder is inconsistent")
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    tokenizers = load_tokenizers(folder)
    return model.to(device).eval(), tokenizers


@dataclass
class Pretrained:
    """A loaded model with its tokenizers. Unpacks as `model, tokenizer = zoo.load(...)`.

    Attributes:
        model: the plain `nn.Module`, in eval mode.
        tokenizers: `{"tokenizer": tok}` for LMs, `{"source": tok, "target": tok}` for translators.
        name: what it was loaded as (registry name, repo id or path).
        folder: the local folder the files came from.
        config: the parsed `config.json`.
    """

    model: torch.nn.Module
    tokenizers: dict
    name: str
    folder: Path
    config: dict

    @property
    def tokenizer(self):
        """The LM tokenizer, or the target-side tokenizer of a translator."""
        return self.tokenizers.get("tokenizer") or self.tokenizers.get("target")

    @property
    def family(self) -> str:
        return self.config["family"]

    def __iter__(self):
        yield self.model
        yield self.tokenizer


def hub_endpoint() -> str:
    """The Hub's URL: `HF_ENDPOINT` at call time, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    """Whether `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is set now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in ("1", "on", "yes", "true")


def hub_cache_dir() -> str | None:
    """The Hugging Face cache from `HF_HUB_CACHE` / `HF_HOME` at call time (None: the library's default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def hub_reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the endpoint opens within `timeout` seconds, so that a machine
    without network fails at once instead of waiting through the client's retries. Behind a proxy
    the proxy decides, so this answers True."""
    url = urlparse(endpoint)
    loopback = url.hostname in ("localhost", "::1") or (url.hostname or "").startswith("127.")
    proxies = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    if not loopback and any(os.environ.get(name) for name in proxies):
        return True
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _has_files(folder, files) -> bool:
    return all((Path(folder) / name).is_file() for name in files if name in LOAD_FILES)


def cached_snapshot(repo_id: str, revision: str, files=LOAD_FILES) -> Path | None:
    """The cached snapshot of `repo_id` at `revision` holding `files`, or None. Never goes online."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=list(files), local_files_only=True,
                                   cache_dir=hub_cache_dir())
    except Exception:  # noqa: BLE001 - any cache miss (absent, partial, bad ref) means "not cached"
        return None
    return Path(folder) if _has_files(folder, files) else None


def _not_available(label: str, repo_id: str, revision: str, reason: str, fix: str | None = None):
    cache = hub_cache_dir() or "the default Hugging Face cache"
    fix = fix or (f"Run 'zoo download {label}' where the Hub can be reached (with HF_HUB_OFFLINE unset), "
                  "or pass the path of a model folder")
    return ModelNotAvailableError(
        f"{label} (Hub repo {repo_id}, revision {revision!r}) is not available: {reason}, and it is neither "
        f"shipped in checkpoints/ nor in {cache}. {fix}"
    )


def _hub_errors() -> tuple[type[Exception], ...]:
    """What a download raises for HTTP errors, missing files and network failures."""
    from huggingface_hub.errors import EntryNotFoundError

    errors = (OSError, EntryNotFoundError)
    try:
        import httpx2  # huggingface_hub >= 1.x talks through httpx2

        errors += (httpx2.HTTPError,)
    except ImportError:
        pass
    return errors


def download_snapshot(repo_id: str, revision: str, files=FOLDER_FILES, label: str | None = None) -> Path:
    """Download `files` of `repo_id` at `revision` into the Hugging Face cache; the snapshot folder.

    Raises:
        ModelNotAvailableError: offline, the Hub unreachable, or the repo, revision or files missing.
    """
    from huggingface_hub import snapshot_download

    label, endpoint = label or repo_id, hub_endpoint()
    if hub_offline():
        raise _not_available(label, repo_id, revision, "HF_HUB_OFFLINE is set")
    if not hub_reachable(endpoint):
        raise _not_available(label, repo_id, revision, f"the Hub at {endpoint} cannot be reached")
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=list(files), endpoint=endpoint,
                                   cache_dir=hub_cache_dir())
    except _hub_errors() as error:
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise _not_available(label, repo_id, revision, f"{endpoint} answered {type(error).__name__}: {first_line}",
                             fix="Check the repo id and the revision (a private repo needs HF_TOKEN).") from None
    if not _has_files(folder, files):
        missing = [name for name in LOAD_FILES if name in files and not (Path(folder) / name).is_file()]
        raise ModelNotAvailableError(f"{repo_id} at revision {revision!r} lacks {missing}; it is not a zoo model repo")
    return Path(folder)


def _looks_like_repo_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~"))


def hub_target(name_or_repo: str, revision: str | None = None) -> tuple[str, str, Variant | None]:
    """`(repo_id, revision, variant)` for a registry name or a repo id; the registry pins the revision.

    Raises:
        UnknownModelError: neither a registered name nor a repo id (with did-you-mean suggestions).
    """
    variant = find_variant(name_or_repo)
    if variant is not None:
        return variant.hub_repo, revision or variant.revision, variant
    if _looks_like_repo_id(name_or_repo):
        return name_or_repo, revision or "main", None
    get_variant(name_or_repo)  # raises with suggestions
    raise UnknownModelError(name_or_repo)


def resolve(name_or_path, revision: str | None = None, files=LOAD_FILES) -> Path:
    """The local folder of a model: a folder path, a shipped checkpoint, a cached or downloaded snapshot.

    Args:
        name_or_path: a model folder, a registry name (`gru_lm_small.shakespeare_char`) or a Hub repo id.
        revision: a branch, tag or commit of the Hub repo; the registry's pinned revision when None.
        files: the files the caller needs (downloads fetch only these).
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if revision is not None:
            raise ValueError(f"revision={revision!r} applies to Hub models, but {path} is a local folder")
        return path
    text = str(name_or_path)
    if find_variant(text) is None and not _looks_like_repo_id(text) and (os.sep in text or text.startswith(".")):
        raise FileNotFoundError(f"no model folder {text!r}; pass an existing folder, a registry name or a repo id")
    repo_id, revision_used, variant = hub_target(text, revision)
    if variant is not None and revision in (None, variant.revision) and variant.folder.is_dir():
        return variant.folder
    cached = cached_snapshot(repo_id, revision_used, files)
    if cached is not None:
        return cached
    return download_snapshot(repo_id, revision_used, files, label=text)


def resolve_folder_name(name_or_path) -> tuple[Path, str]:
    """`(folder, name)` of a local model: a folder path, or a registry name's `checkpoints/<name>/`
    (which may not exist yet). Never looks at the Hub."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path, path.resolve().name
    return get_variant(str(name_or_path)).folder, str(name_or_path)


def load(name_or_path, revision: str | None = None, device: str | torch.device = "cpu") -> Pretrained:
    """A ready `Pretrained` model (eval mode, fp32) by folder, registry name or Hub repo id.

    Resolution order: a local folder, the shipped `checkpoints/<name>/`, the Hugging Face cache,
    the Hub (only the files needed: config, weights, tokenizer).

    Args:
        name_or_path: e.g. "gru_lm_small.shakespeare_char", "sequence-zoo/gru_lm_small-shakespeare_char"
            or "path/to/folder".
        revision: Hub branch, tag or commit; the registry's pinned revision when None.
        device: where to put the model.

    Raises:
        UnknownModelError: an unknown name (with suggestions; see `zoo list`).
        ModelNotAvailableError: not local and not downloadable now (says how to get it).
        ValueError: a corrupt or inconsistent folder.
    """
    if isinstance(name_or_path, Pretrained):
        return name_or_path
    folder = resolve(name_or_path, revision)
    model, tokenizers = load_folder(folder, device)
    return Pretrained(model, tokenizers, str(name_or_path), folder, read_config(folder))


def pretrained_tokenizers(name_or_path, revision: str | None = None) -> dict:
    """Only the tokenizers of a model (by folder, name or repo id), without building the model."""
    return load_tokenizers(resolve(name_or_path, revision, files=(CONFIG_FILE, TOKENIZER_FILE)))


@contextlib.contextmanager
def user_errors(command: str):
    """Turn the errors a user can fix into one line, `zoo COMMAND: message`, without a traceback."""
    try:
        yield
    except (FileNotFoundError, ValueError, KeyError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise SystemExit(f"zoo {command}: {message}") from None


def download_command(name_or_repo: str, revision: str | None = None) -> None:
    """Download a pretrained model into the Hugging Face cache and print its local folder.

    Fetches the whole model folder (config, weights, tokenizer, card, metrics) at the registry's
    pinned revision, or the one given; `zoo.load` then finds it offline too.

    Args:
        name_or_repo: a registry name (see `zoo list`) or a Hub repo id such as ORG/NAME.
        revision: a branch, tag or commit sha.
    """
    with user_errors("download"):
        repo_id, revision_used, _ = hub_target(name_or_repo, revision)
        folder = download_snapshot(repo_id, revision_used, FOLDER_FILES, label=name_or_repo)
        read_config(folder)
    print(folder)


def upload_files(folder) -> list[str]:
    """The files of a model folder that a push uploads (no temporary or hidden files)."""
    return [name for name in FOLDER_FILES if (Path(folder) / name).is_file()]


def prepare_upload(name_or_path, repo_id: str | None = None) -> Path:
    """Make a model folder ready to publish; the folder.

    Checks that it loads (strict weights, tokenizer), then (re)writes its model card from the
    registry, config.json and metrics.json, and validates the card's metadata.

    Args:
        name_or_path: a registry name (checkpoints/NAME) or a model folder.
        repo_id: the Hub repo the card names (default: the registry's).
    """
    from zoo.cards import write_card

    folder, name = resolve_folder_name(name_or_path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{name} is not shipped: {folder} does not exist; train and export it first")
    load_folder(folder)
    write_card(folder, name, repo_id)
    return folder


def push_command(name: str, repo_id: str | None = None, private: bool = False, revision: str | None = None,
                 dry_run: bool = False) -> None:
    """Publish a model folder to the Hugging Face Hub in one commit, with a freshly generated card.

    Needs a write token (`HF_TOKEN` or `hf auth login`). Prints the commit URL; pin its sha as the
    variant's `revision` in zoo/registry.py.

    Args:
        name: a registry name (uploads checkpoints/NAME) or a model folder.
        repo_id: ORG/NAME on the Hub (default: the registry's repo for a registered name).
        private: create the repo private.
        revision: the branch to commit to (created when missing; default main).
        dry_run: check the folder and write the card, list what would be uploaded, upload nothing.
    """
    with user_errors("push"):
        variant = find_variant(Path(name).name) or find_variant(name)
        repo_id = repo_id or (variant.hub_repo if variant else None)
        if not repo_id:
            raise ValueError(f"{name} is not a registered model; pass --repo_id ORG/NAME")
        folder = prepare_upload(name, repo_id)
        files = upload_files(folder)
        target = f"{hub_endpoint()}/{repo_id}" + (f" (branch {revision})" if revision else "")
        if dry_run:
            print(f"would upload to {target}:")
            print("\n".join(f"  {file}  {(folder / file).stat().st_size} bytes" for file in files))
            return
        if hub_offline() or not hub_reachable(hub_endpoint()):
            raise ModelNotAvailableError(f"cannot push: the Hub at {hub_endpoint()} is offline or unreachable")
        commit = _upload(folder, files, repo_id, private, revision)
    print(f"uploaded {len(files)} files to {target}\ncommit: {commit.commit_url}\nrevision: {commit.oid}")


def _upload(folder: Path, files: list[str], repo_id: str, private: bool, revision: str | None):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=hub_endpoint())
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        return api.upload_folder(repo_id=repo_id, folder_path=folder, allow_patterns=files, revision=revision,
                                 commit_message=f"Upload {folder.name}")
    except HfHubHTTPError as error:
        raise ValueError(f"the Hub refused the upload to {repo_id}: {str(error).splitlines()[0]} "
                         "(a write token is needed: set HF_TOKEN or run 'hf auth login')") from None
