"""Corpora and Lightning DataModules.

Files come from a data directory: the `data_dir` option, else the `ZOO_DATA_DIR` environment
variable, else `../shared/data` (beside the repository or the working directory) when it exists.
Without one, the same corpora load from the Hugging Face Hub by dataset id with `datasets`.

Splits are made on whole documents before any window is formed, so no window straddles train and
validation: Tiny Shakespeare is one document split at 90% (nanoGPT's split); PTB, WikiText-2 and
Multi30k come with their own splits.
"""

import gzip
import os
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from zoo.models import suggest
from zoo.tokenizers import BPETokenizer, CharTokenizer, WordTokenizer

ENV_VAR = "ZOO_DATA_DIR"

# corpus -> files under the data directory, the Hub dataset that holds the same text, its level.
CORPORA = {
    "shakespeare_char": {
        "level": "char",
        "files": {"text": "tinyshakespeare/input.txt"},
        "hub": {"path": "karpathy/tiny_shakespeare", "field": "text"},
        "license": "mit",
    },
    "ptb_word": {
        "level": "word",
        "files": {"train": "ptb/ptb.train.txt", "val": "ptb/ptb.valid.txt", "test": "ptb/ptb.test.txt"},
        "hub": {"path": "ptb-text-only/ptb_text_only", "field": "sentence"},
        "license": "other",
    },
    "wikitext2_word": {
        "level": "word",
        "files": {"train": "wikitext-2/train.txt", "val": "wikitext-2/valid.txt", "test": "wikitext-2/test.txt"},
        "hub": {"path": "Salesforce/wikitext", "name": "wikitext-2-v1", "field": "text"},
        "license": "cc-by-sa-3.0",
    },
    "multi30k_de_en": {
        "level": "pairs",
        "files": {
            f"{split}.{lang}": f"multi30k/{name}.{lang}.gz"
            for split, name in (("train", "train"), ("val", "val"), ("test", "test_2016_flickr"))
            for lang in ("de", "en")
        },
        "hub": {"path": "bentrevett/multi30k", "source": "de", "target": "en"},
        "license": "other",
    },
}
HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}


def default_data_dir() -> Path | None:
    """The data directory from the environment or the usual place beside the repository, if any."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    for base in (Path.cwd(), Path(__file__).resolve().parents[1]):
        candidate = base.parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return None


def _corpus(name: str) -> dict:
    if name not in CORPORA and not Path(name).is_file():
        raise ValueError(
            f"unknown corpus {name!r}{suggest(name, CORPORA)}; use one of {sorted(CORPORA)} or a path to a text file"
        )
    return CORPORA.get(name)


def _read(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read()


def _check_files(name: str, data_dir: Path) -> dict[str, Path]:
    files = {key: data_dir / rel for key, rel in CORPORA[name]["files"].items()}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        problem = "does not exist" if not data_dir.is_dir() else f"lacks the {name} files {missing}"
        raise FileNotFoundError(
            f"data directory {data_dir} {problem}; point data_dir (--data.data_dir) or {ENV_VAR} at a "
            f"folder holding {sorted(CORPORA[name]['files'].values())}, or unset both to load from the Hub"
        )
    return files


def _from_hub(name: str) -> dict[str, str]:
    """The corpus from the Hugging Face Hub (needs network)."""
    from datasets import load_dataset

    hub = CORPORA[name]["hub"]
    dataset = load_dataset(hub["path"], hub.get("name"))
    if name == "multi30k_de_en":
        return {
            f"{split}.{lang}": "\n".join(row[lang] for row in dataset[hub_split]) + "\n"
            for split, hub_split in HUB_SPLITS.items()
            for lang in ("de", "en")
        }
    texts = {split: "\n".join(dataset[hub_split][hub["field"]]) + "\n" for split, hub_split in HUB_SPLITS.items()}
    if name == "shakespeare_char":
        return {"text": texts["train"] + texts["val"] + texts["test"]}
    return texts


def load_corpus(name: str, data_dir=None) -> dict[str, str]:
    """Raw text of each split: `{"train", "val", "test"}` (LM corpora) or `{"train.de", ...}` (pairs).

    A path to a text file is a user corpus: split at a line boundary, first 90% train, last 10% val.
    """
    if name not in CORPORA and Path(name).is_file():
        return split_document(Path(name).read_text(encoding="utf-8"), by_line=True)
    _corpus(name)
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    if data_dir is None:
        texts = _from_hub(name)
    else:
        texts = {key: _read(path) for key, path in _check_files(name, data_dir).items()}
    if "text" in texts:
        return split_document(texts["text"])
    return texts


def split_document(text: str, fraction: float = 0.9, by_line: bool = False) -> dict[str, str]:
    """First `fraction` for training, the rest for validation (and, lacking a test split, as test)."""
    cut = int(len(text) * fraction)
    if by_line:
        newline = text.rfind("\n", 0, cut)
        cut = newline + 1 if newline > 0 else cut
    if cut <= 0 or cut >= len(text):
        raise ValueError(f"text of {len(text)} characters is too short to split into train and validation")
    return {"train": text[:cut], "val": text[cut:], "test": text[cut:]}


def train_tokenizer(level: str, texts: dict[str, str]):
    if level == "char":
        # nanoGPT's vocabulary: every character of the whole document (65 for Tiny Shakespeare).
        return CharTokenizer.train(texts["train"] + texts["val"])
    return WordTokenizer.train(texts["train"])


class StreamWindows(IterableDataset):
    """Contiguous windows for truncated BPTT: the stream is cut into `batch_size` rows, and window
    i of every row follows window i-1, so a carried hidden state stays valid across batches."""

    def __init__(self, ids: torch.Tensor, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1):
        if batch_size % world_size:
            raise ValueError(f"batch_size={batch_size} must be divisible by the {world_size} devices")
        n = (len(ids) - 1) // batch_size
        if n < 2:
            raise ValueError(f"{len(ids)} tokens are too few for {batch_size} rows")
        rows = ids[: n * batch_size + 1]
        self.inputs = rows[:-1].view(batch_size, n)  # (B, N)
        self.targets = rows[1:].view(batch_size, n)
        per_rank = batch_size // world_size
        self.inputs = self.inputs[rank * per_rank : (rank + 1) * per_rank]
        self.targets = self.targets[rank * per_rank : (rank + 1) * per_rank]
        self.seq_len = seq_len

    def __len__(self):
        return -(-self.inputs.shape[1] // self.seq_len)

    def __iter__(self):
        for start in range(0, self.inputs.shape[1], self.seq_len):
            yield self.inputs[:, start : start + self.seq_len], self.targets[:, start : start + self.seq_len]


class BlockWindows(Dataset):
    """Windows of `block_size + 1` tokens taken every `stride` tokens (inputs, shifted targets)."""

    def __init__(self, ids: torch.Tensor, block_size: int, stride: int):
        if len(ids) <= block_size:
            raise ValueError(f"{len(ids)} tokens are too few for windows of {block_size}")
        self.ids, self.block_size = ids, block_size
        self.starts = list(range(0, len(ids) - block_size - 1 + 1, stride))

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        chunk = self.ids[self.starts[i] : self.starts[i] + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class LMDataModule(L.LightningDataModule):
    """Language-modelling data: a character or word corpus as contiguous BPTT streams
    (`mode="stream"`, for recurrent models) or windows of `seq_len` tokens (`mode="windows"`,
    for the transformer; training windows overlap by half and are shuffled).

    Args:
        corpus: a name from `CORPORA` or a path to a text file.
        batch_size: rows per batch (split across devices in stream mode).
        seq_len: BPTT length (stream) or block size (windows).
        mode: "stream" or "windows".
        data_dir: folder holding the corpora (see module docstring).
        val_batch_size: rows per validation batch.
        tokenizer: a tokenizer to use instead of training one (fine-tuning keeps the model's).
        level: "char" or "word" for a user text file.
    """

    def __init__(self, corpus: str = "shakespeare_char", batch_size: int = 32, seq_len: int = 128,
                 mode: str = "stream", data_dir: str | None = None, val_batch_size: int = 16,
                 tokenizer=None, level: str | None = None, num_workers: int = 0):
        super().__init__()
        if mode not in ("stream", "windows"):
            raise ValueError(f"unknown mode {mode!r}; use 'stream' (recurrent models) or 'windows' (transformer)")
        _corpus(corpus)
        self.corpus, self.batch_size, self.seq_len, self.mode = corpus, batch_size, seq_len, mode
        self.data_dir, self.val_batch_size, self.num_workers = data_dir, val_batch_size, num_workers
        self.level = level or CORPORA.get(corpus, {}).get("level", "char")
        self.tokenizer = tokenizer
        self.splits: dict[str, torch.Tensor] = {}

    @property
    def tokenizers(self) -> dict:
        return {"tokenizer": self.tokenizer}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        texts = load_corpus(self.corpus, self.data_dir)
        if self.tokenizer is None:
            self.tokenizer = train_tokenizer(self.level, texts)
        self.splits = {split: torch.tensor(self.tokenizer.encode(text), dtype=torch.long) for split, text in texts.items()}

    def _rank(self):
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, split: str, batch_size: int, train: bool) -> DataLoader:
        ids = self.splits[split]
        if self.mode == "stream":
            rank, world = self._rank()
            return DataLoader(StreamWindows(ids, batch_size, self.seq_len, rank, world), batch_size=None)
        stride = self.seq_len // 2 if train else self.seq_len
        return DataLoader(BlockWindows(ids, self.seq_len, stride), batch_size=batch_size, shuffle=train,
                          num_workers=self.num_workers, drop_last=train)

    def train_dataloader(self):
        return self._loader("train", self.batch_size, train=True)

    def val_dataloader(self):
        return self._loader("val", self.val_batch_size, train=False)

    def test_dataloader(self):
        return self._loader("test", self.val_batch_size, train=False)


class PairDataset(Dataset):
    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        return self.pairs[i]


def collate_pairs(batch, pad_id: int = 0):
    """Pad `(src_ids, tgt_ids)` pairs: src `(B, S)`, src_lengths `(B,)`, tgt_in and tgt_out `(B, T)`."""
    src_lengths = torch.tensor([len(s) for s, _ in batch])
    src = torch.full((len(batch), int(src_lengths.max())), pad_id, dtype=torch.long)
    tgt_len = max(len(t) for _, t in batch) - 1
    tgt_in = torch.full((len(batch), tgt_len), pad_id, dtype=torch.long)
    tgt_out = torch.full((len(batch), tgt_len), pad_id, dtype=torch.long)
    for row, (s, t) in enumerate(batch):
        src[row, : len(s)] = torch.tensor(s)
        tgt_in[row, : len(t) - 1] = torch.tensor(t[:-1])
        tgt_out[row, : len(t) - 1] = torch.tensor(t[1:])
    return src, src_lengths, tgt_in, tgt_out


def read_pairs(corpus: str, data_dir=None) -> dict[str, tuple[list[str], list[str]]]:
    """`{split: (source_lines, target_lines)}` of a translation corpus, or of a user TSV file
    (`source<TAB>target` per line, last 10% held out for validation)."""
    if corpus not in CORPORA and Path(corpus).is_file():
        lines = [line.split("\t") for line in Path(corpus).read_text(encoding="utf-8").splitlines() if line.strip()]
        bad = [i + 1 for i, fields in enumerate(lines) if len(fields) != 2]
        if bad:
            raise ValueError(f"{corpus}: lines {bad[:5]} are not 'source<TAB>target'")
        cut = max(1, int(len(lines) * 0.9))
        parts = {"train": lines[:cut], "val": lines[cut:] or lines[-1:]}
        return {split: ([s for s, _ in rows], [t for _, t in rows]) for split, rows in parts.items()}
    texts = load_corpus(corpus, data_dir)
    source, target = CORPORA[corpus]["hub"]["source"], CORPORA[corpus]["hub"]["target"]
    return {
        split: (texts[f"{split}.{source}"].splitlines(), texts[f"{split}.{target}"].splitlines())
        for split in ("train", "val", "test")
    }


class TranslationDataModule(L.LightningDataModule):
    """Sentence pairs (Multi30k de->en by default), BPE-encoded, batches of similar length.

    Args:
        corpus: a pair corpus from `CORPORA`, or a TSV file of `source<TAB>target` lines.
        batch_size: sentence pairs per batch.
        src_vocab_size, tgt_vocab_size: BPE vocabulary sizes, trained on the training split.
        max_length: longest tokenized sentence kept for training (longer pairs are dropped).
        data_dir: folder holding the corpora.
        tokenizers: `{"source": tok, "target": tok}` to use instead of training new ones.
    """

    def __init__(self, corpus: str = "multi30k_de_en", batch_size: int = 64, src_vocab_size: int = 8000,
                 tgt_vocab_size: int = 6000, max_length: int = 64, data_dir: str | None = None,
                 tokenizers: dict | None = None, num_workers: int = 0):
        super().__init__()
        if corpus in CORPORA and CORPORA[corpus]["level"] != "pairs":
            raise ValueError(f"corpus {corpus!r} is not a translation corpus; use 'multi30k_de_en' or a TSV file")
        self.corpus, self.batch_size, self.max_length = corpus, batch_size, max_length
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.data_dir, self.num_workers = data_dir, num_workers
        self.tokenizers = dict(tokenizers) if tokenizers else {}
        self.datasets: dict[str, PairDataset] = {}
        self.texts: dict[str, tuple[list[str], list[str]]] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.texts = read_pairs(self.corpus, self.data_dir)
        if not self.tokenizers:
            src_train, tgt_train = self.texts["train"]
            self.tokenizers = {
                "source": BPETokenizer.train(src_train, self.src_vocab_size),
                "target": BPETokenizer.train(tgt_train, self.tgt_vocab_size),
            }
        source, target = self.tokenizers["source"], self.tokenizers["target"]
        for split, (src_lines, tgt_lines) in self.texts.items():
            pairs = [
                (source.encode(s) + [source.eos_id], [target.bos_id] + target.encode(t) + [target.eos_id])
                for s, t in zip(src_lines, tgt_lines)
            ]
            if split == "train":
                pairs = [(s, t) for s, t in pairs if len(s) <= self.max_length and len(t) <= self.max_length + 1]
            self.datasets[split] = PairDataset(pairs)

    def _loader(self, split: str, train: bool) -> DataLoader:
        return DataLoader(self.datasets[split], batch_size=self.batch_size, shuffle=train, collate_fn=collate_pairs,
                          num_workers=self.num_workers)

    def train_dataloader(self):
        return self._loader("train", True)

    def val_dataloader(self):
        return self._loader("val", False)

    def test_dataloader(self):
        return self._loader("test", False)
