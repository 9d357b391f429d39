"""Language-model scoring, tokenizer-independent: bits per character of the same text for every LM.

Definitions, used by the `lm` suite and by the text-in/text-out adapter alike:

- The scored text is preceded by one line break, given as context and not scored: `<eos>` for a
  word tokenizer, `"\\n"` for a character tokenizer. Every token of the text is then predicted.
- Characters: for a character model, the characters of the text. For a word model, the characters
  of the text as the word tokenizer decodes its ids: words joined by single spaces, one `"\\n"` per
  `<eos>` (so PTB's leading and trailing spaces on each line are not counted, and `<unk>` counts as
  the five characters it is written with). `n_chars = len(tokenizer.decode(ids))`.
- Bits per character = total NLL of the text in nats / n_chars / ln 2. Perplexity (per token,
  `<eos>` included) = exp(total NLL / n_tokens).

Context policies:
- `carry`: recurrent models read the whole text as one stream, the state carried from start to end
  (fed in chunks; the chunk length does not change the result).
- `sliding`: the transformer sees windows of `window` tokens ending every `stride` tokens; each
  window scores only the tokens that the previous one did not, so every token after the first
  window has at least `window - stride` tokens of context.
- `disjoint`: windows of `window` tokens with no overlap: token t of a window sees t tokens.
"""

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from zoo.models import family_of

RECURRENT_FAMILIES = ("rnn_lm", "gru_lm")


def is_recurrent(model) -> bool:
    return family_of(model) in RECURRENT_FAMILIES


def boundary_id(tokenizer) -> int:
    """The id that stands for a line break: `<eos>` (word level) or `"\\n"` (character level)."""
    eos = getattr(tokenizer, "eos_id", None)
    if eos is not None:
        return eos
    index = getattr(tokenizer, "index", {})
    if "\n" in index:
        return index["\n"]
    raise ValueError(
        f"{type(tokenizer).__name__} has neither <eos> nor a line-break character, so the first token of a text "
        "has no context to be scored from; score the text with a context string instead"
    )


def count_chars(tokenizer, ids: list[int], text: str | None = None) -> int:
    """Characters that `ids` stand for (see the module docstring)."""
    if getattr(tokenizer, "kind", None) == "char" and text is not None:
        return len(text)
    return len(tokenizer.decode(ids))


def encode_for_scoring(tokenizer, text: str) -> tuple[torch.Tensor, int]:
    """`(ids, n_chars)`: the line-break context token followed by the text's ids, `(N + 1,)`."""
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError("the text to score is empty")
    return torch.tensor([boundary_id(tokenizer), *ids], dtype=torch.long), count_chars(tokenizer, ids, text)


@dataclass
class LMScore:
    """Summed negative log-likelihood of a text and what it was summed over."""

    total_nll: float  # nats
    n_tokens: int
    n_chars: int

    @property
    def bits_per_char(self) -> float:
        return self.total_nll / self.n_chars / math.log(2)

    @property
    def bits_per_token(self) -> float:
        return self.total_nll / self.n_tokens / math.log(2)

    @property
    def perplexity(self) -> float:
        return math.exp(self.total_nll / self.n_tokens)


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def losses_carry(model, ids: torch.Tensor, chunk_len: int = 512) -> torch.Tensor:
    """Per-token NLL `(N - 1,)` of `ids[1:]` from a recurrent model reading `ids` as one stream."""
    ids = ids.to(_device(model))
    losses, state = [], None
    for start in range(0, len(ids) - 1, chunk_len):
        inputs = ids[start : start + chunk_len]
        targets = ids[start + 1 : start + chunk_len + 1]
        inputs = inputs[: len(targets)]
        logits, state = model(inputs.unsqueeze(0), state)  # (1, T, V)
        losses.append(F.cross_entropy(logits[0].float(), targets, reduction="none"))
    return torch.cat(losses).cpu()


def window_spans(n_targets: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """`(start, first_scored, end)` per window over targets `1..n_targets` (inputs `start..end-1`).

    Windows hold `window` inputs (fewer only when the text is shorter) and end every `stride`
    targets; each scores the targets in `[first_scored, end]` (1-based target index == input end).
    """
    if not 0 < stride <= window:
        raise ValueError(f"stride={stride} must be between 1 and the window length {window}")
    spans, scored_up_to = [], 0
    end = min(window, n_targets)
    while scored_up_to < n_targets:
        spans.append((max(0, end - window), scored_up_to + 1, end))
        scored_up_to = end
        end = min(end + stride, n_targets)
    return spans


@torch.inference_mode()
def losses_sliding(model, ids: torch.Tensor, window: int, stride: int, batch_size: int = 8) -> torch.Tensor:
    """Per-token NLL `(N - 1,)` of `ids[1:]` from overlapping windows (stride == window: disjoint)."""
    ids = ids.to(_device(model))
    n_targets = len(ids) - 1
    spans = window_spans(n_targets, window, stride)
    losses = torch.empty(n_targets)
    by_length: dict[int, list] = {}
    for span in spans:  # equal-length windows batch together; only the last may be shorter
        by_length.setdefault(span[2] - span[0], []).append(span)
    for length, group in by_length.items():
        for i in range(0, len(group), batch_size):
            batch = group[i : i + batch_size]
            inputs = torch.stack([ids[s:e] for s, _, e in batch])  # (B, length)
            targets = torch.stack([ids[s + 1 : e + 1] for s, _, e in batch])
            logits, _ = model(inputs)
            nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
            nll = nll.view(len(batch), length).cpu()
            for row, (s, first, e) in enumerate(batch):
                losses[first - 1 : e] = nll[row, first - 1 - s : e - s]
    return losses


def token_losses(model, ids: torch.Tensor, policy: str, window: int | None = None, stride: int | None = None,
                 batch_size: int = 8, chunk_len: int = 512) -> torch.Tensor:
    """Per-token NLL of `ids[1:]` under a context policy: "carry", "sliding" or "disjoint"."""
    if policy == "carry":
        if not is_recurrent(model):
            raise ValueError(f"policy 'carry' needs a recurrent model, not {family_of(model)}; use 'sliding'")
        return losses_carry(model, ids, chunk_len)
    if policy not in ("sliding", "disjoint"):
        raise ValueError(f"unknown context policy {policy!r}; use 'carry', 'sliding' or 'disjoint'")
    window = window or model.config.block_size
    if not is_recurrent(model) and window > model.config.block_size:
        raise ValueError(f"window={window} exceeds the transformer's block_size={model.config.block_size}")
    stride = window if policy == "disjoint" else (stride or window // 2)
    return losses_sliding(model, ids, window, stride, batch_size)


def default_policy(model) -> str:
    return "carry" if is_recurrent(model) else "sliding"


def score_text(model, tokenizer, text: str, policy: str | None = None, **options) -> LMScore:
    """Total NLL of `text` (after a line-break context) under `policy` (default: carry / sliding)."""
    ids, n_chars = encode_for_scoring(tokenizer, text)
    losses = token_losses(model, ids, policy or default_policy(model), **options)
    return LMScore(float(losses.double().sum()), len(losses), n_chars)


@torch.inference_mode()
def position_curve(model, ids: torch.Tensor, length: int, max_windows: int | None = None,
                   batch_size: int = 8) -> tuple[torch.Tensor, int]:
    """Mean loss at each context position: disjoint windows of `length` tokens, each from an empty state.

    Returns `(curve, n_windows)` with curve `(length,)`: entry t is the mean NLL of the token
    predicted after seeing t + 1 tokens of its window.
    """
    ids = ids.to(_device(model))
    n_windows = (len(ids) - 1) // length
    if max_windows:
        n_windows = min(n_windows, max_windows)
    if n_windows < 1:
        raise ValueError(f"a text of {len(ids)} tokens is too short for one window of {length}")
    total = torch.zeros(length, dtype=torch.float64)
    for first in range(0, n_windows, batch_size):
        starts = range(first * length, min(first + batch_size, n_windows) * length, length)
        inputs = torch.stack([ids[s : s + length] for s in starts])  # (B, length)
        targets = torch.stack([ids[s + 1 : s + length + 1] for s in starts])
        logits, _ = model(inputs)
        nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")  # (B, length)
        total += nll.double().sum(dim=0).cpu()
    return (total / n_windows).float(), n_windows
