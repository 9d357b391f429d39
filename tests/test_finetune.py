"""Fine-tuning: from a (tiny, test-made) pretrained folder to a new folder that loads again, with
the loss on the new text going down, unknown symbols reported, and the Python and LightningCLI
forms working."""

import json
from collections import Counter

import lightning as L
import pytest
import torch
import yaml

import zoo
from test_hub import PAIRS, save_tiny
from zoo.cards import validate_card
from zoo.cli import CONFIG_DIR
from zoo.finetune import FinetuneDataModule, finetune, finetune_command, vocabulary_report
from zoo.hub import load_folder
from zoo.tokenizers import CharTokenizer, UnknownSymbolError, WordTokenizer



@pytest.fixture
def char_text(tmp_path):
    """New text over the tiny model's alphabet (test_hub.TEXT), different in content."""
    path = tmp_path / "new.txt"
    path.write_text("".join(f"Whether to suffer, or not to be: that is {w}:\n"
                            for w in ("the mind", "nobler", "the question", "tis") * 40))
    return path


def test_char_model_refuses_unknown_characters_listing_them():
    tokenizer = CharTokenizer.train("abc \n")
    with pytest.raises(UnknownSymbolError) as error:
        vocabulary_report(tokenizer, "abc zz é\n", what="my.txt")
    message = str(error.value)
    assert "my.txt has 3 characters outside" in message and "no <unk>" in message
    assert "'z' x2" in message and "'é' x1" in message


def test_word_model_maps_unknown_words_to_unk_and_says_so():
    tokenizer = WordTokenizer.train("the cat sat\n<unk> the mat\n")
    report = vocabulary_report(tokenizer, "the dog sat on the mat\nthe dog\n")
    assert "3 of 10 words (2 distinct) are outside the vocabulary and become <unk>" in report
    assert "'dog' x2" in report
    assert "every one of its words" in vocabulary_report(tokenizer, "the cat\n")
    no_unk = WordTokenizer(["<eos>", "the", "cat"], unk=None)
    with pytest.raises(UnknownSymbolError, match="'dog' x1"):
        vocabulary_report(no_unk, "the dog\n")


@pytest.mark.parametrize("arch", ["gru_lm_tiny", "transformer_tiny"])
def test_finetune_lowers_the_loss_on_new_text_and_the_folder_loads(tmp_path, char_text, arch):
    parent = tmp_path / "gru_lm_small.shakespeare_char"  # a registry name: the card names its parent
    save_tiny(parent, arch)
    out = tmp_path / "tuned"
    result = finetune(str(parent), char_text, max_steps=30, out=out, batch_size=4, seq_len=32,
                      learning_rate=3e-3, accelerator="cpu")
    assert result["val_loss_after"] < result["val_loss_before"] - 0.1, result
    assert result["steps"] == 30
    tuned = zoo.load(out)
    assert tuned.tokenizer.to_dict() == zoo.load(parent).tokenizer.to_dict(), "the parent's tokenizer is kept"
    assert tuned.config["training"]["parent"]["name"] == "gru_lm_small.shakespeare_char"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["val_loss"] == pytest.approx(result["val_loss_after"], abs=1e-5)
    card = validate_card((out / "README.md").read_text())
    assert card.data.base_model == "sequence-zoo/gru_lm_small-shakespeare_char"
    assert "fine-tuned" in card.data.tags and "| val_loss_before |" in card.text
    before = load_folder(parent)[0]
    assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), tuned.model.state_dict().values()))


def test_finetune_translator_on_a_tsv(tmp_path):
    parent = tmp_path / "bahdanau_small.multi30k_de_en"
    save_tiny(parent, "bahdanau_tiny")
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS * 3))
    result = finetune(str(parent), tsv, max_steps=25, out=tmp_path / "tuned", batch_size=8, learning_rate=5e-3,
                      accelerator="cpu")
    assert result["val_loss_after"] < result["val_loss_before"]
    assert zoo.load(tmp_path / "tuned").family == "seq2seq"


def test_finetune_command_refuses_unknown_characters_before_training(tmp_path, capsys):
    save_tiny(tmp_path / "m")
    text = tmp_path / "odd.txt"
    text.write_text("To be, or not to be\n" * 20 + "Ζεύς\n")
    with pytest.raises(SystemExit) as error:
        finetune_command(str(tmp_path / "m"), str(text), max_steps=2, out=str(tmp_path / "out"))
    counts = Counter("Ζεύς")
    assert str(error.value).startswith("zoo finetune: ")
    assert all(f"{c!r} x{n}" in str(error.value) for c, n in counts.items())
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit, match="--data is required"):
        finetune_command(str(tmp_path / "m"))


def test_text_too_short_is_a_clear_error(tmp_path):
    save_tiny(tmp_path / "m")
    text = tmp_path / "short.txt"
    text.write_text("To be\nor\n")
    with pytest.raises(ValueError, match="too short"):
        finetune(str(tmp_path / "m"), text, max_steps=2, out=tmp_path / "out", accelerator="cpu")


def test_lightning_module_with_your_own_trainer(tmp_path, char_text):
    save_tiny(tmp_path / "m")
    lit = zoo.lightning_module(str(tmp_path / "m"), learning_rate=1e-3, warmup_steps=1)
    reference = load_folder(tmp_path / "m")[0]
    assert all(torch.equal(a, b) for a, b in zip(lit.model.state_dict().values(), reference.state_dict().values()))
    data = FinetuneDataModule(str(tmp_path / "m"), corpus=str(char_text), batch_size=2, seq_len=16)
    assert data.mode == "stream" and data.tokenizer.to_dict() == lit.tokenizer.to_dict()
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(lit, datamodule=data)
    assert trainer.global_step == 3


def test_lightning_cli_recipe_fine_tunes(tmp_path, char_text):
    """configs/finetune/example.yaml, pointed at a tiny model and text, trains and exports."""
    from zoo.cli import main
    from zoo.export import export_command

    parent = tmp_path / "gru_lm_small.shakespeare_char"
    save_tiny(parent)
    recipe = yaml.safe_load((CONFIG_DIR / "finetune" / "example.yaml").read_text())
    assert recipe["model"]["init_args"]["init_from"] == recipe["data"]["init_args"]["init_from"]
    run = tmp_path / "runs" / "tuned"
    recipe["model"]["init_args"].update(arch="gru_lm_tiny", init_from=str(parent))
    recipe["data"]["init_args"].update(init_from=str(parent), corpus=str(char_text), batch_size=2, seq_len=16)
    recipe["trainer"].update(max_steps=3, accelerator="cpu", val_check_interval=3, default_root_dir=str(run),
                             logger=False, enable_progress_bar=False)
    recipe["trainer"]["callbacks"][0]["init_args"]["dirpath"] = str(run / "checkpoints")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    main(["fit", "--config", str(path)])
    export_command(str(run / "checkpoints" / "last.ckpt"), str(tmp_path / "exported"))
    exported = zoo.load(tmp_path / "exported")
    assert exported.config["training"]["parent"]["name"] == str(parent)
    assert exported.config["training"]["global_step"] == 3
