"""Every recipe in `configs/` parses, builds and runs one `fast_dev_run` step through `zoo fit`.

Data and model are shrunk on the command line (a fixture data directory with the real layout, a
small model via `--model.init_args.overrides`) so each recipe runs in seconds; everything else is
the recipe as shipped.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Trainer

from zoo.cli import CONFIG_DIR, main as zoo_main, resolve_recipe
from zoo.models import ARCHITECTURES, architecture
from zoo.registry import PRETRAINED

RECIPES = sorted(CONFIG_DIR.glob("*.yaml"))

# Per family: config fields that make any size of that family tiny.
SHRINK = {
    "rnn_lm": {"n_embd": 16, "hidden_size": 16, "n_layer": 1},
    "gru_lm": {"n_embd": 16, "hidden_size": 16, "n_layer": 1},
    "transformer": {"n_embd": 16, "n_head": 2, "n_layer": 1},
    "seq2seq": {"n_embd": 16, "encoder_hidden": 16, "decoder_hidden": 16, "attention_dim": 16},
}


def read_recipe(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def shrink_args(path: Path, data_dir: Path) -> list[str]:
    """Command-line overrides that keep `path`'s recipe but make its data and model tiny."""
    recipe = read_recipe(path)
    family = architecture(recipe["model"]["init_args"]["arch"])[0]
    args = ["--data.init_args.data_dir", str(data_dir), "--model.init_args.overrides", json.dumps(SHRINK[family])]
    if family == "seq2seq":
        args += ["--data.init_args.src_vocab_size", "60", "--data.init_args.tgt_vocab_size", "60",
                 "--data.init_args.batch_size", "4"]
    else:
        args += ["--data.init_args.seq_len", "16", "--data.init_args.batch_size", "4"]
    return args


def test_there_is_a_recipe_for_every_pretrained_variant():
    assert {p.stem for p in RECIPES} == set(PRETRAINED)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_names_its_architecture_and_corpus(path):
    recipe = read_recipe(path)
    variant = PRETRAINED[path.stem]
    assert recipe["model"]["init_args"]["arch"] == variant.architecture
    assert variant.architecture in ARCHITECTURES
    assert recipe["data"]["init_args"]["corpus"] == variant.corpus
    assert recipe["seed_everything"] is not None


@pytest.fixture
def fitted(monkeypatch, tmp_path) -> list:
    """The Trainers that `zoo fit` runs in this test, run from a scratch working directory."""
    monkeypatch.chdir(tmp_path)  # the recipes' runs/ folders land here
    monkeypatch.setattr(sys, "argv", ["zoo"])  # LightningCLI reads only the args it is given
    trainers, fit = [], Trainer.fit

    def recording_fit(self, *args, **kwargs):
        trainers.append(self)
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "fit", recording_fit)
    return trainers


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_runs_one_fast_dev_run_step(path, tiny_data_dir, fitted):
    zoo_main(["fit", "--config", str(path), "--trainer.fast_dev_run", "1", *shrink_args(path, tiny_data_dir)])
    (trainer,) = fitted
    recipe = read_recipe(path)
    module = trainer.lightning_module
    assert type(module).__name__ == recipe["model"]["class_path"].rsplit(".", 1)[1]
    assert module.hparams.arch == recipe["model"]["init_args"]["arch"]
    assert module.model.config.n_embd == 16  # the overrides reached the model
    assert trainer.global_step == 1
    assert torch.isfinite(trainer.callback_metrics["train_loss"])
    assert torch.isfinite(trainer.callback_metrics["val_loss"])


def test_recipe_resolves_by_name(tiny_data_dir, fitted):
    name = "gru_lm_small.shakespeare_char"
    assert resolve_recipe(name) == str(CONFIG_DIR / f"{name}.yaml")
    assert resolve_recipe(f"{name}.yaml") == str(CONFIG_DIR / f"{name}.yaml")
    path = CONFIG_DIR / f"{name}.yaml"
    zoo_main(["fit", "--config", name, "--trainer.fast_dev_run", "1", *shrink_args(path, tiny_data_dir)])
    assert fitted[0].lightning_module.hparams.arch == "gru_lm_small"
    assert fitted[0].global_step == 1


def test_unknown_recipe_is_a_clear_error_with_a_suggestion():
    with pytest.raises(SystemExit) as error:
        resolve_recipe("transformer_small.shakespeare")
    message = str(error.value.code)
    assert "no recipe 'transformer_small.shakespeare'" in message
    assert "did you mean transformer_small.shakespeare_char" in message
    assert "recipes:" in message and "gru_lm_small.shakespeare_char" in message
