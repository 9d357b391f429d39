"""Save and load model folders in Hub layout: `config.json` + `model.safetensors` + `tokenizer.json`
(+ `README.md`, the model card).

`config.json` holds `{"family": ..., "architecture": ..., "config": {...}, "dtype": ...}`; weights
load with `strict=True` into a model built from that config.
"""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from zoo.io import atomic_write_bytes, atomic_write_text
from zoo.models import family_of, model_from_config
from zoo.tokenizers import load_tokenizers, save_tokenizers

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


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
    tmp = folder / f".{WEIGHTS_FILE}.tmp"
    save_file(_unique_state_dict(model, dtype), str(tmp), metadata={"format": "pt"})
    tmp.replace(folder / WEIGHTS_FILE)
    save_tokenizers(folder, tokenizers)
    atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return folder


def read_config(folder) -> dict:
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a zoo model folder: {CONFIG_FILE} is missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); re-download the model") from None


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


def load(name_or_path, revision: str | None = None, device: str | torch.device = "cpu") -> Pretrained:
    """A ready `Pretrained` model from a local folder or a shipped checkpoint name.

    TODO: resolve registry names, the Hugging Face cache and the Hub (`zoo.load`).
    """
    if isinstance(name_or_path, Pretrained):
        return name_or_path
    path = Path(name_or_path)
    if not path.is_dir():
        path = Path(__file__).resolve().parents[1] / "checkpoints" / str(name_or_path)
    if not path.is_dir():
        raise FileNotFoundError(f"no model folder {name_or_path!r}")
    model, tokenizers = load_folder(path, device)
    return Pretrained(model, tokenizers, str(name_or_path), path, read_config(path))
