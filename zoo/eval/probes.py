"""Long-range probes: small synthetic tasks, trained from scratch in seconds, that ask a model to
carry one piece of information across k tokens.

- copy: `s_1 .. s_m`, then k filler tokens, then GO; the model must output `s_1 .. s_m` (fed back
  one by one, teacher forced). Scored on the m answers.
- recall (associative recall): key-value pairs, the target pair followed by k tokens of other
  pairs (distractors with other keys), then the target key as a query; the model must output the
  target value. k is the distance from the target value to the query.

Each architecture is trained once per task on batches whose k is drawn from the k grid, then its
accuracy is measured on fresh sequences at each k. Chance is 1 / n_symbols (copy) and
1 / n_values (recall).

Vocabulary: content symbols first, then filler symbols, then the GO marker.
"""

import random
import time

import torch
from torch.nn import functional as F

from zoo.models import build_model

IGNORE = -100


def copy_batch(batch_size: int, k: int, n_copy: int, n_symbols: int, n_filler: int, rng: random.Random):
    """Inputs `(B, L)` and targets `(B, L)` (IGNORE except at the answers) of the copy task."""
    go = n_symbols + n_filler
    inputs, targets = [], []
    for _ in range(batch_size):
        symbols = [rng.randrange(n_symbols) for _ in range(n_copy)]
        filler = [n_symbols + rng.randrange(n_filler) for _ in range(k)]
        sequence = symbols + filler + [go] + symbols
        inputs.append(sequence[:-1])
        targets.append([IGNORE] * (n_copy + k) + symbols)
    return torch.tensor(inputs), torch.tensor(targets)


def recall_batch(batch_size: int, k: int, n_keys: int, n_values: int, n_before: int, rng: random.Random):
    """Inputs `(B, L)` and targets `(B, L)` of associative recall at distance k (k rounded up to even).

    Keys are ids `0..n_keys-1`, values `n_keys..n_keys+n_values-1`.
    """
    n_after = (k + 1) // 2
    inputs, targets = [], []
    for _ in range(batch_size):
        key = rng.randrange(n_keys)
        others = [c for c in range(n_keys) if c != key]
        value = n_keys + rng.randrange(n_values)
        pairs = [(rng.choice(others), n_keys + rng.randrange(n_values)) for _ in range(n_before)]
        pairs.append((key, value))
        pairs += [(rng.choice(others), n_keys + rng.randrange(n_values)) for _ in range(n_after)]
        sequence = [token for pair in pairs for token in pair] + [key]
        inputs.append(sequence)
        targets.append([IGNORE] * (len(sequence) - 1) + [value])
    return torch.tensor(inputs), torch.tensor(targets)


def vocab_size(task: dict) -> int:
    if task["kind"] == "copy":
        return task["n_symbols"] + task["n_filler"] + 1
    return task["n_keys"] + task["n_values"]


def make_batch(task: dict, batch_size: int, k: int, rng: random.Random):
    if task["kind"] == "copy":
        return copy_batch(batch_size, k, task["n_copy"], task["n_symbols"], task["n_filler"], rng)
    if task["kind"] == "recall":
        return recall_batch(batch_size, k, task["n_keys"], task["n_values"], task["n_before"], rng)
    raise ValueError(f"unknown probe kind {task['kind']!r}; use 'copy' or 'recall'")


def max_length(task: dict, ks: list[int]) -> int:
    if task["kind"] == "copy":
        return task["n_copy"] * 2 + max(ks)
    return 2 * (task["n_before"] + 1 + (max(ks) + 1) // 2) + 1


def train_probe(architecture: str, overrides: dict, task: dict, ks: list[int], steps: int, batch_size: int,
                learning_rate: float, seed: int, device="cpu"):
    """Train a fresh model on the task with k drawn from `ks` per batch. Returns `(model, seconds, final_loss)`."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    extra = {"block_size": max_length(task, ks)} if architecture.startswith("transformer") else {}
    model = build_model(architecture, vocab_size=vocab_size(task), dropout=0.0, **{**extra, **overrides}).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=learning_rate, total_steps=steps, pct_start=0.1)
    model.train()
    start, loss = time.perf_counter(), torch.tensor(float("nan"))
    for _ in range(steps):
        inputs, targets = make_batch(task, batch_size, rng.choice(ks), rng)
        logits, _ = model(inputs.to(device))
        loss = F.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return model.eval(), time.perf_counter() - start, loss.item()


@torch.inference_mode()
def probe_accuracy(model, task: dict, k: int, n_sequences: int, seed: int, device="cpu") -> float:
    """Fraction of answer tokens predicted exactly (argmax), on fresh sequences at distance k."""
    rng = random.Random(seed)
    inputs, targets = make_batch(task, n_sequences, k, rng)
    logits, _ = model(inputs.to(device))
    answers = targets.to(device) != IGNORE
    correct = (logits.argmax(dim=-1) == targets.to(device)) & answers
    return float(correct.sum() / answers.sum())


def run_probe(architecture: str, overrides: dict, task: dict, ks: list[int], steps: int, batch_size: int,
              learning_rate: float, n_eval: int, seed: int, device="cpu") -> dict:
    """Train one architecture on one task and measure accuracy at every k.

    Returns:
        `{"x": ks, "y": accuracies, "train_seconds", "final_loss", "chance"}`.
    """
    model, seconds, final_loss = train_probe(architecture, overrides, task, ks, steps, batch_size, learning_rate,
                                             seed, device)
    accuracies = [probe_accuracy(model, task, k, n_eval, seed + 1000 + k, device) for k in ks]
    chance = 1 / (task["n_symbols"] if task["kind"] == "copy" else task["n_values"])
    return {"x": list(ks), "y": accuracies, "train_seconds": seconds, "final_loss": final_loss, "chance": chance,
            "n_parameters": sum(p.numel() for p in model.parameters())}
