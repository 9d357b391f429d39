"""Decoder-only causal transformer (Vaswani et al., 2017, "Attention Is All You Need";
Radford et al., 2019, GPT-2), pre-norm, with a preallocated KV cache for O(T) decoding.

    SA(X) = softmax((X W_Q)(X W_K)^T / sqrt(d_k) + causal mask) (X W_V)

Every position reaches every earlier one in one step (path length 1) at a cost of T^2 scores.
With a `KVCache`, each new token attends to the stored keys and values of the prefix, so one
decoding step costs O(T) instead of recomputing the O(T^2) prefix.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class TransformerConfig:
    """Hyper-parameters of the causal transformer.

    Attributes:
        vocab_size: number of token ids.
        block_size: the context length: the most positions one forward may see.
        n_layer: number of decoder blocks.
        n_head: attention heads per block.
        n_embd: model width (a multiple of `n_head`).
        dropout: dropout on attention weights, residual branches and embeddings.
        positions: "learned", "sinusoidal" or "none" (no position information at all).
        causal: apply the causal mask (turn off only to study plain self-attention).
        bias: biases in linear layers and layer norms.
        tie_weights: share the token embedding with the output head.
    """

    vocab_size: int = 65
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.1
    positions: str = "learned"
    causal: bool = True
    bias: bool = False
    tie_weights: bool = True

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class KVCache:
    """Preallocated keys and values of every layer: a plain object passed in and out of `forward`.

    Attributes:
        keys, values: `(n_layer, B, n_head, max_len, head_dim)`.
        key_mask: `(B, max_len)` True where a stored position holds a real (non-padding) token.
        length: how many positions are filled (the same for every row).
        padded: whether any stored position is padding (decides if a step needs a mask).
        plan: the model's references to the tensors a one-token step reads, kept for the next step.
    """

    def __init__(self, config: TransformerConfig, batch_size: int, max_len: int | None = None, device=None, dtype=None):
        max_len = max_len or config.block_size
        shape = (config.n_layer, batch_size, config.n_head, max_len, config.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.key_mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.length = 0
        self.padded = False
        self.plan = None  # (model, its step plan): set by the model on the first one-token step

    @property
    def max_len(self) -> int:
        return self.keys.shape[3]

    @property
    def batch_size(self) -> int:
        return self.keys.shape[1]

    def nbytes(self) -> int:
        """Bytes held by keys and values: 2 * layers * B * heads * max_len * head_dim * itemsize."""
        return self.keys.numel() * self.keys.element_size() * 2

    def positions(self, pad_mask: torch.Tensor) -> torch.Tensor:
        """Position ids `(B, T)` of new tokens: the count of real tokens before each one."""
        before = self.key_mask[:, : self.length].sum(dim=1, keepdim=True)  # (B, 1)
        return (before + pad_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def sinusoidal_positions(n_positions: int, dim: int) -> torch.Tensor:
    """The fixed sin/cos table of Vaswani et al., `(n_positions, dim)`."""
    position = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: dim // 2])
    return table


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention, causal unless configured otherwise."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd={config.n_embd} is not a multiple of n_head={config.n_head}")
        self.config = config
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, layer: int = 0, kv_cache: KVCache | None = None, attn_mask: torch.Tensor | None = None):
        """Args:
            x: `(B, T, n_embd)`.
            layer: this block's index into the cache.
            kv_cache: cache to read the prefix from and write the new keys/values into.
            attn_mask: `(B, 1, T, S)` boolean, True where attention is allowed; None means the plain
                causal (or unmasked) pattern over `x` alone.
        """
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        shape = (B, T, self.config.n_head, self.config.head_dim)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))  # (B, n_head, T, head_dim)
        if kv_cache is not None:
            start = kv_cache.length
            kv_cache.keys[layer, :, :, start : start + T] = k
            kv_cache.values[layer, :, :, start : start + T] = v
            k = kv_cache.keys[layer, :, :, : start + T]  # (B, n_head, S, head_dim)
            v = kv_cache.values[layer, :, :, : start + T]
        dropout = self.config.dropout if self.training else 0.0
        if attn_mask is None:
            # Without a mask, one query sees every stored key: the causal pattern of a decoding step.
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=self.config.causal and T > 1)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, n_embd)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm decoder block: x + SA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = SelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, layer=0, kv_cache=None, attn_mask=None):
        x = x + self.attn(self.ln_1(x), layer, kv_cache, attn_mask)
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    """GPT-style causal language model.

    `forward(tokens, state) -> (logits, state)`: the state is a `KVCache` (or None). Feeding a
    sequence one token at a time through the cache gives the logits of one full causal forward.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if config.positions not in ("learned", "sinusoidal", "none"):
            raise ValueError(f"unknown positions {config.positions!r}; use 'learned', 'sinusoidal' or 'none'")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        if config.positions == "learned":
            self.position_embedding = nn.Embedding(config.block_size, config.n_embd)
        elif config.positions == "sinusoidal":
            self.register_buffer("position_table", sinusoidal_positions(config.block_size, config.n_embd), persistent=False)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.head.weight = self.token_embedding.weight
        self.apply(self._init_weights)
        # GPT-2: scale residual projections by 1/sqrt(2 * n_layer).
        for name, parameter in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def init_state(self, batch_size: int, device=None, dtype=None, max_len: int | None = None) -> KVCache:
        """An empty `KVCache` for `batch_size` rows and up to `max_len` (default `block_size`) positions."""
        dtype = dtype or self.token_embedding.weight.dtype
        return KVCache(self.config, batch_size, max_len, device=device, dtype=dtype)

    def _position_embedding(self, positions: torch.Tensor) -> torch.Tensor | float:
        if self.config.positions == "learned":
            return self.position_embedding(positions)
        if self.config.positions == "sinusoidal":
            return self.position_table[positions]
        return 0.0

    def forward(self, tokens: torch.Tensor, state: KVCache | None = None, pad_mask: torch.Tensor | None = None):
        """Score every next token.

        Args:
            tokens: `(B, T)` token ids.
            state: a `KVCache` holding the prefix (it is filled in place and returned), or None.
            pad_mask: `(B, T)` boolean, True for real tokens, False for (left) padding. Padding is
                never attended to and does not advance a row's positions.

        Returns:
            logits `(B, T, vocab_size)` and the state (the same cache, advanced by T, or None).
        """
        B, T = tokens.shape
        if pad_mask is not None:
            if pad_mask.shape != tokens.shape:
                raise ValueError(f"pad_mask of shape {tuple(pad_mask.shape)} does not match tokens {(B, T)}")
            pad_mask = pad_mask.to(device=tokens.device, dtype=torch.bool)  # 0/1 integer masks are common
        start = state.length if state is not None else 0
        self._check_context(start + T, state)
        if state is not None and T == 1 and pad_mask is None and not self.training:
            if state.plan is None or state.plan[0] is not self:
                state.plan = (self, self._step_plan())
            if state.plan[1] is not None:
                return self._step(tokens[:, 0], state, state.plan[1]).unsqueeze(1), state
        attn_mask = None
        # No padding anywhere and either a fresh sequence or one new token: SDPA needs no mask.
        if pad_mask is None and (state is None or (not state.padded and (start == 0 or T == 1))):
            positions = torch.arange(start, start + T, device=tokens.device).unsqueeze(0)  # (1, T)
            if state is not None:
                state.key_mask[:, start : start + T] = True
        else:
            if pad_mask is None:
                pad_mask = torch.ones(B, T, dtype=torch.bool, device=tokens.device)
            if state is None:
                positions = (pad_mask.long().cumsum(dim=1) - 1).clamp(min=0)
                key_mask = pad_mask
            else:
                positions = state.positions(pad_mask)
                state.key_mask[:, start : start + T] = pad_mask
                state.padded = state.padded or not bool(pad_mask.all())
                key_mask = state.key_mask[:, : start + T]
            # (B, 1, T, S): query i sees key j when j is real and not in its future.
            causal = torch.ones(T, start + T, dtype=torch.bool, device=tokens.device).tril(diagonal=start)
            if not self.config.causal:
                causal = torch.ones_like(causal)
            attn_mask = (causal.unsqueeze(0) & key_mask.unsqueeze(1)).unsqueeze(1)
            # A padding query would see no key at all; let it see itself so softmax stays finite.
            own = torch.arange(T, device=tokens.device)
            attn_mask[:, :, own, start + own] = True
        x = self.dropout(self.token_embedding(tokens) + self._position_embedding(positions))  # (B, T, n_embd)
        for layer, block in enumerate(self.blocks):
            x = block(x, layer, state, attn_mask)
        if state is not None:
            state.length = start + T
        return self.head(self.ln_f(x)), state

    def _check_context(self, length: int, state: KVCache | None) -> None:
        limit = min(state.max_len if state is not None else self.config.block_size, self.config.block_size)
        if length > limit:
            raise ValueError(
                f"sequence of {length} positions exceeds the context of {limit} "
                f"(block_size={self.config.block_size}); shorten the input or slide a window over it"
            )

    def _step_plan(self) -> tuple | None:
        """The tensors a decoding step reads, gathered once per cache so that `_step` makes no module
        calls (at these sizes, reading a submodule or parameter attribute costs about as much as a
        small operation). They are references to the parameters, not copies. None when a layer is not
        a plain `nn.Linear` / `nn.LayerNorm` (after quantization, say): `forward` takes its general path.
        """
        linears = [m for b in self.blocks for m in (b.attn.qkv, b.attn.proj, b.mlp.fc, b.mlp.proj)] + [self.head]
        norms = [m for b in self.blocks for m in (b.ln_1, b.ln_2)] + [self.ln_f]
        if any(type(m) is not nn.Linear for m in linears) or any(type(m) is not nn.LayerNorm for m in norms):
            return None

        def ln(m: nn.LayerNorm):
            return m.normalized_shape, m.weight, m.bias, m.eps

        layers = tuple(
            (ln(b.ln_1), b.attn.qkv.weight, b.attn.qkv.bias, b.attn.proj.weight, b.attn.proj.bias,
             ln(b.ln_2), b.mlp.fc.weight, b.mlp.fc.bias, b.mlp.proj.weight, b.mlp.proj.bias)
            for b in self.blocks
        )
        if self.config.positions == "learned":
            table = self.position_embedding.weight
        else:
            table = self.position_table if self.config.positions == "sinusoidal" else None
        return self.token_embedding.weight, table, layers, ln(self.ln_f), self.head.weight

    def _step(self, tokens: torch.Tensor, state: KVCache, plan: tuple) -> torch.Tensor:
        """`forward` of one new token per row, `tokens` `(B,)`, in eval mode; logits `(B, V)`.

        The same arithmetic in fewer operations (no dropout, no reshapes through T) and with
        no module calls: for a small model, a decoding step costs as much in dispatching operations as
        in the arithmetic itself.
        """
        start = state.length
        embedding, table, layers, ln_f, head = plan
        B, H = tokens.shape[0], self.config.n_head
        state.key_mask[:, start] = True
        attn_mask, positions = None, start
        if state.padded:
            positions = state.key_mask[:, :start].sum(dim=1)  # (B,) real tokens before this one
            attn_mask = state.key_mask[:, None, None, : start + 1]  # (B, 1, 1, S): never attend to padding
        x = embedding[tokens] if table is None else embedding[tokens] + table[positions]  # (B, n_embd)
        for layer, (ln_1, w_qkv, b_qkv, w_o, b_o, ln_2, w_fc, b_fc, w_proj, b_proj) in enumerate(layers):
            q, k, v = F.linear(torch.layer_norm(x, *ln_1), w_qkv, b_qkv).view(B, 3, H, 1, -1).unbind(1)
            state.keys[layer, :, :, start : start + 1] = k
            state.values[layer, :, :, start : start + 1] = v
            keys, values = state.keys[layer, :, :, : start + 1], state.values[layer, :, :, : start + 1]
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask)  # (B, H, 1, head_dim)
            # x + y W^T (+ b): the residual add fused into the matmul
            x = torch.addmm(x if b_o is None else x + b_o, y.view(B, -1), w_o.t())
            h = F.gelu(F.linear(torch.layer_norm(x, *ln_2), w_fc, b_fc))
            x = torch.addmm(x if b_proj is None else x + b_proj, h, w_proj.t())
        state.length = start + 1
        return F.linear(torch.layer_norm(x, *ln_f), head)


ARCHITECTURES = {
    "transformer_small": TransformerConfig(block_size=256, n_layer=4, n_head=4, n_embd=256, dropout=0.1),
    "transformer_medium": TransformerConfig(block_size=128, n_layer=4, n_head=8, n_embd=384, dropout=0.1),
    "transformer_tiny": TransformerConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.0),
}
