"""Corpora, splits, tokenizers and the windows the DataModules hand to training."""

import gzip

import pytest
import torch

from zoo.data import (
    CORPORA, BlockWindows, LMDataModule, StreamWindows, TranslationDataModule, collate_pairs, load_corpus,
    split_document,
)
from zoo.tokenizers import CharTokenizer, WordTokenizer, load_tokenizers, save_tokenizers


def test_shakespeare_split_is_first_90_percent_then_last_10(tiny_data_dir):
    text = (tiny_data_dir / CORPORA["shakespeare_char"]["files"]["text"]).read_text(encoding="utf-8")
    texts = load_corpus("shakespeare_char", tiny_data_dir)
    cut = int(len(text) * 0.9)
    assert texts["train"] == text[:cut]
    assert texts["val"] == text[cut:]


def test_real_shakespeare_split_and_vocabulary(real_data_dir):
    text = (real_data_dir / CORPORA["shakespeare_char"]["files"]["text"]).read_text(encoding="utf-8")
    texts = load_corpus("shakespeare_char", real_data_dir)
    assert len(text) == 1_115_394
    assert (len(texts["train"]), len(texts["val"])) == (1_003_854, 111_540)  # nanoGPT's split
    assert texts["train"] + texts["val"] == text
    assert CharTokenizer.train(text).vocab_size == 65


def test_real_ptb_vocabulary_has_unk_and_eos(real_data_dir):
    if not (real_data_dir / CORPORA["ptb_word"]["files"]["train"]).is_file():
        pytest.skip(f"PTB not found in {real_data_dir}")
    texts = load_corpus("ptb_word", real_data_dir)
    tokenizer = WordTokenizer.train(texts["train"])
    assert tokenizer.vocab_size == 10_000
    assert tokenizer.unk == "<unk>" and tokenizer.eos_id == 0
    ids = tokenizer.encode(texts["val"][:2000])
    assert tokenizer.index["<unk>"] in ids


def _two_alphabet_corpus(tmp_path):
    """A user text file whose first 90% uses only 'abc' and last 10% only 'xyz' (split at a line)."""
    lines = ["abcabcab" for _ in range(90)] + ["xyzxyzxy" for _ in range(10)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("mode", ["windows", "stream"])
def test_no_window_straddles_train_and_val(tmp_path, mode):
    path = _two_alphabet_corpus(tmp_path)
    datamodule = LMDataModule(corpus=str(path), batch_size=4, seq_len=16, mode=mode, val_batch_size=2)
    datamodule.setup("fit")
    tokenizer = datamodule.tokenizer
    train_ids = {tokenizer.index[c] for c in "abc\n"}
    val_ids = {tokenizer.index[c] for c in "xyz\n"}
    train_batches = list(datamodule.train_dataloader())
    val_batches = list(datamodule.val_dataloader())
    assert train_batches and val_batches
    for inputs, targets in train_batches:
        assert set(inputs.unique().tolist()) | set(targets.unique().tolist()) <= train_ids
    for inputs, targets in val_batches:
        assert set(inputs.unique().tolist()) | set(targets.unique().tolist()) <= val_ids


def test_validation_windows_cover_the_split_without_overlap():
    ids = torch.arange(103)
    windows = BlockWindows(ids, block_size=10, stride=10)
    inputs = torch.cat([windows[i][0] for i in range(len(windows))])
    assert torch.equal(inputs, ids[:100])
    for i in range(len(windows)):
        assert torch.equal(windows[i][1], windows[i][0] + 1)


def test_word_tokenizer_eos_and_unk():
    tokenizer = WordTokenizer.train("the cat sat\nthe <unk> ran\n")
    assert tokenizer.tokens[0] == "<eos>" and tokenizer.unk == "<unk>"
    ids = tokenizer.encode("the dog sat\nran\n")
    words = [tokenizer.tokens[i] for i in ids]
    assert words == ["the", "<unk>", "sat", "<eos>", "ran", "<eos>"]
    assert tokenizer.decode(ids) == "the <unk> sat\nran\n"
    assert tokenizer.encode("the cat") == [tokenizer.index["the"], tokenizer.index["cat"]]  # no newline, no <eos>


def test_tokenizers_round_trip_through_tokenizer_json(tmp_path):
    char = CharTokenizer.train("hello world\n")
    word = WordTokenizer.train("a b c\n")
    save_tokenizers(tmp_path, {"source": char, "target": word})
    loaded = load_tokenizers(tmp_path)
    assert loaded["source"].to_dict() == char.to_dict() and loaded["target"].to_dict() == word.to_dict()
    assert loaded["source"].decode(loaded["source"].encode("hello")) == "hello"


def test_stream_windows_are_contiguous_and_rows_continue_across_batches():
    ids = torch.arange(1001)
    batch_size, seq_len = 4, 7
    stream = StreamWindows(ids, batch_size, seq_len)
    batches = list(stream)
    assert len(batches) == len(stream)
    n = 1000 // batch_size
    rows = torch.cat([inputs for inputs, _ in batches], dim=1)
    targets = torch.cat([t for _, t in batches], dim=1)
    assert torch.equal(rows, ids[: n * batch_size].view(batch_size, n))
    assert torch.equal(targets, rows + 1)
    for (previous, previous_targets), (current, _) in zip(batches, batches[1:]):
        assert torch.equal(current[:, 0], previous[:, -1] + 1)  # each row picks up where it stopped
        assert torch.equal(current[:, 0], previous_targets[:, -1])


def test_stream_rows_are_sliced_across_ranks():
    ids = torch.arange(401)
    whole = list(StreamWindows(ids, batch_size=4, seq_len=5))
    ranks = [list(StreamWindows(ids, batch_size=4, seq_len=5, rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(whole)
    for i, (inputs, targets) in enumerate(whole):
        assert torch.equal(torch.cat([ranks[0][i][0], ranks[1][i][0]]), inputs)
        assert torch.equal(torch.cat([ranks[0][i][1], ranks[1][i][1]]), targets)
        assert ranks[0][i][0].shape == (2, inputs.shape[1])


def test_lm_datamodule_reads_every_lm_corpus_of_the_layout(tiny_data_dir):
    for corpus, spec in CORPORA.items():
        if spec["level"] == "pairs":
            continue
        datamodule = LMDataModule(corpus=corpus, data_dir=str(tiny_data_dir), batch_size=2, seq_len=8)
        datamodule.setup("fit")
        assert set(datamodule.splits) == {"train", "val", "test"}
        inputs, targets = next(iter(datamodule.train_dataloader()))
        assert inputs.shape == targets.shape == (2, 8)
        assert int(inputs.max()) < datamodule.tokenizer.vocab_size


def test_translation_datamodule_batches(tiny_data_dir):
    datamodule = TranslationDataModule(data_dir=str(tiny_data_dir), batch_size=5, src_vocab_size=60, tgt_vocab_size=60)
    datamodule.setup("fit")
    source, target = datamodule.tokenizers["source"], datamodule.tokenizers["target"]
    src, src_lengths, tgt_in, tgt_out = next(iter(datamodule.val_dataloader()))
    assert src.shape[0] == src_lengths.shape[0] == tgt_in.shape[0] == 5
    assert (tgt_in[:, 0] == target.bos_id).all()
    for row in range(5):
        length = int(src_lengths[row])
        assert src[row, length - 1] == source.eos_id and (src[row, length:] == 0).all()
        real = tgt_out[row][tgt_out[row] != 0]
        assert real[-1] == target.eos_id
        assert torch.equal(tgt_in[row, 1 : len(real)], real[:-1])
    val_de = gzip.decompress((tiny_data_dir / CORPORA["multi30k_de_en"]["files"]["val.de"]).read_bytes()).decode()
    assert source.decode(src[0, : int(src_lengths[0]) - 1].tolist()) == val_de.splitlines()[0]


def test_collate_pairs_pads_with_zero():
    src, src_lengths, tgt_in, tgt_out = collate_pairs([([5, 6, 7], [2, 8, 3]), ([9], [2, 8, 8, 3])])
    assert src.tolist() == [[5, 6, 7], [9, 0, 0]] and src_lengths.tolist() == [3, 1]
    assert tgt_in.tolist() == [[2, 8, 0], [2, 8, 8]] and tgt_out.tolist() == [[8, 3, 0], [8, 8, 3]]


def test_user_text_file_splits_at_a_line_boundary():
    texts = split_document("one\ntwo\nthree\nfour\nfive\n" * 4, by_line=True)
    assert texts["train"].endswith("\n") and texts["train"] + texts["val"] == "one\ntwo\nthree\nfour\nfive\n" * 4


def test_window_mode_validation_covers_the_split_once_and_training_overlaps_by_half(tiny_data_dir):
    datamodule = LMDataModule(corpus="shakespeare_char", data_dir=str(tiny_data_dir), batch_size=3, seq_len=10,
                              mode="windows", val_batch_size=4)
    datamodule.setup("fit")
    val = datamodule.splits["val"]
    inputs = torch.cat([batch.flatten() for batch, _ in datamodule.val_dataloader()])
    usable = (len(val) - 1) // 10 * 10
    assert torch.equal(inputs, val[:usable])
    train_windows = datamodule.train_dataloader().dataset
    train = datamodule.splits["train"]
    for i in range(3):
        assert torch.equal(train_windows[i][0], train[5 * i : 5 * i + 10])
        assert torch.equal(train_windows[i][1], train[5 * i + 1 : 5 * i + 11])
    assert len(datamodule.train_dataloader()) == len(train_windows) // 3  # only full training batches
