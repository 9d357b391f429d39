"""Translation metrics: sacreBLEU and chrF on detokenized, cased text, teacher-forced perplexity,
BLEU by source length (the fixed-context bottleneck), and attention alignments.

Hypotheses are the target tokenizer's decoded text (BPE with a Metaspace decoder: plain,
detokenized sentences); references are the raw reference lines. sacreBLEU runs with its defaults
(13a tokenization, mixed case, exponential smoothing), so `sacrebleu REF -i HYP -m bleu chrf` on
the written files gives the same numbers; each record carries the metric's signature.

Decoding uses `zoo.translate` (batched greedy and beam search).
"""

import math

import torch
from sacrebleu.metrics import BLEU, CHRF
from torch.nn import functional as F

from zoo.data import collate_pairs


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF with their sacreBLEU signatures.

    Returns:
        `{"bleu": float, "bleu_signature": str, "bleu_detail": str, "chrf": float, "chrf_signature": str}`.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references; they must pair up")
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": bleu_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "bleu_detail": str(bleu_score),
        "chrf": chrf_score.score,
        "chrf_signature": str(chrf.get_signature()),
    }


def bucket_labels(edges: list[int]) -> list[str]:
    """Labels of the source-length buckets cut at `edges` (inclusive upper bounds), e.g. `["1-8", "9-12", ">12"]`."""
    labels, low = [], 1
    for edge in edges:
        labels.append(f"{low}-{edge}")
        low = edge + 1
    return labels + [f">{edges[-1]}"]


def bucket_of(n_words: int, edges: list[int]) -> int:
    return next((i for i, edge in enumerate(edges) if n_words <= edge), len(edges))


def bleu_by_length(hypotheses: list[str], references: list[str], sources: list[str], edges: list[int]) -> dict:
    """Corpus BLEU within buckets of source length (whitespace words of the source sentence).

    Returns:
        `{"x": bucket labels, "y": BLEU per bucket (None for an empty one), "count": sentences per bucket}`.
    """
    if not edges or sorted(edges) != list(edges):
        raise ValueError(f"length bucket edges {edges} must be a non-empty increasing list")
    groups: list[list[int]] = [[] for _ in range(len(edges) + 1)]
    for i, source in enumerate(sources):
        groups[bucket_of(len(source.split()), edges)].append(i)
    scores = [
        BLEU().corpus_score([hypotheses[i] for i in group], [[references[i] for i in group]]).score if group else None
        for group in groups
    ]
    return {"x": bucket_labels(edges), "y": scores, "count": [len(g) for g in groups]}


@torch.inference_mode()
def teacher_forced_nll(model, source_tok, target_tok, sources: list[str], targets: list[str],
                       batch_size: int = 64) -> tuple[float, int]:
    """Summed NLL (nats) of the reference targets given the sources, reference prefix fed at each step.

    Every target token is scored, `eos` included, `bos` given. Returns `(total_nll, n_tokens)`.
    """
    device = next(model.parameters()).device
    pairs = [
        (source_tok.encode(s) + [source_tok.eos_id], [target_tok.bos_id] + target_tok.encode(t) + [target_tok.eos_id])
        for s, t in zip(sources, targets)
    ]
    total, count = 0.0, 0
    pad_id = model.config.pad_id
    for first in range(0, len(pairs), batch_size):
        src, src_lengths, tgt_in, tgt_out = collate_pairs(pairs[first : first + batch_size], pad_id)
        logits = model(src.to(device), src_lengths, tgt_in.to(device))  # (B, T, V)
        nll = F.cross_entropy(logits.float().flatten(0, 1), tgt_out.to(device).flatten(), ignore_index=pad_id,
                              reduction="sum")
        total += float(nll)
        count += int((tgt_out != pad_id).sum())
    return total, count


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Readable token strings of `ids` (BPE pieces with the word-start marker shown as '▁')."""
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is not None:
        return [inner.id_to_token(i) or f"<{i}>" for i in ids]
    tokens = getattr(tokenizer, "tokens", None)
    return [tokens[i] for i in ids] if tokens else [str(i) for i in ids]


def alignment_example(pretrained, sentence: str) -> dict:
    """Greedy translation of one sentence with its attention matrix and token labels.

    Returns:
        `{"source", "hypothesis", "source_tokens", "target_tokens", "attention"}`; attention is
        `(target tokens, source tokens)` as nested lists, `eos` on both sides included.
    """
    from zoo.translate import translate

    source_tok, target_tok = pretrained.tokenizers["source"], pretrained.tokenizers["target"]
    hyp = translate(pretrained, [sentence], beam_size=1, return_attention=True)[0][0]
    source_ids = source_tok.encode(sentence) + [source_tok.eos_id]
    target_ids = hyp.tokens + ([target_tok.eos_id] if hyp.finished else [])
    return {
        "source": sentence,
        "hypothesis": hyp.text,
        "source_tokens": token_pieces(source_tok, source_ids),
        "target_tokens": token_pieces(target_tok, target_ids),
        "attention": [[round(float(w), 5) for w in row] for row in hyp.attention],
    }


def decode_corpus(pretrained, sources: list[str], beam_size: int, batch_size: int, length_penalty: float,
                  max_length: int | None) -> list[str]:
    """Translations of `sources` with `zoo.translate` (greedy when `beam_size == 1`)."""
    from zoo.translate import translate

    return translate(pretrained, sources, beam_size=beam_size, length_penalty=length_penalty, max_length=max_length,
                     batch_size=batch_size)


def perplexity(total_nll: float, n_tokens: int) -> float:
    return math.exp(total_nll / n_tokens)
