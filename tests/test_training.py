"""Training: every family overfits a batch, checkpoints reload, DDP matches one process, resume ends
where an uninterrupted run ends."""

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from conftest import PYTHON, TESTS, subprocess_env
from safetensors.torch import load_file
from torch.nn import functional as F
from torch.utils.data import DataLoader

from zoo.cli import main as zoo_main
from zoo.data import LMDataModule, TranslationDataModule, collate_pairs
from zoo.lit import CausalLMModule, TranslationModule
from zoo.models import ARCHITECTURES, task_of

TINY_ARCHS = sorted(name for name in ARCHITECTURES if name.endswith("_tiny"))


class LossHistory(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(trainer.callback_metrics["train_loss"]))


def quiet_trainer(**kwargs) -> L.Trainer:
    defaults = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
    return L.Trainer(**{**defaults, **kwargs})


def tiny_setup(name: str, data_dir: Path, **module_kwargs):
    """A DataModule on the fixture corpora and a fresh module for architecture `name`."""
    family = ARCHITECTURES[name][0]
    if task_of(family) == "translation":
        datamodule = TranslationDataModule(data_dir=str(data_dir), batch_size=4, src_vocab_size=60, tgt_vocab_size=60)
        return datamodule, TranslationModule(arch=name, label_smoothing=0.0, **module_kwargs)
    mode = "windows" if family == "transformer" else "stream"
    datamodule = LMDataModule(corpus="shakespeare_char", data_dir=str(data_dir), batch_size=4, seq_len=32, mode=mode)
    return datamodule, CausalLMModule(arch=name, **module_kwargs)


@pytest.mark.parametrize("name", TINY_ARCHS)
def test_every_family_overfits_one_batch(name, tiny_data_dir):
    L.seed_everything(0, verbose=False)
    datamodule, module = tiny_setup(name, tiny_data_dir, learning_rate=0.02, warmup_steps=0, weight_decay=0.0)
    history = LossHistory()
    quiet_trainer(max_steps=60, overfit_batches=1, limit_val_batches=0, callbacks=[history]).fit(module, datamodule)
    first, last = history.losses[0], history.losses[-1]
    assert len(history.losses) == 60
    assert last < 0.1 * first, f"{name}: loss went from {first:.3f} to {last:.3f} in 60 steps on one batch"


@pytest.mark.parametrize("name", ["gru_lm_tiny", "transformer_tiny", "bahdanau_tiny"])
def test_load_from_checkpoint_with_weights_only(name, tiny_data_dir, tmp_path):
    datamodule, module = tiny_setup(name, tiny_data_dir)
    trainer = quiet_trainer(max_steps=2, limit_val_batches=1)
    trainer.fit(module, datamodule)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    assert "vocab_size" in json.dumps(torch.load(path, weights_only=True)["hyper_parameters"])
    loaded = type(module).load_from_checkpoint(path, map_location="cpu", weights_only=True)
    assert type(loaded.model) is type(module.model)
    assert loaded.hparams.arch == name
    assert {role: t.to_dict() for role, t in loaded.tokenizers.items()} == {
        role: t.to_dict() for role, t in datamodule.tokenizers.items()
    }
    for (key, expected), actual in zip(module.model.state_dict().items(), loaded.model.state_dict().values()):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=key)


def test_ddp_on_two_cpu_processes_matches_one_process(tiny_data_dir, tmp_path):
    """B stream rows on 2 ranks (B/2 each, gradients averaged) train like B rows on one process."""
    corpus = tiny_data_dir / "tinyshakespeare" / "input.txt"
    runs = {devices: tmp_path / f"devices{devices}" for devices in (1, 2)}
    # Both runs at once: most of each is interpreter start-up.
    processes = {
        devices: subprocess.Popen([PYTHON, str(TESTS / "ddp_train.py"), str(corpus), str(out), str(devices)],
                                  cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for devices, out in runs.items()
    }
    for devices, process in processes.items():
        output, _ = process.communicate(timeout=180)
        assert process.returncode == 0, f"{devices} device(s) failed:\n{output.decode()[-3000:]}"
    single = json.loads((runs[1] / "rank0.json").read_text())
    ranks = [json.loads((runs[2] / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world_size"], r["global_step"]) for r in ranks] == [(0, 2, 6), (1, 2, 6)]
    assert single["global_step"] == 6
    # Stream mode hands each rank its own half of the rows.
    assert ranks[0]["first_inputs"] + ranks[1]["first_inputs"] == single["first_inputs"]
    expected = load_file(runs[1] / "weights_rank0.safetensors")
    initial = load_file(runs[1] / "initial_rank0.safetensors")
    for rank in range(2):
        weights = load_file(runs[2] / f"weights_rank{rank}.safetensors")
        gap = max((weights[k] - expected[k]).abs().max().item() for k in expected)
        assert gap < 1e-4, f"rank {rank}: DDP weights differ from one-process weights by {gap:.2e}"
    moved = max((expected[k] - initial[k]).abs().max().item() for k in expected)
    assert moved > 1e-2, "training must move the weights well beyond the tolerance"


RESUME_STEPS, EVERY = 16, 2


def write_resume_config(folder: Path, data_dir: Path, seconds_per_step: float = 0.0) -> Path:
    """A tiny GRU recipe writing under `folder/run`: checkpoints every 2 steps plus last.ckpt,
    validation at the end, steps slowed down by `seconds_per_step`."""
    root = str(folder / "run")
    config = {
        "seed_everything": 7,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "precision": "32-true", "max_steps": RESUME_STEPS,
            "val_check_interval": RESUME_STEPS, "check_val_every_n_epoch": None, "limit_val_batches": 4,
            "log_every_n_steps": 1, "default_root_dir": root, "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": root, "name": "logs"}},
            "callbacks": [
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": f"{root}/checkpoints", "filename": "{step}", "every_n_train_steps": EVERY,
                               "save_top_k": 1, "monitor": "step", "mode": "max", "save_last": True}},
                {"class_path": "slow_steps.SlowSteps", "init_args": {"seconds": seconds_per_step}},
            ],
        },
        "model": {"class_path": "zoo.lit.CausalLMModule",
                  "init_args": {"arch": "gru_lm_tiny", "learning_rate": 0.01, "warmup_steps": 2}},
        "data": {"class_path": "zoo.data.LMDataModule",
                 "init_args": {"corpus": "shakespeare_char", "data_dir": str(data_dir), "batch_size": 4, "seq_len": 16}},
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def latest_log(run: Path) -> list[dict]:
    """Rows of the CSV log of the latest run under `run` (a resumed run logs to a new version)."""
    latest = max((run / "logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    header, *rows = [line.split(",") for line in (latest / "metrics.csv").read_text().splitlines()]
    return [dict(zip(header, row)) for row in rows]


def logged(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(int(row["step"]), float(row[key])) for row in rows if row.get(key)]


def wait_for_checkpoint(folder: Path, min_step: int, process: subprocess.Popen, timeout: float = 120) -> int:
    """Wait until a checkpoint of step >= `min_step` and last.ckpt exist; return that step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"training ended before step {min_step}:\n{process.stdout.read().decode()[-3000:]}"
        steps = [int(p.stem.split("=")[1]) for p in folder.glob("step=*.ckpt")] if folder.is_dir() else []
        if (folder / "last.ckpt").is_file() and steps and max(steps) >= min_step:
            return max(steps)
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint of step >= {min_step} in {folder} after {timeout} s")


def test_killed_run_resumes_from_last_checkpoint_to_the_same_end(tiny_data_dir, tmp_path, monkeypatch):
    killed, fresh = tmp_path / "killed", tmp_path / "fresh"
    killed.mkdir(), fresh.mkdir()
    config = write_resume_config(killed, tiny_data_dir, seconds_per_step=0.25)
    checkpoints = killed / "run" / "checkpoints"
    command = [PYTHON, "-m", "zoo.cli", "fit", "--config", str(config)]
    process = subprocess.Popen(command, cwd=killed, env=subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    try:
        step = wait_for_checkpoint(checkpoints, 6, process)
        time.sleep(0.1)  # last.ckpt is written right after the step checkpoint; steps take 0.25 s
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()
    assert process.returncode == -signal.SIGKILL
    interrupted_at = torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"]
    assert step <= interrupted_at < RESUME_STEPS, "the kill must land partway through training"

    resumed = subprocess.run([*command, "--ckpt_path", "last", "--weights_only", "true"], cwd=killed,
                             env=subprocess_env(), capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"Restoring states from the checkpoint path at {checkpoints / 'last.ckpt'}" in resumed.stderr
    resumed_end = torch.load(checkpoints / "last.ckpt", weights_only=True)

    # The same recipe, uninterrupted, in this process (saves an interpreter start-up).
    monkeypatch.chdir(fresh)
    monkeypatch.setattr(sys, "argv", ["zoo"])
    zoo_main(["fit", "--config", str(write_resume_config(fresh, tiny_data_dir))])
    fresh_end = torch.load(fresh / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed_end["global_step"] == fresh_end["global_step"] == RESUME_STEPS
    resumed_log, fresh_log = latest_log(killed / "run"), latest_log(fresh / "run")
    # The resumed run trains only the steps the killed one had not done.
    assert [step for step, _ in logged(resumed_log, "train_loss")] == list(range(interrupted_at, RESUME_STEPS))
    assert [step for step, _ in logged(fresh_log, "train_loss")] == list(range(RESUME_STEPS))
    resumed_loss, fresh_loss = logged(resumed_log, "val_loss")[-1][1], logged(fresh_log, "val_loss")[-1][1]
    assert fresh_loss < 0.95 * math.log(fresh_end["hyper_parameters"]["vocab_size"]), "training must have learnt"
    print(f"final val_loss: resumed {resumed_loss:.4f}, uninterrupted {fresh_loss:.4f}; killed at step {interrupted_at}")
    assert abs(resumed_loss - fresh_loss) < 0.05 * fresh_loss, (resumed_loss, fresh_loss)


@pytest.mark.parametrize("name", ["gru_lm_tiny", "transformer_tiny"])
def test_validation_loss_is_token_mean_next_token_cross_entropy(name):
    """`val_loss` averages the cross-entropy of every target token over all batches, carrying the
    recurrent state from one batch to the next."""
    module = CausalLMModule(arch=name, vocab_size=11)
    batches = [(torch.randint(0, 11, (2, t)), torch.randint(0, 11, (2, t))) for t in (5, 3, 7)]  # 30 tokens
    (result,) = quiet_trainer().validate(module, dataloaders=DataLoader(batches, batch_size=None), verbose=False)
    model, state, total = module.model.eval(), None, 0.0
    with torch.no_grad():
        for inputs, targets in batches:
            logits, state = model(inputs, state if module.recurrent else None)
            total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
    assert result["val_loss"] == pytest.approx(total / 30, rel=1e-5)
    assert result["val_ppl"] == pytest.approx(math.exp(total / 30), rel=1e-5)


def test_translation_validation_loss_ignores_padding():
    module = TranslationModule(arch="bahdanau_tiny", src_vocab_size=13, tgt_vocab_size=17)
    pairs = [([5, 6, 7], [2, 8, 9, 3]), ([9], [2, 4, 3]), ([4, 4], [2, 3])]
    batch = collate_pairs(pairs)
    src, src_lengths, tgt_in, tgt_out = batch
    wider = (torch.cat([src, torch.zeros(3, 2, dtype=torch.long)], 1), src_lengths,
             torch.cat([tgt_in, torch.zeros(3, 2, dtype=torch.long)], 1), torch.cat([tgt_out, torch.zeros(3, 2, dtype=torch.long)], 1))
    trainer = quiet_trainer()
    (narrow_result,) = trainer.validate(module, dataloaders=DataLoader([batch], batch_size=None), verbose=False)
    (wide_result,) = trainer.validate(module, dataloaders=DataLoader([wider], batch_size=None), verbose=False)
    with torch.no_grad():
        logits = module.model.eval()(src, src_lengths, tgt_in)
    real = tgt_out != 0
    expected = F.cross_entropy(logits[real], tgt_out[real]).item()  # no label smoothing in validation
    assert narrow_result["val_loss"] == pytest.approx(expected, rel=1e-5)
    assert wide_result["val_loss"] == pytest.approx(expected, rel=1e-5)
