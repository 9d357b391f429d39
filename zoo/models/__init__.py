"""The four model families and the table of their architectures.

An architecture is a family plus a config (`gru_lm_small`); a pretrained variant adds a corpus tag
(`gru_lm_small.shakespeare_char`, see `zoo.registry`). Adding an architecture is one line in the
family's `ARCHITECTURES` table.
"""

import dataclasses
import difflib

from torch import nn

from zoo.models import gru_lm, rnn_lm, seq2seq, transformer
from zoo.models.gru_lm import GRULM, GRULMConfig
from zoo.models.rnn_lm import RNNLM, RNNLMConfig
from zoo.models.seq2seq import Seq2Seq, Seq2SeqConfig
from zoo.models.transformer import KVCache, Transformer, TransformerConfig

# family -> (model class, config class, task)
FAMILIES = {
    "rnn_lm": (RNNLM, RNNLMConfig, "causal_lm"),
    "gru_lm": (GRULM, GRULMConfig, "causal_lm"),
    "transformer": (Transformer, TransformerConfig, "causal_lm"),
    "seq2seq": (Seq2Seq, Seq2SeqConfig, "translation"),
}

# architecture name -> (family, default config)
ARCHITECTURES = {
    **{name: ("rnn_lm", config) for name, config in rnn_lm.ARCHITECTURES.items()},
    **{name: ("gru_lm", config) for name, config in gru_lm.ARCHITECTURES.items()},
    **{name: ("transformer", config) for name, config in transformer.ARCHITECTURES.items()},
    **{name: ("seq2seq", config) for name, config in seq2seq.ARCHITECTURES.items()},
}


class UnknownNameError(KeyError, ValueError):
    """A name that is not in a table; prints its message plainly (a bare KeyError would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def suggest(name: str, choices) -> str:
    """' did you mean ...?' for a misspelt name, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def architecture(name: str):
    """`(family, config)` of a registered architecture, with a helpful error for unknown names."""
    if name not in ARCHITECTURES:
        raise UnknownNameError(
            f"unknown architecture {name!r}{suggest(name, ARCHITECTURES)} "
            f"(known: {', '.join(sorted(ARCHITECTURES))})"
        )
    return ARCHITECTURES[name]


def task_of(family: str) -> str:
    return FAMILIES[family][2]


def make_config(family: str, values: dict):
    """Build a family's config from a plain dict, rejecting unknown fields by name."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}{suggest(family, FAMILIES)}; known: {sorted(FAMILIES)}")
    config_class = FAMILIES[family][1]
    fields = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - fields)
    if unknown:
        hints = "".join(suggest(name, fields) for name in unknown)
        raise ValueError(f"unknown {family} config field(s) {unknown}{hints}; valid fields: {sorted(fields)}")
    return config_class(**values)


def build_model(name: str, **overrides) -> nn.Module:
    """A freshly initialised model of a registered architecture, with config fields overridden."""
    family, config = architecture(name)
    values = {**dataclasses.asdict(config), **overrides}
    return model_from_config(family, values)


def model_from_config(family: str, values: dict) -> nn.Module:
    """A freshly initialised model of `family` from a plain config dict (as stored in config.json)."""
    return FAMILIES[family][0](make_config(family, values))


def family_of(model: nn.Module) -> str:
    for family, (model_class, _, _) in FAMILIES.items():
        if type(model) is model_class:
            return family
    raise TypeError(f"{type(model).__name__} is not a zoo model")


__all__ = [
    "ARCHITECTURES", "FAMILIES", "GRULM", "GRULMConfig", "KVCache", "RNNLM", "RNNLMConfig", "Seq2Seq",
    "Seq2SeqConfig", "Transformer", "TransformerConfig", "architecture", "build_model", "family_of",
    "make_config", "model_from_config", "task_of", "UnknownNameError",
]
