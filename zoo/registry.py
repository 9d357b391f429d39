"""Pretrained variants, timm-style `family_size.tag`: one line each.

Each names its architecture, the corpus it was trained on, its recipe in `configs/`, and where it
lives on the Hub (repo id and pinned revision). Measured metrics come from the shipped folder's
`metrics.json`, written by the training and evaluation code, never typed in here.
"""

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path

from zoo.models import suggest

CHECKPOINT_DIR = Path(__file__).resolve().parents[1] / "checkpoints"
HUB_ORG = "sequence-zoo"


@dataclass(frozen=True)
class Variant:
    name: str
    architecture: str
    corpus: str
    headline: str  # the metric `zoo list` shows
    revision: str = "main"
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

    def metrics(self) -> dict:
        path = self.folder / "metrics.json"
        return json.loads(path.read_text()) if path.is_file() else {}


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


def get_variant(name: str) -> Variant:
    if name not in PRETRAINED:
        raise KeyError(f"unknown model {name!r}{suggest(name, PRETRAINED)}; see 'zoo list'")
    return PRETRAINED[name]


def list_models(pattern: str = "*") -> list[str]:
    """Names of the pretrained variants matching a shell-style pattern, e.g. `list_models("gru*")`."""
    return sorted(n for n in PRETRAINED if fnmatch.fnmatch(n, pattern))


def list_command(pattern: str = "*") -> None:
    """List the pretrained models.

    Args:
        pattern: shell-style filter on the name, e.g. "gru*".
    """
    for name in list_models(pattern):
        print(name)
