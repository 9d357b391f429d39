"""`zoo evaluate`: run the suites over models and write one JSON record per (model, task, metric).

Which model runs which suite: `lm` and `gradients` take language models, on the task of the
corpus each was trained on; `translation` takes translators; `speed` takes every model (plus one
model-independent attention-map measurement); `probes` trains its own small models and ignores
the model list.
"""

import json
import re
import time
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from zoo.eval.records import REPO_ROOT, RESULTS_DIR, environment, file_sha256, read_records, results_path, write_records
from zoo.eval.suites import (LoadedModel, RunContext, run_attention_map, run_gradients, run_lm, run_probes, run_speed,
                             run_translation)
from zoo.io import atomic_write_text

SUITES = ("lm", "translation", "speed", "probes", "gradients")
SUITE_DIR = REPO_ROOT / "evaluate" / "suites"


def load_suite(name: str, suite_dir=SUITE_DIR) -> dict:
    """A suite's task definitions from `evaluate/suites/<name>.yaml` (or a YAML path)."""
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else Path(suite_dir) / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no suite file {path}; suites: {', '.join(SUITES)}")
    suite = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in ("suite", "version", "tasks"):
        if key not in suite:
            raise ValueError(f"{path} lacks '{key}'; see the suites in {SUITE_DIR}")
    return suite


def parse_suites(suite: str) -> list[str]:
    """`"all"`, one suite name, or a comma-separated list, validated."""
    names = list(SUITES) if suite == "all" else [s.strip() for s in suite.split(",") if s.strip()]
    unknown = [s for s in names if s not in SUITES and s != "none"]
    if unknown or not names:
        raise ValueError(f"unknown suite {', '.join(unknown) or repr(suite)}; use one of {', '.join(SUITES)}, all or none")
    return [s for s in names if s != "none"]


def parse_models(models) -> list[str]:
    """Model names from `"a,b"`, a list, or `"all"` (every registered variant with a shipped folder)."""
    from zoo.registry import PRETRAINED

    items = [models] if isinstance(models, str) else list(models)
    names = [n for item in items for n in re.split(r"[,\s]+", str(item).strip("[] ")) if n]
    if "all" in names:
        shipped = [v.name for v in PRETRAINED.values() if (v.folder / "model.safetensors").is_file()]
        names = [n for n in names if n != "all"] + shipped
    return list(dict.fromkeys(names))


def model_corpus(name: str, folder: Path, corpus: str | None) -> str | None:
    """The corpus a model was trained on: `corpus` if given, else its registry entry, else its folder suffix."""
    from zoo.data import CORPORA
    from zoo.registry import PRETRAINED

    if corpus:
        return corpus
    if name in PRETRAINED:
        return PRETRAINED[name].corpus
    suffix = Path(folder).name.rsplit(".", 1)[-1]
    return suffix if suffix in CORPORA else None


def load_model(name: str, device: str = "cpu", corpus: str | None = None) -> LoadedModel:
    """Load a model by registry name or folder, with the facts every record carries."""
    from zoo.hub import load

    pretrained = load(name, device=device)
    folder = Path(pretrained.folder)
    registered = not Path(name).exists()
    info = {
        "name": name if registered else folder.resolve().name,
        "revision": "sha256:" + file_sha256(folder / "model.safetensors"),
        "folder": str(folder.resolve().relative_to(REPO_ROOT) if folder.resolve().is_relative_to(REPO_ROOT) else folder),
        "family": pretrained.family,
        "architecture": pretrained.config.get("architecture"),
        "weights_dtype": pretrained.config.get("dtype"),
        "n_parameters": sum(p.numel() for p in pretrained.model.parameters()),
        "corpus": model_corpus(name, folder, corpus),
    }
    return LoadedModel(pretrained, info)


def plan_units(suites: list[str], loaded: dict[str, LoadedModel], definitions: dict) -> list[tuple[str, str | None]]:
    """`(suite, model name or None)` for every unit of work, skipping suites a model does not take."""
    units = []
    for suite in suites:
        if suite == "probes":
            units.append((suite, None))
            continue
        for name, model in loaded.items():
            lm_model = model.family != "seq2seq"
            if suite == "speed" or (suite == "translation" and not lm_model):
                units.append((suite, name))
            elif suite in ("lm", "gradients") and lm_model:
                if suite == "lm" and not _lm_task(definitions["lm"], model):
                    raise ValueError(f"no lm task for {name} (corpus {model.info['corpus']!r}); pass --corpus "
                                     f"one of {[t['corpus'] for t in definitions['lm']['tasks'].values()]}")
                units.append((suite, name))
        if suite == "speed":
            units.append((suite, None))  # the attention map, independent of any model
    return units


def _lm_task(definition: dict, model: LoadedModel):
    return next(((n, t) for n, t in definition["tasks"].items() if t["corpus"] == model.info["corpus"]), None)


def _translation_task(definition: dict, model: LoadedModel):
    tasks = definition["tasks"]
    return next(((n, t) for n, t in tasks.items() if t["corpus"] == model.info["corpus"]), next(iter(tasks.items())))


def run_unit(suite: str, name: str | None, model: LoadedModel | None, definition: dict, ctx: RunContext,
             progress) -> dict[str, list[dict]]:
    """Records of one unit, keyed by the model name they are filed under."""
    torch.manual_seed(ctx.seed)
    name = model.info["name"] if model is not None else name
    if suite == "probes":
        return run_probes(definition, ctx, progress)
    if suite == "speed" and model is None:
        return {"attention_map": run_attention_map(definition, ctx)}
    if suite == "lm":
        return {name: run_lm(model, definition, *_lm_task(definition, model), ctx)}
    if suite == "translation":
        return {name: run_translation(model, definition, *_translation_task(definition, model), ctx)}
    if suite == "speed":
        return {name: run_speed(model, definition, ctx)}
    corpus = model.info["corpus"]
    if corpus not in definition["tasks"]["gradient_paths"]["splits"]:
        raise ValueError(f"gradients: no split defined for corpus {corpus!r} of {name}; add it to gradients.yaml")
    return {name: run_gradients(model, definition, corpus, ctx)}


def evaluate(models, suite: str = "all", output=RESULTS_DIR, data_dir: str | None = None, device: str = "cpu",
             corpus: str | None = None, seed: int = 0, suite_dir=SUITE_DIR) -> list[dict]:
    """Run suites over models, write each unit's records to `output/<suite>/<model>.json`; return all records."""
    suites = parse_suites(suite)
    names = parse_models(models) if any(s != "probes" for s in suites) else []
    definitions = {s: load_suite(s, suite_dir) for s in suites}
    loaded = {name: load_model(name, device, corpus) for name in names}
    units = plan_units(suites, loaded, definitions)
    ctx = RunContext(Path(output), data_dir, device, seed, environment(device))
    n_probes = len(definitions["probes"]["architectures"]) * len(definitions["probes"]["tasks"]) if "probes" in suites else 0
    total = len(units) - ("probes" in suites) + n_probes
    records = []
    with tqdm(total=total, desc="zoo evaluate", unit="task", disable=not units) as bar:
        for unit_suite, name in units:
            shown = loaded[name].info["name"] if name else "-"
            bar.set_postfix_str(f"{unit_suite} {shown}")
            start = time.perf_counter()
            grouped = run_unit(unit_suite, name, loaded.get(name), definitions[unit_suite], ctx, lambda: bar.update(1))
            for filed_under, unit_records in grouped.items():
                write_records(results_path(output, unit_suite, filed_under), unit_records)
                records.extend(unit_records)
            if unit_suite != "probes":
                bar.update(1)
            bar.write(f"{unit_suite:<11} {shown:<40} {time.perf_counter() - start:7.1f} s")
    return records


def headline_metrics(records: list[dict]) -> dict:
    """The quality metrics a model card shows, from one model's records (keys as `zoo.registry` headlines
    name them: `val_loss`, `test_ppl`, `test_bleu`, ...). Speed figures depend on the machine and stay out."""
    metrics = {}
    for record in records:
        metric, details = record["metric"], record.get("details", {})
        split = details.get("split", "test")
        if record["suite"] == "lm" and (metric in ("bits_per_char", "nll_per_token") or metric.endswith("_perplexity")):
            key = {"bits_per_char": "bpc", "nll_per_token": "loss"}.get(metric, "ppl")
            metrics[f"{split}_{key}"] = record["value"]
            metrics["eval_context_policy"] = record["context_policy"]
        elif record["suite"] == "translation" and record["value"] is not None and metric != "teacher_forced_perplexity":
            name, decoder = metric.rsplit("_", 1)
            metrics[f"{split}_{name}" + ("" if decoder == "beam5" else f"_{decoder}")] = record["value"]
        elif metric == "teacher_forced_perplexity":
            metrics[f"{split}_teacher_forced_ppl"] = record["value"]
    return metrics


def write_metrics_files(models, results_dir=RESULTS_DIR) -> list[Path]:
    """Write each model's headline metrics into `<its folder>/metrics.json`, merged with what is there.

    Reads the records already under `results_dir` (run `zoo evaluate` first).
    """
    records = read_records(results_dir)
    written = []
    for name in parse_models(models):
        name = Path(name).resolve().name if Path(name).exists() else name
        own = [r for r in records if r["model"] == name]
        if not own:
            raise FileNotFoundError(f"no results for {name!r} under {results_dir}; run 'zoo evaluate {name}' first")
        folder = REPO_ROOT / own[0]["model_info"]["folder"]  # relative folders are under the repository
        path = folder / "metrics.json"
        current = json.loads(path.read_text()) if path.is_file() else {}
        latest = max(own, key=lambda r: r["created"])
        current.update(headline_metrics(own))
        current["evaluation"] = {"revision": latest["revision"], "git_commit": latest["environment"]["git"]["commit"],
                                 "created": latest["created"], "command": "zoo evaluate"}
        atomic_write_text(path, json.dumps(current, indent=2) + "\n")
        written.append(path)
    return written


def evaluate_command(models: str, suite: str = "all", output: str = str(RESULTS_DIR), data_dir: str | None = None,
                     device: str = "cpu", corpus: str | None = None, seed: int = 0,
                     suite_dir: str = str(SUITE_DIR), write_metrics: bool = False) -> None:
    """Evaluate models on the shared suites and write one JSON record per (model, task, metric).

    Args:
        models: model names or folders, comma-separated, or "all" (every shipped checkpoint).
        suite: lm, translation, speed, probes, gradients, a comma-separated list, all, or none.
        output: results folder; files go to OUTPUT/SUITE/MODEL.json.
        data_dir: folder holding the corpora (default: ZOO_DATA_DIR or ../shared/data).
        device: cpu or cuda.
        corpus: the corpus of a model folder that is not in the registry (e.g. shakespeare_char).
        seed: seed of every random choice.
        suite_dir: folder of the suite definitions (SUITE.yaml files).
        write_metrics: afterwards, write each model's headline metrics from OUTPUT into its
            folder's metrics.json (use with --suite none to only do that).
    """
    try:
        evaluate(models, suite, output, data_dir, device, corpus, seed, suite_dir)
        if write_metrics:
            for path in write_metrics_files(models, output):
                print(f"wrote {path}")
    except (ValueError, FileNotFoundError, KeyError) as error:
        raise SystemExit(f"zoo evaluate: {error}") from None
