"""Bad input gets one clear error that names the offending value and says what to do."""

import shutil

import lightning as L
import pytest
import torch

from zoo.cli import main as zoo_main
from zoo.data import CORPORA, LMDataModule, StreamWindows, load_corpus
from zoo.lit import CausalLMModule
from zoo.models import build_model
from zoo.tokenizers import CharTokenizer, UnknownSymbolError, WordTokenizer


def test_unknown_architecture_names_it_and_suggests_the_closest():
    with pytest.raises(KeyError) as error:
        build_model("gru_lm_smal", vocab_size=10)
    message = str(error.value)
    assert message.startswith("unknown architecture 'gru_lm_smal'")
    assert "did you mean 'gru_lm_small'" in message
    with pytest.raises(KeyError, match="did you mean 'transformer_tiny'"):
        CausalLMModule(arch="transfomer_tiny", vocab_size=10)


def test_unknown_config_field_is_named_with_a_suggestion():
    with pytest.raises(ValueError, match=r"\['hiden_size'\]; did you mean 'hidden_size'"):
        build_model("gru_lm_tiny", vocab_size=10, hiden_size=8)


def test_unknown_recipe_names_it_and_suggests_the_closest():
    with pytest.raises(SystemExit) as error:
        zoo_main(["fit", "--config", "gru_lm_smal.shakespeare_char"])
    message = str(error.value.code)
    assert "no recipe 'gru_lm_smal.shakespeare_char'" in message
    assert "did you mean gru_lm_small.shakespeare_char" in message


def test_unknown_corpus_names_it_and_suggests_the_closest():
    with pytest.raises(ValueError, match=r"unknown corpus 'ptb_wrd'; did you mean 'ptb_word'"):
        LMDataModule(corpus="ptb_wrd")


def test_data_directory_without_the_files_names_path_and_missing_files(tiny_data_dir, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_data_dir, data_dir)
    (data_dir / CORPORA["ptb_word"]["files"]["val"]).unlink()
    with pytest.raises(FileNotFoundError) as error:
        load_corpus("ptb_word", data_dir)
    message = str(error.value)
    assert f"data directory {data_dir} lacks the ptb_word files" in message
    assert str(data_dir / "ptb/ptb.valid.txt") in message
    assert str(data_dir / "ptb/ptb.train.txt") not in message.split(";")[0]  # only what is missing
    assert "ZOO_DATA_DIR" in message
    with pytest.raises(FileNotFoundError, match=f"data directory {tmp_path / 'nowhere'} does not exist"):
        LMDataModule(corpus="shakespeare_char", data_dir=str(tmp_path / "nowhere")).setup("fit")


def test_characters_outside_the_vocabulary_are_refused_by_name():
    tokenizer = CharTokenizer.train("hello world")
    with pytest.raises(UnknownSymbolError) as error:
        tokenizer.encode("hello Wörld")
    message = str(error.value)
    assert "'W'" in message and "'ö'" in message and "remove or replace them" in message
    assert isinstance(error.value, ValueError)


def test_words_outside_a_vocabulary_without_unk_are_refused_by_name():
    tokenizer = WordTokenizer(["<eos>", "the", "cat"], unk=None)
    assert tokenizer.unk is None
    with pytest.raises(UnknownSymbolError, match=r"'dog'.*no <unk>.*replace them with known words"):
        tokenizer.encode("the dog\n")


def test_sequence_longer_than_the_context_names_both_lengths():
    model = build_model("transformer_tiny", vocab_size=10).eval()
    block = model.config.block_size
    with pytest.raises(ValueError, match=rf"sequence of {block + 1} positions exceeds the context of {block}.*shorten"):
        model(torch.zeros(1, block + 1, dtype=torch.long))
    _, state = model(torch.zeros(1, block - 1, dtype=torch.long), model.init_state(1))
    with pytest.raises(ValueError, match=rf"sequence of {block + 1} positions exceeds"):
        model(torch.zeros(1, 2, dtype=torch.long), state)


def test_pad_mask_of_the_wrong_shape_is_refused():
    model = build_model("transformer_tiny", vocab_size=10)
    with pytest.raises(ValueError, match=r"pad_mask of shape \(1, 3\) does not match tokens \(1, 4\)"):
        model(torch.zeros(1, 4, dtype=torch.long), None, torch.ones(1, 3, dtype=torch.bool))


def test_stream_batch_that_does_not_split_across_devices():
    with pytest.raises(ValueError, match="batch_size=5 must be divisible by the 2 devices"):
        StreamWindows(torch.arange(100), batch_size=5, seq_len=4, rank=0, world_size=2)


def test_unknown_data_mode_and_positions():
    with pytest.raises(ValueError, match="unknown mode 'window'.*'stream'.*'windows'"):
        LMDataModule(mode="window")
    with pytest.raises(ValueError, match="unknown positions 'rope'"):
        build_model("transformer_tiny", vocab_size=10, positions="rope")


def test_vocab_size_that_disagrees_with_the_data_is_refused(tiny_data_dir):
    datamodule = LMDataModule(corpus="shakespeare_char", data_dir=str(tiny_data_dir), batch_size=2, seq_len=8)
    module = CausalLMModule(arch="gru_lm_tiny", vocab_size=7)
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match=r"vocab_size=7 does not match the DataModule's tokenizer \(vocab_size=\d+\); leave it unset"):
        trainer.fit(module, datamodule=datamodule)
