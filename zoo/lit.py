"""Lightning modules: each holds a plain zoo model; the loss lives here and nowhere else.

Hyper-parameters saved in checkpoints are plain values (an architecture name, an overrides dict,
numbers), so `load_from_checkpoint(..., weights_only=True)` works. The vocabulary size is taken
from the DataModule's tokenizer in `setup` and recorded in the hyper-parameters; the tokenizer
itself travels in the checkpoint as plain JSON values.
"""

import math

import lightning as L
import torch
from torch.nn import functional as F
from torchmetrics import MeanMetric

from zoo.models import architecture, build_model
from zoo.tokenizers import tokenizer_from_dict


class _ZooModule(L.LightningModule):
    """Shared parts: model construction, optimizer and schedule, tokenizers in checkpoints."""

    def __init__(self, arch: str):
        super().__init__()
        self.family = architecture(arch)[0]
        self.model = None
        self.tokenizers: dict = {}
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def _vocab_overrides(self) -> dict:
        raise NotImplementedError

    def _vocab_from_tokenizers(self) -> dict:
        raise NotImplementedError

    def _build(self) -> None:
        # TODO: a fine-tuned checkpoint rebuilds its model by loading the parent (`init_from`) again in
        # `load_from_checkpoint`; record the parent's config in the hyper-parameters to rebuild it offline.
        if self.model is None and self.hparams.init_from:
            from zoo.hub import load

            pretrained = load(self.hparams.init_from)
            self.model, self.tokenizers = pretrained.model.train(), pretrained.tokenizers
            self.hparams.update(self._vocab_from_tokenizers())
            return
        if self.model is None and self._vocab_overrides():
            self.model = build_model(self.hparams.arch, **{**(self.hparams.overrides or {}), **self._vocab_overrides()})

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        theirs = {role: tok for role, tok in getattr(datamodule, "tokenizers", {}).items() if tok is not None}
        if not self.tokenizers and theirs and not self.hparams.init_from:
            self._adopt_tokenizers(theirs)
        self._build()
        if self.model is None:
            raise RuntimeError(
                f"{type(self).__name__}({self.hparams.arch!r}) has no vocabulary size: pass it, or train with a "
                "DataModule that provides a tokenizer"
            )
        if datamodule is not None and self.tokenizers:
            self._check_datamodule(datamodule)

    def _adopt_tokenizers(self, tokenizers: dict) -> None:
        """Take the data's tokenizers (they travel in checkpoints) and their vocabulary sizes."""
        self.tokenizers = dict(tokenizers)
        vocab = self._vocab_from_tokenizers()
        clash = {key: size for key, size in vocab.items() if self.hparams[key] not in (None, size)}
        if clash:
            self.tokenizers = {}
            given = ", ".join(f"{key}={self.hparams[key]}" for key in clash)
            data = ", ".join(f"{key}={size}" for key, size in clash.items())
            raise ValueError(f"{given} does not match the DataModule's tokenizer ({data}); leave it unset to take "
                             "the vocabulary from the data")
        self.hparams.update(vocab)

    def _check_datamodule(self, datamodule) -> None:
        mine = {role: tok.to_dict() for role, tok in self.tokenizers.items()}
        theirs = {role: tok.to_dict() for role, tok in datamodule.tokenizers.items() if tok is not None}
        if theirs and theirs != mine:
            raise ValueError(
                "the DataModule's tokenizer differs from the model's; pass the model's tokenizer to the DataModule "
                "(zoo finetune does this) so token ids mean the same thing"
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["zoo_tokenizers"] = {role: tok.to_dict() for role, tok in self.tokenizers.items()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokenizers = {role: tokenizer_from_dict(d) for role, d in checkpoint.get("zoo_tokenizers", {}).items()}
        self._build()

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.learning_rate,
            betas=tuple(self.hparams.betas),
        )
        total = self.trainer.max_steps if self.trainer.max_steps > 0 else int(self.trainer.estimated_stepping_batches)
        warmup, floor = self.hparams.warmup_steps, self.hparams.min_lr_ratio

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _log_epoch_metrics(self, stage: str, metric: MeanMetric) -> None:
        loss = metric.compute()
        self.log(f"{stage}_loss", loss, prog_bar=True, sync_dist=True)
        self.log(f"{stage}_ppl", torch.exp(loss), sync_dist=True)
        self.log(f"{stage}_bpt", loss / math.log(2), sync_dist=True)
        metric.reset()


class CausalLMModule(_ZooModule):
    """Next-token training for the RNN, GRU and transformer LMs.

    Recurrent models train with truncated BPTT: the DataModule's stream mode hands over contiguous
    windows, and the hidden state is carried, detached, from one batch to the next (reset at each
    epoch). The transformer trains on independent windows.

    Args:
        arch: architecture name (`zoo.models.ARCHITECTURES`).
        vocab_size: vocabulary size; taken from the DataModule's tokenizer when None.
        overrides: config fields that differ from the architecture's defaults.
        learning_rate, weight_decay, betas: AdamW (decay only on tensors with 2+ dims).
        warmup_steps, min_lr_ratio: linear warm-up, then cosine decay to `min_lr_ratio * learning_rate`.
        init_from: a pretrained model (name, folder or repo id) to start from: fine-tuning.
    """

    def __init__(self, arch: str = "gru_lm_small", vocab_size: int | None = None, overrides: dict | None = None,
                 learning_rate: float = 3e-3, weight_decay: float = 0.1, warmup_steps: int = 100,
                 min_lr_ratio: float = 0.1, betas: tuple[float, float] = (0.9, 0.99), init_from: str | None = None):
        super().__init__(arch)
        self.save_hyperparameters()
        self.recurrent = self.family in ("rnn_lm", "gru_lm")
        self._states: dict = {}
        self._build()

    def _vocab_overrides(self) -> dict:
        return {"vocab_size": self.hparams.vocab_size} if self.hparams.vocab_size else {}

    def _vocab_from_tokenizers(self) -> dict:
        return {"vocab_size": self.tokenizers["tokenizer"].vocab_size}

    @property
    def tokenizer(self):
        return self.tokenizers.get("tokenizer")

    def forward(self, tokens, state=None):
        return self.model(tokens, state)

    def _shared_step(self, batch, stage: str):
        inputs, targets = batch
        state = self._states.get(stage) if self.recurrent else None
        if state is not None and state.shape[1] != inputs.shape[0]:
            state = None  # a last, narrower batch starts afresh
        logits, state = self.model(inputs, state)
        if self.recurrent:
            self._states[stage] = state.detach()
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return loss, targets.numel()

    def training_step(self, batch, batch_idx):
        loss, _ = self._shared_step(batch, "train")
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, count = self._shared_step(batch, "val")
        self.val_loss.update(loss, weight=count)

    def test_step(self, batch, batch_idx):
        loss, count = self._shared_step(batch, "test")
        self.test_loss.update(loss, weight=count)

    def on_train_epoch_start(self):
        self._states.pop("train", None)

    def on_validation_epoch_start(self):
        self._states.pop("val", None)

    def on_test_epoch_start(self):
        self._states.pop("test", None)

    def on_validation_epoch_end(self):
        self._log_epoch_metrics("val", self.val_loss)

    def on_test_epoch_end(self):
        self._log_epoch_metrics("test", self.test_loss)


class TranslationModule(_ZooModule):
    """Teacher-forced training of the seq2seq translator (cross-entropy over real target tokens).

    Args:
        arch: architecture name, e.g. "bahdanau_small" or "seq2seq_noattn_small".
        src_vocab_size, tgt_vocab_size: taken from the DataModule's tokenizers when None.
        label_smoothing: applied to the training loss only; validation reports plain cross-entropy.
        Others as in `CausalLMModule`.
    """

    def __init__(self, arch: str = "bahdanau_small", src_vocab_size: int | None = None,
                 tgt_vocab_size: int | None = None, overrides: dict | None = None, learning_rate: float = 1e-3,
                 weight_decay: float = 0.01, warmup_steps: int = 100, min_lr_ratio: float = 0.1,
                 betas: tuple[float, float] = (0.9, 0.98), label_smoothing: float = 0.1, init_from: str | None = None):
        super().__init__(arch)
        self.save_hyperparameters()
        self._build()

    def _vocab_overrides(self) -> dict:
        if self.hparams.src_vocab_size and self.hparams.tgt_vocab_size:
            return {"src_vocab_size": self.hparams.src_vocab_size, "tgt_vocab_size": self.hparams.tgt_vocab_size}
        return {}

    def _vocab_from_tokenizers(self) -> dict:
        return {
            "src_vocab_size": self.tokenizers["source"].vocab_size,
            "tgt_vocab_size": self.tokenizers["target"].vocab_size,
        }

    def forward(self, src, src_lengths, tgt_in):
        return self.model(src, src_lengths, tgt_in)

    def _shared_step(self, batch, smoothing: float = 0.0):
        src, src_lengths, tgt_in, tgt_out = batch
        logits = self.model(src, src_lengths, tgt_in)  # (B, T, tgt_vocab_size)
        pad_id = self.model.config.pad_id
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=pad_id,
                               label_smoothing=smoothing)
        return loss, int((tgt_out != pad_id).sum())

    def training_step(self, batch, batch_idx):
        loss, _ = self._shared_step(batch, self.hparams.label_smoothing)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, count = self._shared_step(batch)
        self.val_loss.update(loss, weight=count)

    def test_step(self, batch, batch_idx):
        loss, count = self._shared_step(batch)
        self.test_loss.update(loss, weight=count)

    def on_validation_epoch_end(self):
        self._log_epoch_metrics("val", self.val_loss)

    def on_test_epoch_end(self):
        self._log_epoch_metrics("test", self.test_loss)
