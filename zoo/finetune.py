"""Fine-tune a pretrained model on your own text: `zoo finetune NAME --data my.txt`.

The model keeps its own tokenizer, so token ids mean what they meant in pre-training. Symbols the
vocabulary lacks are reported before training: a word or BPE model maps them to `<unk>`, a
character model (no `<unk>`) refuses the text, listing the characters and their counts. The last
10% of the text (by line) is held out; the validation loss on it is reported before and after.

In Python, `zoo.lightning_module(name)` gives a LightningModule holding the pretrained weights for
your own `Trainer.fit`; `FinetuneDataModule` feeds it a text file with the model's tokenizer (it is
also what a LightningCLI recipe names, see configs/finetune.example.yaml).
"""

import hashlib
import json
import math
import time
from collections import Counter
from pathlib import Path

import lightning as L
import torch

from zoo.data import LMDataModule, TranslationDataModule, read_pairs, split_document
from zoo.export import hardware
from zoo.hub import load, pretrained_tokenizers, read_config, resolve, save_pretrained, user_errors
from zoo.io import atomic_write_text
from zoo.lit import CausalLMModule, TranslationModule
from zoo.models import ARCHITECTURES
from zoo.registry import find_variant
from zoo.tokenizers import UnknownSymbolError

RECURRENT = ("rnn_lm", "gru_lm")


def _arch_of(config: dict) -> str:
    """The folder's architecture name, or the first registered one of its family (only the family is used)."""
    arch = config.get("architecture")
    if arch in ARCHITECTURES:
        return arch
    return next(name for name, (family, _) in ARCHITECTURES.items() if family == config["family"])


def lightning_module(name: str, revision: str | None = None, **hyper_parameters):
    """A `CausalLMModule` or `TranslationModule` starting from a pretrained model, for `Trainer.fit`.

    Args:
        name: registry name, Hub repo id or model folder.
        revision: Hub branch, tag or commit (default: the registry's pinned one).
        **hyper_parameters: the module's, e.g. `learning_rate=1e-3, warmup_steps=20`.

    Example:
        >>> lit = zoo.lightning_module("gru_lm_small.shakespeare_char", learning_rate=1e-3)
        >>> data = FinetuneDataModule("gru_lm_small.shakespeare_char", corpus="my.txt")
        >>> lightning.Trainer(max_steps=200).fit(lit, datamodule=data)
    """
    folder = resolve(name, revision)
    config = read_config(folder)
    module_class = TranslationModule if config["family"] == "seq2seq" else CausalLMModule
    # Hyper-parameters hold a plain name; a pinned revision is recorded as the resolved folder.
    return module_class(arch=_arch_of(config), init_from=str(folder) if revision else str(name), **hyper_parameters)


class FinetuneDataModule(LMDataModule):
    """`LMDataModule` over a text file, tokenized with a pretrained model's own tokenizer.

    Args:
        init_from: the pretrained model (name, repo id or folder), as in the model's `init_from`.
        corpus: path to the text file (last 10% by line held out for validation).
        mode: "stream" (RNN, GRU) or "windows" (transformer); chosen from the model when None.
        Others as in `LMDataModule`.
    """

    def __init__(self, init_from: str, corpus: str, batch_size: int = 16, seq_len: int = 128,
                 mode: str | None = None, val_batch_size: int = 8, num_workers: int = 0):
        folder = resolve(init_from)
        family = read_config(folder)["family"]
        if family == "seq2seq":
            raise ValueError(f"{init_from} is a translator; fine-tune it with 'zoo finetune' on a TSV file")
        mode = mode or ("stream" if family in RECURRENT else "windows")
        tokenizer = pretrained_tokenizers(folder)["tokenizer"]
        super().__init__(corpus=corpus, batch_size=batch_size, seq_len=seq_len, mode=mode,
                         val_batch_size=val_batch_size, tokenizer=tokenizer, num_workers=num_workers)


def _describe_counts(counts: Counter, limit: int = 15) -> str:
    shown = ", ".join(f"{symbol!r} x{count}" for symbol, count in counts.most_common(limit))
    return shown + (f" and {len(counts) - limit} more" if len(counts) > limit else "")


def vocabulary_report(tokenizer, text: str, what: str = "text") -> str:
    """How `text` fits the tokenizer's vocabulary: a one-line report, or UnknownSymbolError.

    Characters a char tokenizer lacks are refused (it has no `<unk>`); words a word tokenizer
    lacks become `<unk>` when it has one; BPE maps what it cannot segment to `<unk>`.
    """
    if tokenizer.kind == "bpe":
        ids = tokenizer.encode(text)
        unknown = sum(1 for i in ids if i == tokenizer.unk_id)
        return f"{what}: {len(ids)} tokens, {unknown} of them <unk>"
    unknown = tokenizer.unknown(text)
    unit = "characters" if tokenizer.kind == "char" else "words"
    if not unknown:
        return f"{what}: every one of its {unit} is in the model's vocabulary"
    if tokenizer.kind == "char" or getattr(tokenizer, "unk", None) is None:
        raise UnknownSymbolError(
            f"{what} has {sum(unknown.values())} {unit} outside the model's vocabulary, which has no <unk>: "
            f"{_describe_counts(unknown)}. Remove or replace them and run again"
        )
    total = len(tokenizer.words(text))
    return (f"{what}: {sum(unknown.values())} of {total} words ({len(unknown)} distinct) are outside the vocabulary "
            f"and become <unk>: {_describe_counts(unknown)}")


def _lm_shapes(n_train: int, n_val: int, stream: bool, batch_size: int, seq_len: int) -> dict:
    """Batch and window sizes that the text can fill: every split gives at least one batch."""
    if min(n_train, n_val) < 8:
        raise ValueError(f"the text is too short: {n_train} training and {n_val} validation tokens "
                         "(the last 10% of lines are held out); give at least a few hundred tokens")
    seq_len = max(2, min(seq_len, (n_val - 1) // 2, (n_train - 1) // 2))
    if stream:
        rows = lambda n, cap: max(1, min(cap, (n - 1) // (seq_len + 1)))  # noqa: E731
        return {"seq_len": seq_len, "batch_size": rows(n_train, batch_size), "val_batch_size": rows(n_val, 8)}
    windows = (n_train - seq_len - 1) // (seq_len // 2) + 1
    return {"seq_len": seq_len, "batch_size": max(1, min(batch_size, windows)), "val_batch_size": 8}


def _lm_data(pretrained, data: Path, batch_size: int, seq_len: int):
    tokenizer = pretrained.tokenizer
    text = data.read_text(encoding="utf-8")
    print(vocabulary_report(tokenizer, text, what=str(data)))
    splits = split_document(text, by_line=True)
    stream = pretrained.family in RECURRENT
    if not stream:
        seq_len = min(seq_len, pretrained.model.config.block_size)
    shapes = _lm_shapes(len(tokenizer.encode(splits["train"])), len(tokenizer.encode(splits["val"])), stream,
                        batch_size, seq_len)
    return LMDataModule(corpus=str(data), tokenizer=tokenizer, mode="stream" if stream else "windows", **shapes)


def _translation_data(pretrained, data: Path, batch_size: int):
    pairs = read_pairs(str(data))
    for role, index in (("source", 0), ("target", 1)):
        lines = "\n".join(pairs["train"][index] + pairs["val"][index])
        print(vocabulary_report(pretrained.tokenizers[role], lines, what=f"{data} ({role} side)"))
    return TranslationDataModule(corpus=str(data), batch_size=max(1, min(batch_size, len(pairs["train"][0]))),
                                 tokenizers=pretrained.tokenizers)


def _validation_loss(module, datamodule, accelerator: str) -> float:
    trainer = L.Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    return float(trainer.validate(module, datamodule=datamodule, verbose=False)[0]["val_loss"])


def _parent_record(name: str, pretrained) -> dict:
    variant = find_variant(name) or find_variant(pretrained.folder.name)
    training = pretrained.config.get("training") or {}
    return {
        "name": variant.name if variant else str(name),
        "repo_id": variant.hub_repo if variant else (str(name) if "/" in str(name) and not Path(name).exists() else None),
        "revision": variant.revision if variant else None,
        "corpus": variant.corpus if variant else pretrained.config.get("corpus") or (training.get("parent") or {}).get("corpus"),
    }


def _train(module, datamodule, max_steps: int, accelerator: str, precision: str) -> int:
    trainer = L.Trainer(max_steps=max_steps, accelerator=accelerator, devices=1, precision=precision, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                        limit_val_batches=0, num_sanity_val_steps=0, gradient_clip_val=1.0)
    trainer.fit(module, datamodule=datamodule)
    return trainer.global_step


def _save(module, out: Path, pretrained, parent: dict, record: dict, before: float, after: float) -> None:
    from zoo.cards import write_card

    dtype = getattr(torch, pretrained.config.get("dtype", "float32"), torch.float32)
    save_pretrained(out, module.model, module.tokenizers, architecture=module.hparams.arch, dtype=dtype,
                    metadata={"training": {**record, "parent": parent}})
    metrics = {"val_loss_before": round(before, 6), "val_loss": round(after, 6), "val_ppl": round(math.exp(after), 4)}
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    write_card(out, out.name)


def finetune(name: str, data, max_steps: int = 200, out=None, batch_size: int = 16, seq_len: int = 128,
             learning_rate: float | None = None, warmup_steps: int | None = None, revision: str | None = None,
             seed: int = 0, accelerator: str = "auto", precision: str = "32-true") -> dict:
    """Fine-tune a pretrained model on a text file (LMs) or a TSV of `source<TAB>target` (translators).

    Returns:
        `{"folder", "val_loss_before", "val_loss_after", "steps", "wall_seconds"}`; the folder holds
        the new weights, its tokenizer (the parent's), metrics.json and a model card naming the parent.
    """
    data = Path(data)
    if not data.is_file():
        raise FileNotFoundError(f"no data file {str(data)!r}; pass a UTF-8 text file (or a TSV for a translator)")
    pretrained = load(name, revision)
    translation = pretrained.family == "seq2seq"
    out = Path(out) if out else Path("finetuned") / f"{pretrained.folder.name if Path(name).is_dir() else name}.{data.stem}"
    L.seed_everything(seed, verbose=False)
    datamodule = (_translation_data(pretrained, data, batch_size) if translation
                  else _lm_data(pretrained, data, batch_size, seq_len))
    hyper = {"learning_rate": learning_rate or (5e-4 if translation else 1e-3),
             "warmup_steps": min(100, max_steps // 10) if warmup_steps is None else warmup_steps}
    module = lightning_module(str(pretrained.folder) if revision else name, **hyper)
    start = time.time()
    before = _validation_loss(module, datamodule, accelerator)
    steps = _train(module, datamodule, max_steps, accelerator, precision)
    after = _validation_loss(module, datamodule, accelerator)
    wall = time.time() - start
    record = {
        "global_step": steps,
        "hyper_parameters": {k: v for k, v in dict(module.hparams).items() if not k.startswith("_")},
        "command": f"zoo finetune {name} --data {data.name} --max_steps {max_steps}",
        "wall_seconds": int(round(wall)),
        "hardware": hardware(),
        "torch": torch.__version__,
        "data": data.name,
        "data_sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
    }
    _save(module, out, pretrained, _parent_record(name, pretrained), record, before, after)
    return {"folder": out, "val_loss_before": before, "val_loss_after": after, "steps": steps, "wall_seconds": wall}


def finetune_command(name: str, data: str | None = None, max_steps: int = 200, out: str | None = None, batch_size: int = 16,
                     seq_len: int = 128, learning_rate: float | None = None, revision: str | None = None,
                     seed: int = 0, accelerator: str = "auto") -> None:
    """Fine-tune a pretrained model on your text; writes a new model folder with its own card.

    Language models take a UTF-8 text file, tokenized with the model's own tokenizer: a word
    model maps unknown words to <unk>; a character model refuses characters it does not know,
    listing them. Translators take a TSV file of `source<TAB>target` lines. The last 10% (by line)
    is held out and the validation loss on it is printed before and after.

    Args:
        name: the pretrained model: registry name (see `zoo list`), Hub repo id or folder.
        data: the text (or TSV) file (required).
        max_steps: optimizer steps.
        out: the folder to write (default: finetuned/NAME.DATA_STEM).
        batch_size: rows per batch (reduced when the text is short).
        seq_len: tokens per row (BPTT length or window; capped by the model's context).
        learning_rate: peak AdamW learning rate (default 1e-3, 5e-4 for translators).
        revision: Hub branch, tag or commit of the pretrained model.
        seed: random seed.
        accelerator: "auto", "cpu" or "gpu".
    """
    import logging
    import warnings

    if not data:
        raise SystemExit("zoo finetune: --data is required: a UTF-8 text file (a TSV of source<TAB>target "
                         "lines for a translator)")
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)  # no banners
    with user_errors("finetune"):
        result = finetune(name, data, max_steps=max_steps, out=out, batch_size=batch_size, seq_len=seq_len,
                          learning_rate=learning_rate, revision=revision, seed=seed, accelerator=accelerator)
    print(f"validation loss on the held-out 10% of {data}: {result['val_loss_before']:.4f} before, "
          f"{result['val_loss_after']:.4f} after {result['steps']} steps ({result['wall_seconds']:.0f} s)")
    print(f"wrote {result['folder']} (load it with zoo.load({str(result['folder'])!r}))")
