"""Gradient paths: how much the loss at the last position is moved by what happened k steps back.

- Hidden-state gradients (RNN, GRU): `||d loss_T / d h_{T-k}||` for k = 1..K, where `h_t` is the
  state after reading token t (every layer). The model is stepped one token at a time through
  `model(tokens[:, t:t+1], state)` and each returned state keeps its gradient (`retain_grad`).
- Input saliency (every LM): `||d loss_T / d x_{T-k}||` on the token embeddings; for the
  transformer this is a path of length 1 through attention.

Norms are per sequence, then summarised over sequences by their geometric mean (the mean of the
logs), which is what a per-step decay multiplies. The fitted decay per step is `exp(slope)` of a
least-squares line through `log norm` against k; `decay ** 39` compares with the lecture's
`0.9 ** 39 = 0.017`.
"""

import math

import torch
from torch.nn import functional as F

from zoo.eval.lm import is_recurrent


def _warm_state(model, prefix: torch.Tensor):
    """The state after reading `prefix` `(B, P)` without gradients (None when P == 0)."""
    if prefix.shape[1] == 0:
        return None
    with torch.no_grad():
        _, state = model(prefix)
    return state


def hidden_state_gradients(model, tokens: torch.Tensor, max_k: int, warmup: int = 0) -> torch.Tensor:
    """`||d loss_T / d h_{T-k}||` per sequence, `(B, max_k)` for k = 1..max_k.

    Args:
        model: a recurrent LM.
        tokens: `(B, warmup + max_k + 2)`: a warm-up prefix (read without gradients), then the
            max_k + 1 steps whose states are tracked, then the final target.
        warmup: tokens read before tracking starts, so the state is a realistic one.
    """
    if not is_recurrent(model):
        raise ValueError("hidden-state gradients need an RNN or GRU; use input_saliency for the transformer")
    if tokens.shape[1] != warmup + max_k + 2:
        raise ValueError(f"tokens need warmup + max_k + 2 = {warmup + max_k + 2} columns, got {tokens.shape[1]}")
    model.eval()
    state = _warm_state(model, tokens[:, :warmup])
    states = []
    for t in range(warmup, warmup + max_k + 1):
        logits, state = model(tokens[:, t : t + 1], state)
        state.retain_grad()
        states.append(state)
    # Summed over the batch: each row's loss depends only on its own states, so gradients stay per row.
    loss = F.cross_entropy(logits[:, -1].float(), tokens[:, -1], reduction="sum")
    loss.backward()
    # states[-1] is h_T; states[-1 - k] is h_{T-k}. Norm over layers and units: (n_layer, B, H) -> (B,)
    return torch.stack([states[-1 - k].grad.norm(dim=(0, 2)) for k in range(1, max_k + 1)], dim=1)


def _embedding_module(model):
    return model.embedding if is_recurrent(model) else model.token_embedding


def input_saliency(model, tokens: torch.Tensor, max_k: int, warmup: int = 0) -> torch.Tensor:
    """`||d loss_T / d x_{T-k}||` per sequence on the token embeddings, `(B, max_k)` for k = 1..max_k.

    `tokens` as in `hidden_state_gradients`; the transformer must have `warmup == 0` and a
    block_size of at least max_k + 1. `x_T` is the embedding of the last input token, so
    `x_{T-k}` is k tokens before it.
    """
    model.eval()
    captured = []
    hook = _embedding_module(model).register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        if is_recurrent(model):
            state = _warm_state(model, tokens[:, :warmup])
        elif warmup:
            raise ValueError("the transformer reads a window from scratch; use warmup=0")
        else:
            state = None
        captured.clear()
        logits, _ = model(tokens[:, warmup:-1], state)
    finally:
        hook.remove()
    embeddings = captured[-1]  # (B, max_k + 1, n_embd)
    embeddings.retain_grad()
    F.cross_entropy(logits[:, -1].float(), tokens[:, -1], reduction="sum").backward()
    grads = embeddings.grad  # (B, max_k + 1, n_embd); the last column is x_T
    return torch.stack([grads[:, -1 - k].norm(dim=-1) for k in range(1, max_k + 1)], dim=1)


def summarise(norms: torch.Tensor, fit_from: int = 1) -> dict:
    """Geometric mean over sequences and the fitted per-step decay.

    Args:
        norms: `(B, K)` gradient norms for k = 1..K.
        fit_from: first k of the fitted range (skip the first steps, where the loss itself acts).

    Returns:
        `{"x": k, "y": geometric-mean norm, "decay_per_step", "ratio_39": y[39] / y[1], "fitted_39": decay ** 39}`.
    """
    logs = norms.double().clamp_min(1e-45).log().mean(dim=0)  # (K,)
    ks = torch.arange(1, len(logs) + 1, dtype=torch.float64)
    x, y = ks[fit_from - 1 :], logs[fit_from - 1 :]
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    decay = math.exp(slope)
    ratio = float((logs[38] - logs[0]).exp()) if len(logs) >= 39 else None
    return {"x": ks.long().tolist(), "y": logs.exp().tolist(), "decay_per_step": decay, "ratio_39": ratio,
            "fitted_39": decay**39, "lecture_39": 0.9**39}


def sample_sequences(ids: torch.Tensor, n_sequences: int, length: int, seed: int = 0) -> torch.Tensor:
    """`(n_sequences, length)` windows of a token stream at seeded random offsets."""
    if len(ids) <= length:
        raise ValueError(f"a text of {len(ids)} tokens is too short for windows of {length}")
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - length, (n_sequences,), generator=generator)
    return torch.stack([ids[s : s + length] for s in starts.tolist()])
