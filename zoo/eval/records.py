"""Result records: one JSON object per (model, task, metric), carrying what it takes to reproduce it.

A record names the model and its revision (the sha256 of its weights file), the task and its
version, the context policy, precision, batch size and seed, and the environment (hardware,
package versions, git commit). Records are grouped in one file per (suite, model), written
atomically, under `evaluate/results/<suite>/<model>.json`.
"""

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import torch

from zoo.io import atomic_write_text

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "evaluate" / "results"
SCHEMA_VERSION = 1
PACKAGES = ("torch", "lightning", "numpy", "sacrebleu", "tokenizers", "safetensors", "zoo", "lm_eval")


def file_sha256(path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@lru_cache(maxsize=1)
def git_state() -> dict:
    """The commit of this checkout and whether tracked files differ from it."""
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None}


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(device: str = "cpu") -> dict:
    info = {
        "machine": platform.machine(),
        "processor": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["accelerator"] = torch.cuda.get_device_name(torch.device(device))
    return info


def environment(device: str = "cpu") -> dict:
    """Everything about the machine and software a result depends on."""
    return {
        "hardware": hardware(device),
        "packages": package_versions(),
        "git": git_state(),
        "platform": platform.platform(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def make_record(model: dict, task: dict, metric: str, value, *, unit: str = "", context_policy: str = "",
                precision: str = "float32", batch_size: int | None = None, seed: int | None = None,
                details: dict | None = None, series: dict | None = None, env: dict | None = None) -> dict:
    """One result.

    Args:
        model: `{"name", "revision", ...}` from `model_info`.
        task: `{"name", "version", "suite", ...}` from the suite file.
        metric: the metric's name, e.g. "bits_per_char".
        value: a number, or None for a record that carries only a `series`.
        series: curves, `{"x": [...], "y": [...], ...}` (per-position loss, BLEU by length, ...).
        details: what else is needed to read or recompute the value (token counts, signatures, ...).
    """
    if isinstance(value, torch.Tensor):
        value = value.item()
    return {
        "schema": SCHEMA_VERSION,
        "model": model["name"],
        "revision": model.get("revision"),
        "model_info": model,
        "suite": task["suite"],
        "task": task["name"],
        "task_version": task["version"],
        "metric": metric,
        "value": value,
        "unit": unit,
        "context_policy": context_policy,
        "precision": precision,
        "batch_size": batch_size,
        "seed": seed,
        "details": details or {},
        "series": series,
        "environment": env if env is not None else environment(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def results_path(output, suite: str, model_name: str) -> Path:
    safe = model_name.replace("/", "__")
    return Path(output) / suite / f"{safe}.json"


def write_records(path, records: list[dict]) -> Path:
    """Write a list of records as one JSON file, atomically."""
    atomic_write_text(path, json.dumps({"records": records}, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    return Path(path)


def read_records(results_dir=RESULTS_DIR) -> list[dict]:
    """Every record under a results folder (as written by `write_records`), sorted by suite, task, model."""
    records = []
    for path in sorted(Path(results_dir).rglob("*.json")):
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:
            raise ValueError(f"{path} is not valid JSON ({error}); delete it and re-run 'zoo evaluate'") from None
        if isinstance(payload, dict) and isinstance(payload.get("records"), list):
            records.extend(payload["records"])
    return sorted(records, key=lambda r: (r["suite"], r["task"], r["model"], r["metric"]))


def find(records: list[dict], **where) -> list[dict]:
    """Records whose fields equal every `where` value, e.g. `find(records, metric="bleu")`."""
    return [r for r in records if all(r.get(k) == v for k, v in where.items())]
