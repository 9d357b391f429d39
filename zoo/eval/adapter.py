"""A text-in/text-out interface that every zoo language model satisfies (lm-evaluation-harness's three methods).

- `loglikelihood([(context, continuation), ...])` -> `[(log p(continuation | context), is_greedy), ...]`
- `loglikelihood_rolling([text, ...])` -> `[log p(text), ...]` (after a line-break context)
- `generate_until([(context, {"until": [...], "max_gen_toks": n, ...}), ...])` -> `[text, ...]`

Log-probabilities are natural logs. The context and the continuation are tokenized separately
and joined, so a continuation is scored token for token as it is written. An empty context means
"after a line break" (see `zoo.eval.lm`). Context beyond the transformer's `block_size` is cut from
the left; recurrent models read everything.
"""

import torch
from torch.nn import functional as F

from zoo.eval.lm import boundary_id, is_recurrent, token_losses
from zoo.models import family_of, task_of


class ZooLMAdapter:
    """Scores and continues text with a zoo LM.

    Args:
        model: a causal LM (RNN, GRU or transformer) in eval mode.
        tokenizer: its tokenizer.
        batch_size: requests scored per forward (the results do not depend on it).
        stride: sliding-window stride of the transformer in `loglikelihood_rolling` (default: half the window).
        max_gen_toks: default number of tokens for `generate_until`.
    """

    def __init__(self, model, tokenizer, batch_size: int = 8, stride: int | None = None, max_gen_toks: int = 256):
        if task_of(family_of(model)) != "causal_lm":
            raise ValueError(f"{type(model).__name__} is a translation model; the adapter scores language models only")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.batch_size, self.stride, self.max_gen_toks = int(batch_size), stride, int(max_gen_toks)
        self.max_length = None if is_recurrent(model) else model.config.block_size

    @classmethod
    def from_pretrained(cls, name_or_path, device: str = "cpu", **options) -> "ZooLMAdapter":
        """An adapter for a registry name or a model folder (`zoo.load`)."""
        from zoo.hub import load

        pretrained = load(name_or_path, device=device)
        if pretrained.family == "seq2seq":
            raise ValueError(f"{name_or_path!r} is a translation model; the adapter scores language models only")
        return cls(pretrained.model, pretrained.tokenizer, **options)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], int]:
        context_ids = self.tokenizer.encode(context) if context else [boundary_id(self.tokenizer)]
        continuation_ids = self.tokenizer.encode(continuation)
        if not continuation_ids:
            raise ValueError(f"continuation {continuation!r} has no tokens; there is nothing to score")
        return context_ids + continuation_ids, len(continuation_ids)

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """`(sum of log-probs of the continuation, whether greedy decoding would produce it)` per request."""
        encoded = [self._encode_pair(context, continuation) for context, continuation in requests]
        results: list = [None] * len(encoded)
        # Longest first, so each batch pads little; results go back in request order.
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i][0]))
        for first in range(0, len(order), self.batch_size):
            batch = order[first : first + self.batch_size]
            for i, result in zip(batch, self._score_batch([encoded[i] for i in batch])):
                results[i] = result
        return results

    @torch.inference_mode()
    def _score_batch(self, batch) -> list[tuple[float, bool]]:
        rows = []
        for ids, n_continuation in batch:
            if self.max_length is not None and n_continuation > self.max_length:
                raise ValueError(
                    f"a continuation of {n_continuation} tokens exceeds the context of {self.max_length}; "
                    "use loglikelihood_rolling for long texts"
                )
            keep = len(ids) if self.max_length is None else min(len(ids), self.max_length + 1)
            rows.append((ids[-keep:], n_continuation))
        width = max(len(ids) for ids, _ in rows) - 1
        inputs = torch.zeros(len(rows), width, dtype=torch.long)  # right padding: causal, so never seen
        for row, (ids, _) in enumerate(rows):
            inputs[row, : len(ids) - 1] = torch.tensor(ids[:-1])
        logits, _ = self.model(inputs.to(self.device))
        log_probs = F.log_softmax(logits.float(), dim=-1).cpu()  # (B, width, V)
        results = []
        for row, (ids, n_continuation) in enumerate(rows):
            positions = torch.arange(len(ids) - 1 - n_continuation, len(ids) - 1)
            targets = torch.tensor(ids[-n_continuation:])
            scores = log_probs[row, positions]  # (n_continuation, V)
            logprob = float(scores.gather(1, targets.unsqueeze(1)).double().sum())
            results.append((logprob, bool((scores.argmax(dim=-1) == targets).all())))
        return results

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Log-probability of each whole text (every token scored; transformer: sliding windows)."""
        results = []
        for text in requests:
            text = text[0] if isinstance(text, tuple) else text
            ids = torch.tensor([boundary_id(self.tokenizer), *self.tokenizer.encode(text)])
            if len(ids) < 2:
                results.append(0.0)
                continue
            policy = "carry" if self.max_length is None else "sliding"
            losses = token_losses(self.model, ids, policy, stride=self.stride, batch_size=self.batch_size)
            results.append(-float(losses.double().sum()))
        return results

    def generate_until(self, requests) -> list[str]:
        """Greedy (or sampled, with `do_sample`) continuations, cut before the first `until` string."""
        from zoo.generation import generate

        outputs: list = [None] * len(requests)
        groups: dict = {}
        for i, (context, options) in enumerate(requests):
            options = dict(options or {})
            until = options.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            key = (tuple(until), int(options.get("max_gen_toks", self.max_gen_toks)),
                   float(options.get("temperature", 1.0)) if options.get("do_sample") else 0.0)
            groups.setdefault(key, []).append(i)
        for (until, max_new_tokens, temperature), members in groups.items():
            for first in range(0, len(members), self.batch_size):
                batch = members[first : first + self.batch_size]
                prompts = [requests[i][0] or "\n" for i in batch]
                texts = generate(self.model, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                 stop=list(until) or None, seed=0, tokenizer=self.tokenizer)
                for i, text in zip(batch, texts):
                    for stop in until:
                        text = text.split(stop)[0]
                    outputs[i] = text
        return outputs
