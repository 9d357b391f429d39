"""GRU language model (Cho et al., 2014, "Learning Phrase Representations using RNN
Encoder-Decoder for Statistical Machine Translation").

The gates of the lecture, per layer and step (PyTorch's `nn.GRU` computes exactly these):

    r_t = sigmoid(W_r x_t + U_r h_{t-1})            reset gate: how much past enters the candidate
    z_t = sigmoid(W_z x_t + U_z h_{t-1})            update gate: how much state is kept
    n_t = tanh(W_n x_t + r_t * (U_n h_{t-1}))       candidate content
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}           mix of retained state and candidate

The model is `RNNLM` with a GRU cell: same contract, `forward(tokens, state) -> (logits, state)`.
"""

from dataclasses import dataclass

from zoo.models.rnn_lm import RNNLM, RNNLMConfig


@dataclass
class GRULMConfig(RNNLMConfig):
    """`RNNLMConfig` with the GRU cell."""

    cell: str = "gru"


class GRULM(RNNLM):
    """A recurrent LM with gated (GRU) layers; see `RNNLM`."""

    def __init__(self, config: GRULMConfig):
        if config.cell != "gru":
            raise ValueError(f"GRULM needs cell='gru', got {config.cell!r}")
        super().__init__(config)


ARCHITECTURES = {
    "gru_lm_small": GRULMConfig(n_embd=128, hidden_size=512, n_layer=2, dropout=0.1),
    "gru_lm_medium": GRULMConfig(n_embd=400, hidden_size=650, n_layer=2, dropout=0.2, tie_weights=True),
    "gru_lm_tiny": GRULMConfig(n_embd=32, hidden_size=64, n_layer=1, dropout=0.0),
}
