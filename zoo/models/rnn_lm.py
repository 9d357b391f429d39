"""Elman RNN language model (Elman, 1990; Mikolov et al., 2010, "Recurrent neural network based
language model").

    h_t = tanh(W_xh x_t + W_hh h_{t-1} + b)        (one layer; layers stack)
    logits_t = W_out h_t

The same class serves the GRU language model (`zoo.models.gru_lm`): only the cell differs.
"""

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class RNNLMConfig:
    """Hyper-parameters of a recurrent language model.

    Attributes:
        vocab_size: number of token ids.
        n_embd: embedding width.
        hidden_size: width of each recurrent layer.
        n_layer: number of stacked recurrent layers.
        dropout: dropout on embeddings, between layers and before the head.
        tie_weights: share the embedding matrix with the output head (needs a projection
            from `hidden_size` to `n_embd` when the two differ).
        cell: "rnn" (tanh Elman cell) or "gru".
    """

    vocab_size: int = 65
    n_embd: int = 128
    hidden_size: int = 256
    n_layer: int = 2
    dropout: float = 0.1
    tie_weights: bool = False
    cell: str = "rnn"


class RNNLM(nn.Module):
    """Embedding -> stacked recurrent layers -> (projection) -> vocabulary head.

    `forward(tokens, state) -> (logits, state)`: the state is the hidden tensor
    `(n_layer, B, hidden_size)`, so feeding a sequence in pieces gives the same logits as
    feeding it whole.
    """

    cells = {"rnn": nn.RNN, "gru": nn.GRU}

    def __init__(self, config: RNNLMConfig):
        super().__init__()
        if config.cell not in self.cells:
            raise ValueError(f"unknown recurrent cell {config.cell!r}; use one of {sorted(self.cells)}")
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        rnn_kwargs = {"nonlinearity": "tanh"} if config.cell == "rnn" else {}
        self.rnn = self.cells[config.cell](
            config.n_embd,
            config.hidden_size,
            num_layers=config.n_layer,
            dropout=config.dropout if config.n_layer > 1 else 0.0,
            batch_first=True,
            **rnn_kwargs,
        )
        # A projection lets a wide recurrent layer share weights with a narrower embedding.
        needs_projection = config.tie_weights and config.hidden_size != config.n_embd
        self.projection = nn.Linear(config.hidden_size, config.n_embd) if needs_projection else None
        head_in = config.n_embd if config.tie_weights else config.hidden_size
        self.head = nn.Linear(head_in, config.vocab_size)
        if config.tie_weights:
            self.head.weight = self.embedding.weight
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.zeros_(self.head.bias)
        if not self.config.tie_weights:
            nn.init.uniform_(self.head.weight, -0.1, 0.1)

    def init_state(self, batch_size: int, device=None, dtype=None) -> torch.Tensor:
        """Zero hidden state, `(n_layer, batch_size, hidden_size)`."""
        return torch.zeros(self.config.n_layer, batch_size, self.config.hidden_size, device=device, dtype=dtype)

    def forward(self, tokens: torch.Tensor, state: torch.Tensor | None = None):
        """Score every next token.

        Args:
            tokens: `(B, T)` token ids.
            state: `(n_layer, B, hidden_size)` hidden state from the previous call, or None for zeros.

        Returns:
            logits `(B, T, vocab_size)` and the new state `(n_layer, B, hidden_size)`.
        """
        x = self.dropout(self.embedding(tokens))  # (B, T, n_embd)
        hidden, state = self.rnn(x, state)  # (B, T, hidden_size), (n_layer, B, hidden_size)
        hidden = self.dropout(hidden)
        if self.projection is not None:
            hidden = self.projection(hidden)  # (B, T, n_embd)
        return self.head(hidden), state


# Registry entries: architecture name -> config overrides. The vocabulary comes from the tokenizer.
ARCHITECTURES = {
    "rnn_lm_small": RNNLMConfig(n_embd=128, hidden_size=512, n_layer=2, dropout=0.1, cell="rnn"),
    "rnn_lm_medium": RNNLMConfig(n_embd=256, hidden_size=512, n_layer=2, dropout=0.1, cell="rnn"),
    "rnn_lm_tiny": RNNLMConfig(n_embd=32, hidden_size=64, n_layer=1, dropout=0.0, cell="rnn"),
}
