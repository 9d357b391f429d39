"""Train a tiny GRU LM for a few steps on one process, or on several with DDP, and record the result.

    python tests/ddp_train.py CORPUS OUT_DIR DEVICES

Lightning's DDP launcher re-executes this script once per extra rank. Every rank writes
`rank{r}.json` (what it saw) and `initial_rank{r}.safetensors` and
`weights_rank{r}.safetensors` (its first and final weights) under OUT_DIR.
Stream mode splits the batch rows across ranks, so B rows on 2 ranks should train exactly like
B rows on one process: fp32, no dropout, fixed seed.
"""

import json
import sys
from pathlib import Path

import lightning as L
from safetensors.torch import save

from zoo.data import LMDataModule
from zoo.io import atomic_write_bytes, atomic_write_text
from zoo.lit import CausalLMModule

BATCH_SIZE, SEQ_LEN, STEPS = 4, 16, 6


class RecordBatches(L.Callback):
    """Keeps the first training batch's input rows, to show how rows were split across ranks."""

    def __init__(self):
        self.first_inputs = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first_inputs is None:
            self.first_inputs = batch[0].tolist()


def train(corpus: str, out_dir: str, devices: int) -> None:
    datamodule = LMDataModule(corpus=corpus, level="char", batch_size=BATCH_SIZE, seq_len=SEQ_LEN, mode="stream")
    datamodule.setup("fit")
    L.seed_everything(1234, verbose=False)
    module = CausalLMModule(arch="gru_lm_tiny", vocab_size=datamodule.tokenizer.vocab_size, overrides={"dropout": 0.0},
                            learning_rate=1e-2, warmup_steps=0)
    initial = {name: tensor.detach().clone() for name, tensor in module.model.state_dict().items()}
    recorder = RecordBatches()
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", precision="32-true",
        max_steps=STEPS, gradient_clip_val=1.0, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True, callbacks=[recorder],
    )
    trainer.fit(module, datamodule=datamodule)
    out, rank = Path(out_dir), trainer.global_rank
    state = {name: tensor.detach().contiguous() for name, tensor in module.model.state_dict().items()}
    atomic_write_bytes(out / f"weights_rank{rank}.safetensors", save(state))
    atomic_write_bytes(out / f"initial_rank{rank}.safetensors", save(initial))
    record = {"rank": rank, "world_size": trainer.world_size, "global_step": trainer.global_step,
              "first_inputs": recorder.first_inputs, "train_loss": float(trainer.callback_metrics["train_loss"])}
    atomic_write_text(out / f"rank{rank}.json", json.dumps(record))


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2], int(sys.argv[3]))
