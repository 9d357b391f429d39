"""Pretrained variants, timm-style `family_size.tag`: one line each.

Each names its architecture, the corpus it was trained on, its recipe in `configs/`, and where it
lives on the Hub (repo id and pinned revision). Measured metrics come from the shipped folder's
`metrics.json`, written by the training and evaluation code, never typed in here.
"""

import fnmatch
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from zoo.models import suggest

CHECKPOINT_DIR = Path(__file__).resolve().parents[1] / "checkpoints"
HUB_ORG = "sequence-zoo"
METRICS_FILE = "metrics.json"

# corpus -> tokenizer kind, and the vocabulary size its tokenizer reaches (for `zoo list` before a
# folder is downloaded; the shipped config.json gives the exact count).
CORPUS_TOKENIZERS = {
    "shakespeare_char": ("char", 65),
    "ptb_word": ("word", 10000),
    "wikitext2_word": ("word", 33278),
    "multi30k_de_en": ("bpe", None),  # sizes from the recipe's DataModule
}


class UnknownModelError(KeyError):
    """A name that is neither a registered variant, a repo id nor a model folder."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Variant:
    name: str
    architecture: str
    corpus: str
    headline: str  # the metric `zoo list` shows
    revision: str = "main"  # TODO: pin the commit sha that `zoo push` prints once each repo is published
    repo_id: str = field(default="")

    @property
    def hub_repo(self) -> str:
        return self.repo_id or f"{HUB_ORG}/{self.name.replace('.', '-')}"

    @property
    def recipe(self) -> Path:
        return CHECKPOINT_DIR.parent / "configs" / f"{self.name}.yaml"

    @property
    def folder(self) -> Path:
        return CHECKPOINT_DIR / self.name

    @property
    def tokenizer(self) -> str:
        """Tokenizer kind: "char", "word" or "bpe"."""
        return CORPUS_TOKENIZERS.get(self.corpus, ("?", None))[0]

    def metrics(self) -> dict[str, float]:
        """Measured metrics from the shipped folder (`{}` when not shipped or not measured yet)."""
        return read_metrics(self.folder)

    def headline_value(self) -> float | None:
        return self.metrics().get(self.headline)


PRETRAINED = {
    v.name: v
    for v in (
        Variant("rnn_lm_small.shakespeare_char", "rnn_lm_small", "shakespeare_char", "val_loss"),
        Variant("gru_lm_small.shakespeare_char", "gru_lm_small", "shakespeare_char", "val_loss"),
        Variant("transformer_small.shakespeare_char", "transformer_small", "shakespeare_char", "val_loss"),
        Variant("rnn_lm_medium.ptb_word", "rnn_lm_medium", "ptb_word", "test_ppl"),
        Variant("gru_lm_medium.ptb_word", "gru_lm_medium", "ptb_word", "test_ppl"),
        Variant("transformer_medium.ptb_word", "transformer_medium", "ptb_word", "test_ppl"),
        Variant("bahdanau_small.multi30k_de_en", "bahdanau_small", "multi30k_de_en", "test_bleu"),
        Variant("seq2seq_noattn_small.multi30k_de_en", "seq2seq_noattn_small", "multi30k_de_en", "test_bleu"),
    )
}


def flatten_metrics(data: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a (possibly nested) metrics dict, keys joined by "_": `{"test": {"ppl": 1}}`
    becomes `{"test_ppl": 1.0}`."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}_{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten_metrics(value, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat


def read_metrics(folder) -> dict[str, float]:
    """`metrics.json` of a model folder, flattened; `{}` when absent, a warning when unreadable."""
    path = Path(folder) / METRICS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        warnings.warn(f"{path} is not valid JSON ({error}); ignoring it", stacklevel=2)
        return {}
    return flatten_metrics(data) if isinstance(data, dict) else {}


def get_variant(name: str) -> Variant:
    if name not in PRETRAINED:
        hint = suggest(name, PRETRAINED)
        raise UnknownModelError(f"unknown model {name!r}{hint}{' ' if hint else '; '}see 'zoo list'")
    return PRETRAINED[name]


def find_variant(name_or_repo: str) -> Variant | None:
    """The variant registered under a name or a Hub repo id, else None."""
    if name_or_repo in PRETRAINED:
        return PRETRAINED[name_or_repo]
    return next((v for v in PRETRAINED.values() if v.hub_repo == name_or_repo), None)


def list_models(pattern: str = "*") -> list[str]:
    """Names of the pretrained variants matching a shell-style pattern, e.g. `list_models("gru*")`."""
    return sorted(n for n in PRETRAINED if fnmatch.fnmatch(n, pattern))


def _recipe_vocab(variant: Variant) -> dict:
    """Vocabulary sizes from the recipe's DataModule arguments (translation recipes set them)."""
    import yaml

    if not variant.recipe.is_file():
        return {}
    data = (yaml.safe_load(variant.recipe.read_text()) or {}).get("data", {}).get("init_args", {})
    return {key: data[key] for key in ("src_vocab_size", "tgt_vocab_size") if key in data}


def count_parameters(variant: Variant) -> tuple[int | None, bool]:
    """`(parameters, exact)`: exact from the shipped config.json, else estimated from the architecture
    and the corpus's usual vocabulary. Built on the meta device, so nothing is allocated."""
    import dataclasses

    import torch

    from zoo.models import architecture, model_from_config

    family, config = architecture(variant.architecture)
    values, exact = dataclasses.asdict(config), False
    config_path = variant.folder / "config.json"
    if config_path.is_file():
        values, exact = json.loads(config_path.read_text())["config"], True
    elif family == "seq2seq":
        values.update(_recipe_vocab(variant))
    elif CORPUS_TOKENIZERS.get(variant.corpus, (None, None))[1]:
        values["vocab_size"] = CORPUS_TOKENIZERS[variant.corpus][1]
    with torch.device("meta"):
        model = model_from_config(family, values)
    return sum(p.numel() for p in model.parameters()), exact


def format_count(count: int | None) -> str:
    if count is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)


def list_command(pattern: str = "*") -> None:
    """List the pretrained models: name, parameters, corpus, headline metric.

    Parameter counts marked "~" are estimates (the model is not shipped or downloaded yet).

    Args:
        pattern: shell-style filter on the name, e.g. "gru*".
    """
    names = list_models(pattern)
    if not names:
        raise SystemExit(f"zoo list: no model matches {pattern!r}; try 'zoo list' for all of them")
    rows = [("name", "params", "corpus", "tokenizer", "metric", "shipped")]
    for name in names:
        variant = PRETRAINED[name]
        count, exact = count_parameters(variant)
        value = variant.headline_value()
        metric = f"{variant.headline}={value:.4g}" if value is not None else f"{variant.headline}=—"
        shipped = "yes" if variant.folder.is_dir() else "no"
        rows.append((name, ("" if exact else "~") + format_count(count), variant.corpus, variant.tokenizer, metric,
                     shipped))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
