"""Text generation: one decoding loop for every causal language model in the zoo.

Every LM has `forward(tokens, state) -> (logits, state)`. The prompt goes through in one forward
(prefill), then one token per step, so a step costs O(1) for the RNN/GRU (the state is the hidden
tensor) and O(T) for the transformer (the state is a preallocated `KVCache`).

Context beyond `block_size` (transformer only; recurrent models carry on forever): the cache holds
a contiguous run of the most recent tokens, with positions counted from the start of that run.
When the cache is full and a new token arrives, the last `block_size // 2` tokens (the new one
included) are re-encoded in one forward into the emptied cache, and decoding continues from there.
So the logits for token n are those of a plain forward over tokens `s..n-1`, where the window start
`s` jumps to `n - block_size // 2` each time `n - s` would exceed `block_size`. A prompt longer than
`block_size` keeps only its last `block_size` tokens.

Sampling, per step: repetition penalty (CTRL, Keskar et al. 2019: a logit of a token already in the
prompt or output is divided by the penalty when positive, multiplied when negative), then
temperature (0 = greedy argmax), then top-k (exactly k tokens), then top-p (the smallest set of most
likely tokens whose probability reaches p), then one draw.

Threads: the loop runs on torch's intra-op thread setting, as any forward does. On a machine whose
cores are busy with other work (training, say), `torch.set_num_threads(1)` keeps a small model's
steps from waiting on a contended thread pool.

Stop strings: after each token the new text is searched for every stop string; at the first match
the row stops and its text ends right after the stop string (the stop string is included). The
returned text is the continuation only, without the prompt. LM tokenizers have no end-of-text token
(a word-level `<eos>` is a line break), so generation otherwise runs for `max_new_tokens`.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from zoo.models import Transformer, family_of, task_of


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float,
                   repetition_penalty: float, stop) -> None:
    """Raise a `ValueError` naming the bad option and its valid range."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a whole number >= 0")
    if not temperature >= 0:  # also catches NaN
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy, 1 = the model's distribution)")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k={top_k} must be >= 0 (0 or None keeps every token)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1] (1 keeps every token)")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty={repetition_penalty} must be > 0 (1 = no penalty)")
    for text in stop or ():
        if not isinstance(text, str) or not text:
            raise ValueError(f"stop strings must be non-empty strings, got {text!r}; drop it from `stop`")


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL repetition penalty. logits `(B, V)`, seen `(B, V)` True for tokens already present."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def top_k_filter(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    """Keep exactly the `k` largest logits of each row `(B, V)` (ties broken by `topk`); the rest -inf."""
    if not k or k >= logits.shape[-1]:
        return logits
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, logits.topk(k, dim=-1).indices, True)
    return logits.masked_fill(~keep, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability reaches `p`."""
    if p >= 1.0:
        return logits
    sorted_probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)  # (B, V)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order, mass_before < p)
    return logits.masked_fill(~keep, float("-inf"))


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from logits `(B, V)`: argmax when `temperature == 0`, else a filtered draw. Returns `(B,)`."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)


class RecurrentDecoder:
    """Decoding state of an RNN/GRU LM: the hidden tensor, O(1) work per token.

    Padded rows are prefilled one by one, so padding never enters a row's state.
    """

    def __init__(self, model: nn.Module, prompt: torch.Tensor, pad_mask: torch.Tensor | None, max_new_tokens: int):
        self.model, self.prompt, self.pad_mask = model, prompt, pad_mask
        self.state = None

    def prefill(self) -> torch.Tensor:
        """Logits `(B, V)` for the token after each prompt."""
        if self.pad_mask is None:
            logits, self.state = self.model(self.prompt, None)
            return logits[:, -1]
        rows = [self.model(row[mask].unsqueeze(0), None) for row, mask in zip(self.prompt, self.pad_mask)]
        self.state = torch.cat([state for _, state in rows], dim=1)  # (n_layer, B, hidden_size)
        return torch.cat([logits[:, -1] for logits, _ in rows])

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed `(B,)` tokens; logits `(B, V)` for the next."""
        logits, self.state = self.model(tokens.unsqueeze(1), self.state)
        return logits[:, -1]


class TransformerDecoder:
    """Decoding state of the transformer: a preallocated `KVCache` plus the token history for sliding.

    With `use_cache=False` every step recomputes the whole window (O(T^2) per token): the reference
    the cache is measured against.
    """

    def __init__(self, model: Transformer, prompt: torch.Tensor, pad_mask: torch.Tensor | None,
                 max_new_tokens: int, use_cache: bool = True):
        B, P = prompt.shape
        self.model, self.use_cache = model, use_cache
        self.block_size = model.config.block_size
        self.window = max(1, self.block_size // 2)
        self.history = torch.empty(B, P + max_new_tokens, dtype=torch.long, device=prompt.device)
        self.history[:, :P] = prompt
        self.history_mask = None
        if pad_mask is not None:
            self.history_mask = torch.ones(B, P + max_new_tokens, dtype=torch.bool, device=prompt.device)
            self.history_mask[:, :P] = pad_mask
        self.length = P
        self.start = max(0, P - self.block_size)  # first token of the window the model sees
        max_len = min(self.block_size, P + max_new_tokens)
        self.cache = model.init_state(B, device=prompt.device, max_len=max_len) if use_cache else None

    def _forward_window(self) -> torch.Tensor:
        tokens = self.history[:, self.start : self.length]
        mask = None if self.history_mask is None else self.history_mask[:, self.start : self.length]
        if self.cache is not None:
            self.cache.length, self.cache.padded = 0, False
        logits, _ = self.model(tokens, self.cache, pad_mask=mask)
        return logits[:, -1]

    def prefill(self) -> torch.Tensor:
        """Logits `(B, V)` for the token after each prompt."""
        return self._forward_window()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed `(B,)` tokens; logits `(B, V)` for the next, sliding the window when the context is full."""
        self.history[:, self.length] = tokens
        self.length += 1
        if self.length - self.start > self.block_size:
            self.start = self.length - self.window
            return self._forward_window()
        if self.cache is None:
            return self._forward_window()
        logits, _ = self.model(tokens.unsqueeze(1), self.cache)
        return logits[:, -1]


def _left_pad(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(B, P)` ids left-padded with 0, and a `(B, P)` real-token mask (None when no row is padded)."""
    width = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, ids in enumerate(prompts):
        tokens[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[row, width - len(ids) :] = True
    return tokens.to(device), (None if bool(mask.all()) else mask.to(device))


@contextmanager
def intra_op_threads(n: int):
    """Run the block on `n` intra-op threads, then restore torch's setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def make_decoder(model: nn.Module, prompts: list[list[int]], max_new_tokens: int, use_cache: bool = True):
    """The decoding state for `model`: a `TransformerDecoder` or a `RecurrentDecoder`."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = next(model.parameters()).device
    tokens, pad_mask = _left_pad(prompts, device)
    if isinstance(model, Transformer):
        return TransformerDecoder(model, tokens, pad_mask, max_new_tokens, use_cache)
    return RecurrentDecoder(model, tokens, pad_mask, max_new_tokens)


@torch.inference_mode()
def generate_ids(model: nn.Module, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float = 1.0, repetition_penalty: float = 1.0,
                 seed: int | None = None, use_cache: bool = True) -> Iterator[torch.Tensor]:
    """The decoding loop on token ids: yields the `(B,)` next tokens of every row, step by step.

    Args:
        model: a causal LM in eval mode (`forward(tokens, state) -> (logits, state)`).
        prompts: B lists of token ids, each non-empty (rows may differ in length).
        max_new_tokens: how many tokens each row gets (stop iterating to end early).
        temperature, top_k, top_p, repetition_penalty: see the module docstring.
        seed: seeds the draws; the same seed gives the same sample.
        use_cache: False recomputes the transformer's whole window every step (for comparison).
    """
    check_sampling(max_new_tokens, temperature, top_k, top_p, repetition_penalty, None)
    decoder = make_decoder(model, prompts, max_new_tokens, use_cache)
    if max_new_tokens == 0:
        return
    generator = None
    if seed is not None and temperature > 0:
        generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    logits = decoder.prefill()
    seen = None  # (B, V) tokens present so far, for the repetition penalty
    if repetition_penalty != 1.0:
        seen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
        for row, ids in enumerate(prompts):
            seen[row, ids] = True
    for step in range(max_new_tokens):
        if seen is not None:
            logits = apply_repetition_penalty(logits, seen, repetition_penalty)
        tokens = sample_next(logits.float(), temperature, top_k, top_p, generator)
        yield tokens
        if step + 1 == max_new_tokens:
            return
        if seen is not None:
            seen.scatter_(1, tokens.unsqueeze(1), True)
        logits = decoder.step(tokens)


class TextRow:
    """The text of one generated row, for streaming and stop strings.

    Streamed pieces hold back trailing whitespace until more text follows, because some tokenizers
    rewrite it (a word tokenizer turns `"word "` + `<eos>` into `"word\\n"`).
    """

    def __init__(self, tokenizer, stop: list[str] | None):
        self.tokenizer, self.stop = tokenizer, list(stop or ())
        self.ids: list[int] = []
        self.text = ""
        self.emitted = ""
        self.done = False

    def add(self, token: int, decode: bool = True) -> None:
        """Append a token; with `decode`, refresh the text and check the stop strings."""
        if self.done:
            return
        self.ids.append(token)
        if decode:
            self.decode()

    def decode(self) -> None:
        previous, self.text = len(self.text), self.tokenizer.decode(self.ids)
        # A stop string can only end inside the new text: search from just before it.
        ends = [
            found + len(s)
            for s in self.stop
            if (found := self.text.find(s, max(0, previous - len(s) + 1))) >= 0
        ]
        if ends:
            self.text, self.done = self.text[: min(ends)], True

    def piece(self, final: bool = False) -> str:
        """The text not yet handed out (all of it when `final`, else up to trailing whitespace)."""
        ready = self.text if final or self.done else self.text.rstrip()
        if not ready.startswith(self.emitted) or len(ready) <= len(self.emitted):
            return ""
        piece, self.emitted = ready[len(self.emitted) :], ready
        return piece


def _resolve(model, tokenizer):
    """`(model, tokenizer)` from a `Pretrained`, a name or path, or a module with its tokenizer."""
    from zoo.hub import Pretrained, load

    if isinstance(model, (str, Path)):
        model = load(model)
    if isinstance(model, Pretrained):
        tokenizer = tokenizer or model.tokenizers.get("tokenizer")
        if model.family == "seq2seq" or tokenizer is None:
            raise ValueError(f"{model.name!r} is a translation model; use zoo.translate.translate(...) instead")
        return model.model, tokenizer
    if tokenizer is None:
        raise ValueError("a bare model needs its tokenizer: generate(model, prompt, tokenizer=...)")
    if task_of(family_of(model)) != "causal_lm":
        raise ValueError(f"{type(model).__name__} is a translation model; use zoo.translate.translate(...) instead")
    return model, tokenizer


def _encode_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    encoded = []
    for text in prompts:
        ids = tokenizer.encode(text) if text else []
        if not ids:
            bos = getattr(tokenizer, "bos_id", None)
            if bos is None:
                raise ValueError(
                    f"prompt {text!r} has no tokens and this model has no beginning-of-text token; give it "
                    f"some text to continue, e.g. prompt='\\n' (a line break)"
                )
            ids = [bos]
        encoded.append(ids)
    return encoded


def _rows(model, prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed,
          tokenizer, incremental: bool) -> Iterator[tuple[list[TextRow], bool]]:
    """Run the loop on text: yields `(rows, False)` after every step (rows decoded when
    `incremental` or stopping on strings), then `(rows, True)`, all decoded, at the end."""
    if isinstance(stop, str):
        stop = [stop]
    check_sampling(max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop)
    model, tokenizer = _resolve(model, tokenizer)
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    rows = [TextRow(tokenizer, stop) for _ in prompts]
    decode = incremental or bool(stop)
    if prompts:
        steps = generate_ids(model, _encode_prompts(tokenizer, prompts), max_new_tokens, temperature, top_k,
                             top_p, repetition_penalty, seed)
        for tokens in steps:
            for row, token in zip(rows, tokens.tolist()):
                row.add(token, decode)
            yield rows, False
            if all(row.done for row in rows):
                steps.close()
                break
    for row in rows:
        if not row.done:
            row.decode()
    yield rows, True


def stream(model, prompt: str | list[str] = "", max_new_tokens: int = 200, temperature: float = 1.0,
           top_k: int | None = None, top_p: float = 1.0, repetition_penalty: float = 1.0,
           stop: list[str] | None = None, seed: int | None = None, tokenizer=None) -> Iterator:
    """Like `generate`, but yields text pieces as they are produced.

    Yields `str` pieces for one prompt (joined, they give `generate`'s text) and, for a list of
    prompts, one list of pieces per step (one per row, "" when a row has nothing new).
    """
    single = isinstance(prompt, str)
    steps = _rows(model, prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed,
                  tokenizer, incremental=True)
    for rows, final in steps:
        pieces = [row.piece(final) for row in rows]
        if not single:
            yield pieces
        elif pieces[0]:
            yield pieces[0]


_stream = stream  # `generate`'s `stream` flag hides the function


def generate(model, prompt: str | list[str] = "", max_new_tokens: int = 200, temperature: float = 1.0,
             top_k: int | None = None, top_p: float = 1.0, repetition_penalty: float = 1.0,
             stop: list[str] | None = None, seed: int | None = None, stream: bool = False, tokenizer=None):
    """Continue a prompt (or a batch of prompts) with a causal language model.

    Args:
        model: a `zoo.load(...)` result, a model name or folder, or a bare LM (then pass `tokenizer`).
        prompt: the text to continue, or a list of texts (a batch; lengths may differ). An empty
            prompt needs a model whose tokenizer has a beginning-of-text token.
        max_new_tokens: tokens to generate per prompt.
        temperature: 0 = greedy; higher = more random.
        top_k: sample only among the k most likely tokens (0 or None: all).
        top_p: sample only among the smallest set of tokens whose probability reaches p (1: all).
        repetition_penalty: > 1 discourages tokens already present (CTRL-style).
        stop: strings that end generation; the text is cut right after the first one found.
        seed: makes sampling reproducible.
        stream: return an iterator of text pieces instead (see `stream`).
        tokenizer: the tokenizer, when `model` is a bare module.

    Returns:
        The generated continuation (without the prompt): a `str`, or a list for a list of prompts.
    """
    args = (model, prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed, tokenizer)
    if stream:
        return _stream(*args)
    for rows, _ in _rows(*args, incremental=False):
        pass
    texts = [row.text for row in rows]
    return texts[0] if isinstance(prompt, str) else texts


def generate_command(model: str, prompt: str = "\n", max_new_tokens: int = 500, temperature: float = 0.8,
                     top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                     stop: list[str] | str | None = None, seed: int | None = None) -> None:
    """Continue a prompt with a language model, streaming the text to the terminal.

    Args:
        model: model name (see 'zoo list') or model folder.
        prompt: the text to continue (default: a line break).
        max_new_tokens: tokens to generate.
        temperature: 0 = greedy; higher = more random.
        top_k: sample among the k most likely tokens only (0 = all).
        top_p: sample among the smallest set of tokens whose probability reaches p (1 = all).
        repetition_penalty: > 1 discourages repeating tokens already present.
        stop: a string that ends generation, or a list of them (`--stop '["\\n\\n", "THE END"]'`).
        seed: makes sampling reproducible.
    """
    import sys

    from zoo.hub import load

    try:
        loaded = load(model)
        pieces = stream(loaded, prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed)
        first = next(pieces, "")
        sys.stdout.write(prompt)
        word_level = getattr(loaded.tokenizer, "kind", None) == "word"
        if word_level and first and prompt and not prompt[-1].isspace() and not first[0].isspace():
            sys.stdout.write(" ")  # word tokenizers do not keep the space between prompt and continuation
        sys.stdout.write(first)
        sys.stdout.flush()
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    except (ValueError, FileNotFoundError, KeyError) as error:
        raise SystemExit(f"zoo generate: {error}") from None
    sys.stdout.write("\n")


def bench_command(benchmark: str, plot: str | None = None, repeats: int = 3) -> None:
    """Run a speed benchmark from the repository's `benchmarks/` folder, e.g. `zoo bench generate`.

    Args:
        benchmark: the benchmark's name ("generate": decoding speed, cached vs uncached vs Hugging Face).
        plot: write its plot (PNG) to this path.
        repeats: timed runs per measurement.
    """
    import importlib.util

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    path = folder / f"{benchmark}.py"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.py")) if folder.is_dir() else []
        raise SystemExit(f"zoo bench: no benchmark {benchmark!r} in {folder} (known: {', '.join(known) or 'none'}; "
                         f"benchmarks ship with the source checkout, not the installed package)")
    spec = importlib.util.spec_from_file_location(f"benchmarks.{benchmark}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.run(plot, repeats)
