"""Turn a Lightning training checkpoint into a shipped model folder, and record its reference
("golden") logits so that a later loader or weight change is caught by the tests."""

import hashlib
import json
import os
import platform
from pathlib import Path

import torch

from zoo.hub import WEIGHTS_FILE, resolve_folder_name, save_pretrained, user_errors
from zoo.io import atomic_write_text
from zoo.registry import find_variant

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "tests" / "golden"
GOLDEN_LENGTH = 24  # tokens in the fixed input
GOLDEN_VOCAB_IDS = 16  # logits kept per position (plus logsumexp and argmax over the whole vocabulary)
GOLDEN_ATOL = 1e-3  # fp32 CPU kernels differ across machines by ~1e-6 relative; a changed weight by far more


def module_from_checkpoint(ckpt_path):
    """Load a zoo LightningModule from a `.ckpt` with `weights_only=True` (no pickles run)."""
    from zoo.lit import CausalLMModule, TranslationModule
    from zoo.models import architecture, task_of

    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    arch = checkpoint["hyper_parameters"]["arch"]
    module_class = CausalLMModule if task_of(architecture(arch)[0]) == "causal_lm" else TranslationModule
    return module_class.load_from_checkpoint(ckpt_path, map_location="cpu", weights_only=True)


def hardware() -> str:
    """This machine, e.g. "AMD EPYC, 2 CPU cores" (+ the GPU when one is visible)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    text = f"{cpu}, {os.cpu_count()} CPU cores"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def training_record(ckpt, checkpoint: dict) -> dict:
    """What the model card says about training: steps, hyper-parameters, wall time, recipe command.

    The run folder is `runs/NAME/` (the checkpoint sits in `runs/NAME/checkpoints/`); its
    `wall_seconds` file, written by scripts/train_checkpoints.sh, holds the training time. The
    hardware is the exporting machine's, which that script makes the training machine.
    """
    run_dir = Path(ckpt).resolve().parent.parent
    wall = run_dir / "wall_seconds"
    try:
        wall_seconds = int(wall.read_text().strip()) if wall.is_file() else None
    except ValueError:
        wall_seconds = None
    recipe = Path(__file__).resolve().parents[1] / "configs" / f"{run_dir.name}.yaml"
    hyper = {k: v for k, v in dict(checkpoint["hyper_parameters"]).items() if not k.startswith("_")}
    record = {
        "global_step": checkpoint.get("global_step"),
        "hyper_parameters": hyper,
        "command": f"zoo fit --config configs/{run_dir.name}.yaml" if recipe.is_file() else f"zoo fit (run {run_dir})",
        "wall_seconds": wall_seconds,
        "hardware": hardware(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }
    if hyper.get("init_from"):  # fine-tuned from a pretrained model
        variant = find_variant(str(hyper["init_from"]))
        record["parent"] = {"name": str(hyper["init_from"]), "repo_id": variant.hub_repo if variant else None,
                            "revision": variant.revision if variant else None,
                            "corpus": variant.corpus if variant else None}
    return record


def export_command(ckpt: str, out: str, dtype: str = "float16", metrics: str | None = None) -> None:
    """Write a model folder (config, safetensors weights, tokenizers) from a Lightning checkpoint.

    Args:
        ckpt: path to the Lightning `.ckpt`.
        out: the model folder to write, e.g. checkpoints/gru_lm_small.shakespeare_char.
        dtype: weight dtype in the folder: float32, float16 or bfloat16.
        metrics: optional JSON string of measured metrics to store as metrics.json.
    """
    if dtype not in ("float32", "float16", "bfloat16"):
        raise SystemExit(f"zoo export: unknown dtype {dtype!r}; use float32, float16 or bfloat16")
    module = module_from_checkpoint(ckpt)
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    save_pretrained(out, module.model, module.tokenizers, architecture=module.hparams.arch,
                    dtype=getattr(torch, dtype), metadata={"training": training_record(ckpt, checkpoint)})
    if metrics:
        atomic_write_text(Path(out) / "metrics.json", json.dumps(json.loads(metrics), indent=2) + "\n")
    print(f"wrote {out}")


def _fixed_ids(count: int, vocab_size: int, first: int = 0) -> torch.Tensor:
    """Deterministic, varied token ids in `[first, vocab_size)`: `(count,)`."""
    return first + (torch.arange(count) * 7919 + 13) % (vocab_size - first)


def golden_input(model) -> dict:
    """The fixed input of a model's golden test, as plain lists."""
    config = model.config
    if hasattr(config, "src_vocab_size"):
        src = _fixed_ids(GOLDEN_LENGTH // 2, config.src_vocab_size, first=4)  # skip pad/unk/bos/eos
        tgt = _fixed_ids(GOLDEN_LENGTH // 2, config.tgt_vocab_size, first=4)
        return {"src": [src.tolist()], "src_lengths": [len(src)], "tgt_in": [tgt.tolist()]}
    return {"tokens": [_fixed_ids(GOLDEN_LENGTH, config.vocab_size).tolist()]}


@torch.no_grad()
def golden_logits(model, inputs: dict) -> torch.Tensor:
    """Logits `(1, T, vocab_size)` of the fixed input, in fp32."""
    model = model.float().eval()
    if "src" in inputs:
        return model(torch.tensor(inputs["src"]), torch.tensor(inputs["src_lengths"]), torch.tensor(inputs["tgt_in"]))
    logits, _ = model(torch.tensor(inputs["tokens"]))
    return logits


def _summary(logits: torch.Tensor, vocab_ids: list[int]) -> dict:
    logits = logits[0].float()  # (T, V)
    return {
        "logits": [[round(v, 6) for v in row] for row in logits[:, vocab_ids].tolist()],
        "logsumexp": [round(v, 6) for v in torch.logsumexp(logits, dim=-1).tolist()],
        "argmax": logits.argmax(dim=-1).tolist(),
    }


def golden_reference(folder, name: str) -> dict:
    """Reference logits of a model folder for a fixed input (see `check_golden`)."""
    from zoo.hub import load

    pretrained = load(folder)
    inputs = golden_input(pretrained.model)
    logits = golden_logits(pretrained.model, inputs)
    vocab_ids = torch.linspace(0, logits.shape[-1] - 1, GOLDEN_VOCAB_IDS).long().unique().tolist()
    return {
        "name": name,
        "family": pretrained.family,
        "architecture": pretrained.config.get("architecture"),
        "weights_sha256": hashlib.sha256((Path(folder) / WEIGHTS_FILE).read_bytes()).hexdigest(),
        "torch": torch.__version__,
        "input": inputs,
        "vocab_ids": vocab_ids,
        **_summary(logits, vocab_ids),
    }


def check_golden(model, reference: dict, atol: float = GOLDEN_ATOL) -> list[str]:
    """Differences between a loaded model's logits and a stored reference; empty when they agree."""
    logits = golden_logits(model, reference["input"])
    if logits.shape[-1] <= max(reference["vocab_ids"]):
        return [f"vocabulary of {logits.shape[-1]} tokens, but the reference has ids up to {max(reference['vocab_ids'])}"]
    now = _summary(logits, reference["vocab_ids"])
    problems = []
    for key in ("logits", "logsumexp"):
        error = (torch.tensor(now[key]) - torch.tensor(reference[key])).abs().max().item()
        if error > atol:
            problems.append(f"{key} differ by up to {error:.3g} (tolerance {atol})")
    if now["argmax"] != reference["argmax"] and not problems:
        problems.append("the most likely tokens differ")
    return problems


def golden_command(name: str, out_dir: str | None = None) -> None:
    """Record the reference logits of a shipped model (tests/golden/NAME.json), checked by the tests.

    Run once when a checkpoint is shipped or deliberately replaced; the golden test then fails if
    the loader or the weights change what the model computes.

    Args:
        name: a registry name (checkpoints/NAME) or the path of a model folder.
        out_dir: where to write NAME.json (default: tests/golden).
    """
    with user_errors("golden"):
        folder, model_name = resolve_folder_name(name)
        if not folder.is_dir():
            raise FileNotFoundError(f"{model_name} is not shipped: {folder} does not exist; train and export it "
                                    f"first (scripts/train_checkpoints.sh {model_name})")
        reference = golden_reference(folder, model_name)
        path = Path(out_dir or GOLDEN_DIR) / f"{model_name}.json"
        # One line per key: readable diffs, small files.
        text = ",\n".join(f" {json.dumps(key)}: {json.dumps(value)}" for key, value in reference.items())
        atomic_write_text(path, "{\n" + text + "\n}\n")
    print(f"wrote {path}")
