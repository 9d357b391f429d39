"""Tokenizers saved beside the weights: characters, words, and BPE (Hugging Face `tokenizers`).

Every tokenizer has `encode(text) -> list[int]`, `decode(ids) -> str`, `vocab_size`,
`to_dict()` / `from_dict()` (plain JSON values) and `save(folder)`; `load_tokenizer(folder)`
reads back whichever kind was saved.
"""

import json
from collections import Counter
from pathlib import Path

from zoo.io import atomic_write_text

TOKENIZER_FILE = "tokenizer.json"


class UnknownSymbolError(ValueError):
    """Text holds symbols the vocabulary does not have."""


def _describe(symbols) -> str:
    shown = sorted(symbols)[:10]
    more = f" and {len(symbols) - 10} more" if len(symbols) > 10 else ""
    return ", ".join(repr(s) for s in shown) + more


class CharTokenizer:
    """One id per character. Characters outside the vocabulary are refused (there is no `<unk>`)."""

    kind = "char"

    def __init__(self, chars):
        self.tokens = list(chars)
        self.index = {c: i for i, c in enumerate(self.tokens)}
        self.eos_id = None

    @classmethod
    def train(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def unknown(self, text: str) -> Counter:
        """Counts of the characters in `text` that the vocabulary lacks."""
        return Counter(c for c in text if c not in self.index)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[c] for c in text]
        except KeyError:
            missing = self.unknown(text)
            raise UnknownSymbolError(
                f"characters outside this model's vocabulary: {_describe(missing)}; the model knows "
                f"{self.vocab_size} characters ({''.join(self.tokens)!r}); remove or replace them"
            ) from None

    def decode(self, ids) -> str:
        return "".join(self.tokens[i] for i in ids)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "tokens": self.tokens}


class WordTokenizer:
    """Whitespace-separated words, one `<eos>` per line; unknown words become `<unk>` when the
    vocabulary has it (PTB and WikiText-2 do), and are refused otherwise."""

    kind = "word"

    def __init__(self, tokens, unk: str | None = "<unk>", eos: str = "<eos>"):
        self.tokens = list(tokens)
        self.index = {w: i for i, w in enumerate(self.tokens)}
        self.unk = unk if unk in self.index else None
        self.eos = eos
        self.eos_id = self.index.get(eos)

    @classmethod
    def train(cls, text: str, eos: str = "<eos>") -> "WordTokenizer":
        counts = Counter(text.split())
        # Most frequent first, ties broken alphabetically, so the vocabulary is reproducible.
        words = sorted(counts, key=lambda w: (-counts[w], w))
        return cls([eos] + [w for w in words if w != eos])

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def words(self, text: str) -> list[str]:
        """Split into words, with `<eos>` at every line end."""
        words = []
        for line in text.splitlines(keepends=True):
            words.extend(line.split())
            if line.endswith("\n"):
                words.append(self.eos)
        return words

    def unknown(self, text: str) -> Counter:
        return Counter(w for w in self.words(text) if w not in self.index)

    def encode(self, text: str) -> list[int]:
        words = self.words(text)
        if self.unk is not None:
            unk_id = self.index[self.unk]
            return [self.index.get(w, unk_id) for w in words]
        missing = Counter(w for w in words if w not in self.index)
        if missing:
            raise UnknownSymbolError(
                f"words outside this model's vocabulary: {_describe(missing)}; it has no <unk>, so "
                f"replace them with known words"
            )
        return [self.index[w] for w in words]

    def decode(self, ids) -> str:
        out = []
        for i in ids:
            word = self.tokens[i]
            out.append("\n" if word == self.eos else word + " ")
        return "".join(out).replace(" \n", "\n")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "tokens": self.tokens, "unk": self.unk, "eos": self.eos}


class BPETokenizer:
    """Byte-pair encoding trained with Hugging Face `tokenizers`, with `<pad>`=0, `<bos>`, `<eos>`, `<unk>`."""

    kind = "bpe"
    specials = ["<pad>", "<unk>", "<bos>", "<eos>"]

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (tokenizer.token_to_id(t) for t in self.specials)

    @classmethod
    def train(cls, lines, vocab_size: int = 8000) -> "BPETokenizer":
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=cls.specials, show_progress=False)
        tokenizer.train_from_iterator(lines, trainer=trainer)
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "tokenizer": json.loads(self.tokenizer.to_str())}


KINDS = {"char": CharTokenizer, "word": WordTokenizer, "bpe": BPETokenizer}


def tokenizer_from_dict(data: dict):
    """Rebuild a tokenizer from `to_dict()` output."""
    kind = data.get("kind")
    if kind == "char":
        return CharTokenizer(data["tokens"])
    if kind == "word":
        return WordTokenizer(data["tokens"], unk=data.get("unk"), eos=data.get("eos", "<eos>"))
    if kind == "bpe":
        from tokenizers import Tokenizer

        return BPETokenizer(Tokenizer.from_str(json.dumps(data["tokenizer"])))
    raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {sorted(KINDS)}")


def save_tokenizers(folder, tokenizers: dict) -> None:
    """Write `{"tokenizer": tok}` (LMs) or `{"source": tok, "target": tok}` (translation) to `tokenizer.json`."""
    payload = {role: tok.to_dict() for role, tok in tokenizers.items()}
    atomic_write_text(Path(folder) / TOKENIZER_FILE, json.dumps(payload, ensure_ascii=False))


def load_tokenizers(folder) -> dict:
    """Read the tokenizers saved by `save_tokenizers`, with a clear error when missing or damaged."""
    path = Path(folder) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer in {folder}: {TOKENIZER_FILE} is missing; re-download or re-export the model")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        return {role: tokenizer_from_dict(data) for role, data in payload.items()}
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a valid zoo tokenizer file ({error}); re-download the model") from None
