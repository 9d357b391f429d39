"""Bahdanau seq2seq translator (Bahdanau, Cho & Bengio, 2015, "Neural Machine Translation by
Jointly Learning to Align and Translate").

A bidirectional GRU encoder keeps one state per source position. At each target step the
decoder's previous state is the query, scored against every encoder state with the additive
score `e_j = v^T tanh(W_q q + W_k h_j)`; a softmax over the (unpadded) source positions gives
the attention weights, and their weighted sum of encoder states is the context fed to the
decoder GRU and to the output layer.

With `attention=False` the decoder instead sees one fixed vector, the final encoder states, at
every step: the seq2seq bottleneck of Cho et al. (2014) / Sutskever et al. (2014).
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


@dataclass
class Seq2SeqConfig:
    """Hyper-parameters of the translator.

    Attributes:
        src_vocab_size, tgt_vocab_size: source and target vocabularies.
        n_embd: embedding width (both sides).
        encoder_hidden: width of each encoder direction.
        decoder_hidden: width of the decoder GRU.
        attention_dim: width of the additive scorer.
        dropout: dropout on embeddings and before the output layer.
        attention: use additive attention; False gives the fixed-context baseline.
        pad_id: padding id of both vocabularies.
    """

    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    n_embd: int = 256
    encoder_hidden: int = 256
    decoder_hidden: int = 512
    attention_dim: int = 256
    dropout: float = 0.3
    attention: bool = True
    pad_id: int = 0


class Encoder(nn.Module):
    """Embedding -> bidirectional GRU; returns every position's state and the decoder's start state."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.src_vocab_size, config.n_embd, padding_idx=config.pad_id)
        self.rnn = nn.GRU(config.n_embd, config.encoder_hidden, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(2 * config.encoder_hidden, config.decoder_hidden)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor):
        """Returns encoder_states `(B, S, 2 * encoder_hidden)`, final `(B, 2 * encoder_hidden)`."""
        embedded = self.dropout(self.embedding(src))  # (B, S, n_embd)
        packed = pack_padded_sequence(embedded, src_lengths.cpu(), batch_first=True, enforce_sorted=False)
        packed_states, final = self.rnn(packed)  # final: (2, B, encoder_hidden)
        encoder_states, _ = pad_packed_sequence(packed_states, batch_first=True, total_length=src.shape[1])
        final = torch.cat([final[0], final[1]], dim=-1)  # (B, 2 * encoder_hidden)
        return encoder_states, final


class AdditiveAttention(nn.Module):
    """`softmax_j(v^T tanh(W_q q + W_k h_j))` over the real source positions."""

    def __init__(self, query_dim: int, key_dim: int, attention_dim: int):
        super().__init__()
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)
        self.key_proj = nn.Linear(key_dim, attention_dim)
        self.score = nn.Linear(attention_dim, 1, bias=False)

    def forward(self, query, encoder_states, src_mask, projected_keys=None):
        """Args:
            query: `(B, query_dim)`, the decoder's previous state.
            encoder_states: `(B, S, key_dim)`.
            src_mask: `(B, S)` True at real source tokens.
            projected_keys: `W_k h_j`, `(B, S, attention_dim)`, when precomputed for the sentence.

        Returns:
            context `(B, key_dim)` and attention_weights `(B, S)` (rows sum to 1; exactly 0 at padding).
        """
        if projected_keys is None:
            projected_keys = self.key_proj(encoder_states)
        energy = torch.tanh(self.query_proj(query).unsqueeze(1) + projected_keys)  # (B, S, attention_dim)
        scores = self.score(energy).squeeze(-1).masked_fill(~src_mask, float("-inf"))  # (B, S)
        attention_weights = torch.softmax(scores, dim=-1)
        context = torch.bmm(attention_weights.unsqueeze(1), encoder_states).squeeze(1)  # (B, key_dim)
        return context, attention_weights


class Seq2Seq(nn.Module):
    """Encoder-decoder translator: `encode`, then `decode_step` once per target token."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = config
        context_dim = 2 * config.encoder_hidden
        self.encoder = Encoder(config)
        self.attention = (
            AdditiveAttention(config.decoder_hidden, context_dim, config.attention_dim) if config.attention else None
        )
        self.tgt_embedding = nn.Embedding(config.tgt_vocab_size, config.n_embd, padding_idx=config.pad_id)
        self.decoder = nn.GRUCell(config.n_embd + context_dim, config.decoder_hidden)
        self.output = nn.Linear(config.decoder_hidden + context_dim + config.n_embd, config.tgt_vocab_size)
        self.dropout = nn.Dropout(config.dropout)

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor):
        """Read the source sentence.

        Args:
            src: `(B, S)` source ids, right-padded with `pad_id`.
            src_lengths: `(B,)` number of real tokens per row.

        Returns:
            encoder_states `(B, S, 2 * encoder_hidden)`, src_mask `(B, S)` and the decoder's initial
            state `(B, decoder_hidden)`. Without attention the encoder states are replaced by the
            final summary `(B, 1, 2 * encoder_hidden)`: the only thing the decoder may see.
        """
        if (src_lengths < 1).any():
            raise ValueError("every source sentence needs at least one token (got an empty one)")
        encoder_states, final = self.encoder(src, src_lengths)
        state = torch.tanh(self.encoder.bridge(final))  # (B, decoder_hidden)
        src_mask = torch.arange(src.shape[1], device=src.device).unsqueeze(0) < src_lengths.to(src.device).unsqueeze(1)
        if self.attention is None:
            encoder_states = final.unsqueeze(1)  # (B, 1, 2 * encoder_hidden)
            src_mask = torch.ones(src.shape[0], 1, dtype=torch.bool, device=src.device)
        return encoder_states, src_mask, state

    def decode_step(self, prev_tokens, encoder_states, src_mask, state, projected_keys=None):
        """One decoder step.

        Args:
            prev_tokens: `(B,)` the previous target token (BOS at the start).
            encoder_states, src_mask: from `encode`.
            state: `(B, decoder_hidden)` the previous decoder state (the attention query).
            projected_keys: optional precomputed `W_k h_j` (see `project_keys`).

        Returns:
            logits `(B, tgt_vocab_size)`, the new state `(B, decoder_hidden)`, and attention_weights
            `(B, S)` (None without attention).
        """
        embedded = self.dropout(self.tgt_embedding(prev_tokens))  # (B, n_embd)
        if self.attention is None:
            context, attention_weights = encoder_states[:, 0], None
        else:
            context, attention_weights = self.attention(state, encoder_states, src_mask, projected_keys)
        state = self.decoder(torch.cat([embedded, context], dim=-1), state)
        features = torch.cat([state, context, embedded], dim=-1)
        return self.output(self.dropout(features)), state, attention_weights

    def project_keys(self, encoder_states: torch.Tensor) -> torch.Tensor | None:
        """`W_k h_j` for every source position, computed once per sentence rather than per step."""
        return None if self.attention is None else self.attention.key_proj(encoder_states)

    def forward(self, src, src_lengths, tgt_in, return_attention: bool = False):
        """Teacher-forced decoding.

        Args:
            src: `(B, S)`, src_lengths: `(B,)`.
            tgt_in: `(B, T)` target ids shifted right (BOS first).

        Returns:
            logits `(B, T, tgt_vocab_size)`, plus attention `(B, T, S)` when `return_attention`.
        """
        encoder_states, src_mask, state = self.encode(src, src_lengths)
        projected_keys = self.project_keys(encoder_states)
        logits, attention = [], []
        for t in range(tgt_in.shape[1]):
            step_logits, state, weights = self.decode_step(tgt_in[:, t], encoder_states, src_mask, state, projected_keys)
            logits.append(step_logits)
            attention.append(weights)
        logits = torch.stack(logits, dim=1)
        if return_attention:
            return logits, (torch.stack(attention, dim=1) if self.attention is not None else None)
        return logits


ARCHITECTURES = {
    "bahdanau_small": Seq2SeqConfig(n_embd=256, encoder_hidden=256, decoder_hidden=512, attention_dim=256, dropout=0.3),
    "seq2seq_noattn_small": Seq2SeqConfig(
        n_embd=256, encoder_hidden=256, decoder_hidden=512, attention_dim=256, dropout=0.3, attention=False
    ),
    "bahdanau_tiny": Seq2SeqConfig(n_embd=32, encoder_hidden=32, decoder_hidden=64, attention_dim=32, dropout=0.0),
    "seq2seq_noattn_tiny": Seq2SeqConfig(
        n_embd=32, encoder_hidden=32, decoder_hidden=64, attention_dim=32, dropout=0.0, attention=False
    ),
}
