"""Translation with the Seq2Seq models: batched greedy decoding and beam search.

The source sentence is read once (`encode`), then the decoder runs one `decode_step` per target
token for every row (sentences x beams) at once. Source ids are `source.encode(s) + [eos]`; the
target starts from `bos` and a hypothesis ends when it emits `eos` (as in training, see
`zoo.data.TranslationDataModule`).

Beam search keeps `beam_size` live hypotheses per sentence, ranked by total log-probability. Each
step considers the best `2 * beam_size` continuations: those ending in `eos` among the first
`beam_size` become finished hypotheses, the best `beam_size` others stay live. A sentence is done
when it has `beam_size` finished hypotheses or reaches its length limit (then its live hypotheses
join, marked unfinished). Finished hypotheses are ranked by the length-normalised score
`log_prob / lp(length)`, with `length` counting `eos`, and

    simple:  lp = length ** alpha                    (alpha = `length_penalty`; 0 = raw log-prob)
    gnmt:    lp = ((5 + length) / 6) ** alpha        (Wu et al., 2016)

With `beam_size=1` beam search reduces to greedy decoding.
"""

import dataclasses
import sys
from pathlib import Path

import torch

from zoo.models import Seq2Seq

LENGTH_NORMS = ("simple", "gnmt")


@dataclasses.dataclass
class Hypothesis:
    """One translation.

    Attributes:
        text: the decoded target sentence.
        tokens: target ids, without `bos` and `eos`.
        log_prob: total log-probability of the tokens (and of `eos` when finished).
        score: `log_prob` normalised for length; hypotheses are ranked by it.
        finished: whether it ended with `eos` (False when cut at the length limit).
        attention: `(target steps, source tokens)` attention weights, one row per generated token
            (`eos` included), over the real source tokens only; None unless asked for.
    """

    text: str
    tokens: list[int]
    log_prob: float
    score: float
    finished: bool
    attention: torch.Tensor | None = None


def length_normalise(log_prob: float, length: int, alpha: float, norm: str = "simple") -> float:
    """`log_prob / lp(length)` with `lp` the simple (`length ** alpha`) or GNMT penalty."""
    penalty = length**alpha if norm == "simple" else ((5 + length) / 6) ** alpha
    return log_prob / penalty


def check_options(beam_size: int, n_best: int, length_penalty: float, length_norm: str, max_length: int | None,
                  batch_size: int) -> None:
    """Raise a `ValueError` naming the bad option and its valid range."""
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size={beam_size!r} must be a whole number >= 1 (1 = greedy)")
    if not isinstance(n_best, int) or not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best={n_best!r} must be between 1 and beam_size={beam_size}; raise beam_size for more")
    if not length_penalty >= 0:
        raise ValueError(f"length_penalty={length_penalty} must be >= 0 (0 = no length normalisation)")
    if length_norm not in LENGTH_NORMS:
        raise ValueError(f"length_norm={length_norm!r}; use one of {LENGTH_NORMS}")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"max_length={max_length!r} must be a whole number >= 1 (or None: 2 * source length + 10)")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a whole number >= 1")


def _encode(model: Seq2Seq, src: torch.Tensor, src_lengths: torch.Tensor, copies: int):
    """Encoder outputs with every row repeated `copies` times (one per beam)."""
    encoder_states, src_mask, state = model.encode(src, src_lengths)
    projected_keys = model.project_keys(encoder_states)
    if copies > 1:
        encoder_states, src_mask, state = (
            t.repeat_interleave(copies, dim=0) for t in (encoder_states, src_mask, state)
        )
        if projected_keys is not None:
            projected_keys = projected_keys.repeat_interleave(copies, dim=0)
    return encoder_states, src_mask, state, projected_keys


@torch.inference_mode()
def greedy_search(model: Seq2Seq, src: torch.Tensor, src_lengths: torch.Tensor, bos_id: int, eos_id: int,
                  max_lengths: torch.Tensor, return_attention: bool = False) -> list[dict]:
    """Greedy decoding of a batch; sentences leave the batch as they finish.

    Args:
        src: `(B, S)` right-padded source ids; src_lengths: `(B,)`.
        max_lengths: `(B,)` the most target tokens (`eos` included) per sentence.

    Returns:
        One dict per sentence: tokens, log_prob, length (steps, `eos` included), finished, attention
        (`(length, real source tokens)` or None).
    """
    B, device = src.shape[0], src.device
    encoder_states, src_mask, state, projected_keys = _encode(model, src, src_lengths, 1)
    steps, max_lengths = int(max_lengths.max()), max_lengths.to(device)
    tokens = torch.zeros(B, steps, dtype=torch.long, device=device)
    attention = torch.zeros(B, steps, encoder_states.shape[1], device=device) if return_attention else None
    log_prob, lengths = torch.zeros(B, device=device), torch.zeros(B, dtype=torch.long, device=device)
    ended = torch.zeros(B, dtype=torch.bool, device=device)  # finished with eos
    alive = torch.arange(B, device=device)  # the sentences still decoding, in batch order
    prev = torch.full((B,), bos_id, dtype=torch.long, device=device)
    for t in range(steps):
        logits, state, weights = model.decode_step(prev, encoder_states, src_mask, state, projected_keys)
        prev = logits.argmax(dim=-1)
        tokens[alive, t] = prev
        if attention is not None:
            attention[alive, t] = weights
        log_prob[alive] += torch.log_softmax(logits.float(), dim=-1).gather(1, prev.unsqueeze(1)).squeeze(1)
        lengths[alive] += 1
        is_eos = prev == eos_id
        ended[alive[is_eos]] = True
        live = ~is_eos & (t + 1 < max_lengths[alive])
        if not bool(live.any()):
            break
        if not bool(live.all()):  # drop finished sentences so later steps cost less
            alive, prev, state = alive[live], prev[live], state[live]
            encoder_states, src_mask = encoder_states[live], src_mask[live]
            projected_keys = None if projected_keys is None else projected_keys[live]
    return [_greedy_result(row, tokens, lengths, ended, log_prob, attention, src_lengths) for row in range(B)]


def _greedy_result(row: int, tokens, lengths, ended, log_prob, attention, src_lengths) -> dict:
    n = int(lengths[row])
    ids = tokens[row, : n - 1 if ended[row] else n].tolist()
    attn = attention[row, :n, : int(src_lengths[row])].cpu() if attention is not None else None
    return {"tokens": ids, "log_prob": float(log_prob[row]), "length": n, "finished": bool(ended[row]),
            "attention": attn}


class _Beams:
    """The live beams of a batch (`B * K` rows, sentence-major) and each sentence's finished hypotheses."""

    def __init__(self, batch_size: int, beam_size: int, src_lengths: torch.Tensor, alpha: float, norm: str,
                 steps: int, attention_shape: tuple | None, device):
        B, K = batch_size, beam_size
        self.K, self.src_lengths, self.alpha, self.norm = K, src_lengths.tolist(), alpha, norm
        self.finished: list[list[dict]] = [[] for _ in range(B)]
        self.done = [False] * B
        self.history = torch.zeros(B * K, steps, dtype=torch.long, device=device)  # tokens of each live beam
        self.attention = torch.zeros(B * K, *attention_shape, device=device) if attention_shape else None
        self.scores = torch.full((B, K), float("-inf"), device=device)
        self.scores[:, 0] = 0.0  # all beams start identical: expand only the first
        self.base = torch.arange(B, device=device).unsqueeze(1) * K  # (B, 1) first row of each sentence

    def add(self, row: int, source: int, t: int, log_prob: float, finished: bool, weights=None) -> None:
        """Record a hypothesis of sentence `row` continuing beam `source` (with `eos` at step t if finished)."""
        length = t + 1
        tokens = self.history[source, : t + (not finished)].tolist()
        attention = None
        if self.attention is not None:
            steps = self.attention[source, : t + (not finished)]
            attention = torch.cat([steps, weights[source : source + 1]]) if finished else steps
            attention = attention[:, : self.src_lengths[row]].cpu()
        score = length_normalise(log_prob, length, self.alpha, self.norm)
        self.finished[row].append({"tokens": tokens, "log_prob": log_prob, "length": length, "finished": finished,
                                   "score": score, "attention": attention})
        if len(self.finished[row]) >= self.K:
            self.done[row] = True

    def advance(self, t: int, log_probs: torch.Tensor, weights, eos_id: int, ending: list[int]) -> torch.Tensor:
        """Extend the beams by step t's log_probs `(B * K, V)`; returns which old row each new beam continues."""
        B, K, V = self.scores.shape[0], self.K, log_probs.shape[1]
        candidates = (self.scores.unsqueeze(2) + log_probs.view(B, K, V)).view(B, K * V)
        top_scores, top_index = candidates.topk(min(2 * K, K * V), dim=1)  # (B, 2K)
        origin, token = top_index // V, top_index % V
        is_eos = token == eos_id
        for row, j in (is_eos[:, :K] & top_scores[:, :K].isfinite()).nonzero().tolist():
            if not self.done[row]:
                self.add(row, int(self.base[row, 0] + origin[row, j]), t, float(top_scores[row, j]), True, weights)
        # The best K continuations that do not end here (there are at least K: eos is one token per beam).
        order = torch.arange(top_index.shape[1], device=top_index.device)
        keep = (is_eos.long() * top_index.shape[1] + order).argsort(dim=1)[:, :K]
        self.scores = top_scores.gather(1, keep)
        rows = (self.base + origin.gather(1, keep)).view(-1)  # (B * K,)
        self.history = self.history[rows]
        self.history[:, t] = token.gather(1, keep).view(-1)
        if self.attention is not None:
            self.attention = self.attention[rows]
            self.attention[:, t] = weights[rows]
        for row in ending:  # at the length limit the live beams join as they stand (even if eos filled it)
            for k in range(K):
                if self.scores[row, k].isfinite():
                    self.add(row, row * K + k, t, float(self.scores[row, k]), False)
            self.done[row] = True
        return rows

    def best(self, n_best: int) -> list[list[dict]]:
        return [sorted(hyps, key=lambda h: -h["score"])[:n_best] for hyps in self.finished]


@torch.inference_mode()
def beam_search(model: Seq2Seq, src: torch.Tensor, src_lengths: torch.Tensor, bos_id: int, eos_id: int,
                max_lengths: torch.Tensor, beam_size: int = 5, length_penalty: float = 1.0,
                length_norm: str = "simple", n_best: int = 1, return_attention: bool = False) -> list[list[dict]]:
    """Beam search over a batch, all `B * beam_size` hypotheses decoded together.

    Args:
        src: `(B, S)` right-padded source ids; src_lengths: `(B,)`.
        max_lengths: `(B,)` the most target tokens (`eos` included) per sentence.
        beam_size, length_penalty, length_norm, n_best: see the module docstring.

    Returns:
        For each sentence, its `n_best` hypotheses as dicts (tokens, log_prob, length, finished,
        score, attention), best score first.
    """
    B, K = src.shape[0], beam_size
    encoder_states, src_mask, state, projected_keys = _encode(model, src, src_lengths, K)
    steps, max_lengths = int(max_lengths.max()), max_lengths.cpu()
    attention_shape = (steps, encoder_states.shape[1]) if return_attention else None
    beams = _Beams(B, K, src_lengths, length_penalty, length_norm, steps, attention_shape, src.device)
    prev = torch.full((B * K,), bos_id, dtype=torch.long, device=src.device)
    for t in range(steps):
        logits, state, weights = model.decode_step(prev, encoder_states, src_mask, state, projected_keys)
        ending = [row for row in (max_lengths == t + 1).nonzero().flatten().tolist() if not beams.done[row]]
        rows = beams.advance(t, torch.log_softmax(logits.float(), dim=-1), weights, eos_id, ending)
        prev, state = beams.history[:, t], state[rows]
        if all(beams.done):
            break
    return beams.best(n_best)


def _resolve(model):
    """`(model, source_tokenizer, target_tokenizer)` from a `Pretrained` or a model name or folder."""
    from zoo.hub import Pretrained, load

    if isinstance(model, (str, Path)):
        model = load(model)
    if not isinstance(model, Pretrained):
        raise TypeError(f"translate needs zoo.load(...) output or a model name/folder, got {type(model).__name__}")
    if model.family != "seq2seq":
        raise ValueError(f"{model.name!r} is a language model, not a translator; use zoo.generate(...) instead")
    return model.model, model.tokenizers["source"], model.tokenizers["target"]


def _batch(source_tok, sentences: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    """`(B, S)` right-padded source ids (each sentence + eos) and `(B,)` lengths."""
    ids = [source_tok.encode(s) + [source_tok.eos_id] for s in sentences]
    lengths = torch.tensor([len(i) for i in ids])
    src = torch.full((len(ids), int(lengths.max())), source_tok.pad_id, dtype=torch.long)
    for row, row_ids in enumerate(ids):
        src[row, : len(row_ids)] = torch.tensor(row_ids)
    return src.to(device), lengths


def translate(model, sentences: str | list[str], beam_size: int = 1, length_penalty: float = 1.0,
              length_norm: str = "simple", max_length: int | None = None, n_best: int = 1,
              return_attention: bool = False, batch_size: int = 64):
    """Translate one sentence or a list of them, in batches of similar length.

    Args:
        model: `zoo.load(...)` output of a translator, or its name or folder.
        sentences: a source sentence or a list of them.
        beam_size: 1 = greedy decoding (fastest); more = beam search.
        length_penalty: alpha of the length normalisation (see the module docstring).
        length_norm: "simple" (`length ** alpha`) or "gnmt" (`((5 + length) / 6) ** alpha`).
        max_length: the most target tokens per sentence, `eos` included (None: 2 * source length + 10).
        n_best: how many hypotheses to return per sentence (at most `beam_size`).
        return_attention: include each hypothesis' attention matrix (target x source).
        batch_size: sentences decoded together.

    Returns:
        With `n_best=1` and no attention: the translation (`str`, or a list of them). Otherwise a
        list of `Hypothesis` (best first) per sentence: a `list[Hypothesis]` for one sentence, a
        list of those for a list.
    """
    check_options(beam_size, n_best, length_penalty, length_norm, max_length, batch_size)
    model, source_tok, target_tok = _resolve(model)
    if return_attention and model.attention is None:
        raise ValueError("this translator has no attention (a fixed-context seq2seq); use return_attention=False")
    single = isinstance(sentences, str)
    sentences = [sentences] if single else list(sentences)
    device = next(model.parameters()).device
    # Batches of similar source length waste little on padding; results go back in input order.
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]), reverse=True)
    results: list = [None] * len(sentences)
    for begin in range(0, len(order), batch_size):
        chunk = order[begin : begin + batch_size]
        src, lengths = _batch(source_tok, [sentences[i] for i in chunk], device)
        limits = torch.full_like(lengths, max_length) if max_length else 2 * lengths + 10
        if beam_size == 1:
            found = [[h] for h in greedy_search(model, src, lengths, target_tok.bos_id, target_tok.eos_id, limits,
                                                return_attention)]
        else:
            found = beam_search(model, src, lengths, target_tok.bos_id, target_tok.eos_id, limits, beam_size,
                                length_penalty, length_norm, n_best, return_attention)
        for index, hyps in zip(chunk, found):
            results[index] = [_hypothesis(h, target_tok, length_penalty, length_norm) for h in hyps]
    if n_best == 1 and not return_attention:
        results = [hyps[0].text for hyps in results]
    return results[0] if single else results


def _hypothesis(found: dict, target_tok, alpha: float, norm: str) -> Hypothesis:
    score = found.get("score")
    if score is None:
        score = length_normalise(found["log_prob"], found["length"], alpha, norm)
    return Hypothesis(target_tok.decode(found["tokens"]), found["tokens"], found["log_prob"], score,
                      found["finished"], found["attention"])


def _sentence_as_flag(args: list[str]) -> list[str]:
    """Let the sentence follow the model positionally (`zoo translate MODEL "Ein Mann ."`): it
    becomes `--text`, since jsonargparse positionals cannot be optional."""
    args, positionals, i = list(args), [], 0
    while i < len(args):
        if args[i].startswith("-") and args[i] not in ("-", "--"):
            i += 1 if "=" in args[i] or args[i] in ("-h", "--help") else 2
            continue
        positionals.append(i)
        i += 1
    if len(positionals) >= 2:
        args.insert(positionals[1], "--text")
    return args


def translate_command(model: str, text: str | None = None, input: str | None = None, beam_size: int = 1,
                      length_penalty: float = 1.0, length_norm: str = "simple", max_length: int | None = None,
                      n_best: int = 1, batch_size: int = 64) -> None:
    """Translate a sentence, or every line of a file, with a pretrained translator.

    `zoo translate MODEL "Ein Mann fährt Fahrrad."` or `zoo translate MODEL --input sentences.txt`.

    Prints one translation per line; with n_best > 1, `rank<TAB>score<TAB>text` lines and a blank
    line after each sentence.

    Args:
        model: model name (see 'zoo list') or model folder.
        text: the sentence to translate (may also follow MODEL directly).
        input: a text file with one sentence per line (instead of `text`).
        beam_size: 1 = greedy; more = beam search.
        length_penalty: alpha of the length normalisation.
        length_norm: "simple" (length ** alpha) or "gnmt".
        max_length: the most target tokens per sentence (default: 2 * source length + 10).
        n_best: hypotheses to print per sentence (at most beam_size).
        batch_size: sentences decoded together.
    """
    if (text is None) == (input is None):
        raise SystemExit("zoo translate: give a sentence or --input FILE (one of them)")
    if input is not None and not Path(input).is_file():
        raise SystemExit(f"zoo translate: no file {input!r}")
    sentences = [text] if text is not None else Path(input).read_text(encoding="utf-8").splitlines()
    try:
        results = translate(model, sentences, beam_size, length_penalty, length_norm, max_length, n_best,
                            batch_size=batch_size)
    except (ValueError, TypeError, FileNotFoundError, KeyError) as error:
        raise SystemExit(f"zoo translate: {error}") from None
    for result in results:
        if n_best == 1:
            print(result)
            continue
        for rank, hyp in enumerate(result, 1):
            print(f"{rank}\t{hyp.score:.4f}\t{hyp.text}")
        print()
    sys.stdout.flush()


translate_command.prepare_args = _sentence_as_flag
