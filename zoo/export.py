"""Turn a Lightning training checkpoint into a shipped model folder."""

import json
import os
import platform
from pathlib import Path

import torch

from zoo.hub import save_pretrained
from zoo.io import atomic_write_text
from zoo.lit import CausalLMModule, TranslationModule
from zoo.models import architecture, task_of


def module_from_checkpoint(ckpt_path):
    """Load a zoo LightningModule from a `.ckpt` with `weights_only=True` (no pickles run)."""
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    arch = checkpoint["hyper_parameters"]["arch"]
    module_class = CausalLMModule if task_of(architecture(arch)[0]) == "causal_lm" else TranslationModule
    return module_class.load_from_checkpoint(ckpt_path, map_location="cpu", weights_only=True)


def training_record(ckpt, checkpoint: dict) -> dict:
    """What the model card says about training: steps, hyper-parameters, wall time, recipe command."""
    run_dir = Path(ckpt).resolve().parent.parent
    wall = run_dir / "wall_seconds"
    return {
        "global_step": checkpoint.get("global_step"),
        "hyper_parameters": dict(checkpoint["hyper_parameters"]),
        "command": f"zoo fit --config configs/{run_dir.name}.yaml",
        "wall_seconds": int(wall.read_text()) if wall.is_file() else None,
        "hardware": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }


def export_command(ckpt: str, out: str, dtype: str = "float16", metrics: str | None = None) -> None:
    """Write a model folder (config, safetensors weights, tokenizers) from a Lightning checkpoint.

    Args:
        ckpt: path to the Lightning `.ckpt`.
        out: the model folder to write, e.g. checkpoints/gru_lm_small.shakespeare_char.
        dtype: weight dtype in the folder: float32, float16 or bfloat16.
        metrics: optional JSON string of measured metrics to store as metrics.json.
    """
    module = module_from_checkpoint(ckpt)
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    save_pretrained(out, module.model, module.tokenizers, architecture=module.hparams.arch,
                    dtype=getattr(torch, dtype), metadata={"training": {
                        "global_step": checkpoint.get("global_step"),
                        "hyper_parameters": dict(checkpoint["hyper_parameters"]),
                    }})
    if metrics:
        atomic_write_text(Path(out) / "metrics.json", json.dumps(json.loads(metrics), indent=2) + "\n")
    print(f"wrote {out}")
