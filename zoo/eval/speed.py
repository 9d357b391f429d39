"""Speed and memory: training and decoding throughput, decode latency by position, KV-cache bytes,
and the size of one attention map.

Timings are wall-clock (`time.perf_counter`) after warm-up steps, on whatever device the model is
on; they depend on the machine and its load, which the records name. Memory figures are measured
on the tensors themselves (`untyped_storage().nbytes()`), next to the formula they should equal.
"""

import copy
import math
import os
import time

import torch
from torch.nn import functional as F

from zoo.models import KVCache, family_of


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device, precision: str):
    if precision == "float32":
        return torch.autocast(torch.device(device).type, enabled=False)
    if precision == "bfloat16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    raise ValueError(f"unknown precision {precision!r}; use 'float32' or 'bfloat16' (autocast)")


def _training_loss(model, batch_size: int, seq_len: int, generator: torch.Generator, device):
    config = model.config
    if family_of(model) == "seq2seq":
        src = torch.randint(4, config.src_vocab_size, (batch_size, seq_len), generator=generator).to(device)
        tgt = torch.randint(4, config.tgt_vocab_size, (batch_size, seq_len + 1), generator=generator).to(device)
        lengths = torch.full((batch_size,), seq_len)
        logits = model(src, lengths, tgt[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten())
    tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1), generator=generator).to(device)
    logits, _ = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


def training_tokens_per_second(model, batch_size: int, seq_len: int, precision: str = "float32", steps: int = 4,
                               warmup: int = 1, seed: int = 0) -> dict:
    """Tokens per second of full training steps (forward, backward, AdamW) on random tokens.

    A copy of the model is trained, so `model` is left as it was. Target tokens are counted for
    translators (`seq_len` per row).

    Returns:
        `{"tokens_per_second", "seconds_per_step", "steps"}`.
    """
    device = next(model.parameters()).device
    trainee = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(trainee.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(seed)
    elapsed = 0.0
    for step in range(warmup + steps):
        _sync(device)
        start = time.perf_counter()
        with _autocast(device, precision):
            loss = _training_loss(trainee, batch_size, seq_len, generator, device)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        if step >= warmup:
            elapsed += time.perf_counter() - start
    return {"tokens_per_second": batch_size * seq_len * steps / elapsed, "seconds_per_step": elapsed / steps,
            "steps": steps}


@torch.inference_mode()
def decode_latencies(model, n_tokens: int, use_cache: bool = True, repeats: int = 3, seed: int = 0) -> list[float]:
    """Seconds to produce each next token at positions 1..n_tokens (batch 1, one-token prompt).

    Each position's figure is the fastest of `repeats` runs, the least disturbed by other work on the machine.

    Uses `zoo.generation`'s decoders: the state is the hidden tensor (RNN/GRU) or a `KVCache`
    (transformer); `use_cache=False` recomputes the transformer's whole prefix every step.
    """
    from zoo.generation import make_decoder

    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    if family_of(model) == "transformer" and n_tokens >= model.config.block_size:
        raise ValueError(f"n_tokens={n_tokens} must stay below block_size={model.config.block_size} (no sliding)")
    tokens = torch.randint(0, vocab, (n_tokens,), generator=torch.Generator().manual_seed(seed)).to(device)
    runs = []
    for _ in range(repeats):
        decoder = make_decoder(model, [[int(tokens[0])]], n_tokens, use_cache=use_cache)
        times = []
        _sync(device)
        start = time.perf_counter()
        decoder.prefill()
        _sync(device)
        times.append(time.perf_counter() - start)
        for position in range(1, n_tokens):
            start = time.perf_counter()
            decoder.step(tokens[position : position + 1])
            _sync(device)
            times.append(time.perf_counter() - start)
        runs.append(times)
    return torch.tensor(runs).min(dim=0).values.tolist()


@torch.inference_mode()
def translation_decode_tokens_per_second(model, n_tokens: int = 64, source_len: int = 16, repeats: int = 3,
                                         seed: int = 0) -> float:
    """Target tokens per second of greedy seq2seq decoding (batch 1, `n_tokens` steps, no early stop)."""
    from zoo.translate import greedy_search

    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, model.config.src_vocab_size, (1, source_len), generator=generator).to(device)
    lengths, limits = torch.tensor([source_len]), torch.tensor([n_tokens])
    best = math.inf
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        greedy_search(model, src, lengths, bos_id=2, eos_id=-1, max_lengths=limits)  # eos -1: never stops early
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return n_tokens / best


def kv_cache_bytes(config, context_lengths: list[int], dtype=torch.float32) -> dict:
    """Bytes of a batch-1 `KVCache` for each context length: measured on its tensors, and by formula.

    Formula: `2 * n_layer * n_head * head_dim * T * bytes_per_element` (keys and values).
    """
    measured, formula = [], []
    element = torch.tensor([], dtype=dtype).element_size()
    for length in context_lengths:
        cache = KVCache(config, batch_size=1, max_len=length, dtype=dtype)
        measured.append(cache.keys.untyped_storage().nbytes() + cache.values.untyped_storage().nbytes())
        if measured[-1] != cache.nbytes():
            raise AssertionError(f"KVCache.nbytes()={cache.nbytes()} disagrees with its tensors ({measured[-1]})")
        formula.append(2 * config.n_layer * config.n_head * config.head_dim * length * element)
        del cache
    return {"x": list(context_lengths), "measured": measured, "formula": formula}


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@torch.inference_mode()
def attention_map_bytes(lengths: list[int], head_dim: int = 64, dtype=torch.float32, device="cpu",
                        seed: int = 0) -> dict:
    """Size of one head's T x T attention map `softmax(q k^T / sqrt(d))`, materialised, for each T.

    Returns:
        `{"x": T, "measured": bytes of the map tensor, "formula": T^2 * bytes_per_element,
        "seconds": time to compute it, "rss_increase": resident-memory growth while it exists
        (CPU; None where unknown), "peak_cuda": peak allocated bytes (CUDA only)}`.
    """
    generator = torch.Generator().manual_seed(seed)
    result = {"x": list(lengths), "measured": [], "formula": [], "seconds": [], "rss_increase": [], "peak_cuda": []}
    element = torch.tensor([], dtype=dtype).element_size()
    for T in lengths:
        q = torch.randn(T, head_dim, generator=generator).to(device=device, dtype=dtype)
        k = torch.randn(T, head_dim, generator=generator).to(device=device, dtype=dtype)
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        before = _rss_bytes()
        _sync(device)
        start = time.perf_counter()
        weights = torch.softmax(q @ k.T / math.sqrt(head_dim), dim=-1)  # (T, T)
        _sync(device)
        result["seconds"].append(time.perf_counter() - start)
        after = _rss_bytes()
        result["measured"].append(weights.untyped_storage().nbytes())
        result["formula"].append(T * T * element)
        result["rss_increase"].append(after - before if before is not None and after is not None else None)
        result["peak_cuda"].append(torch.cuda.max_memory_allocated(device) - base if cuda else None)
        del weights, q, k
    return result
