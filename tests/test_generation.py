"""The decoding loop: cached decoding equals full recompute, sliding window, sampling filters, text API, CLI."""

from pathlib import Path

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.generation import (
    TransformerDecoder,
    apply_repetition_penalty,
    generate,
    generate_ids,
    intra_op_threads,
    sample_next,
    stream,
    top_k_filter,
    top_p_filter,
)
from zoo.hub import save_pretrained
from zoo.models import Transformer, TransformerConfig, build_model
from zoo.tokenizers import CharTokenizer, UnknownSymbolError, WordTokenizer

TOLERANCE = 1e-4  # max |cached - recomputed| logit difference in fp32
CHARS = "\n !,.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@pytest.fixture(autouse=True)
def one_thread():
    """The models here are tiny: one intra-op thread is fastest, and unaffected by a busy machine."""
    with intra_op_threads(1):
        yield


@pytest.fixture(scope="module")
def char_tokenizer():
    return CharTokenizer(sorted(CHARS))


def peaked_transformer(vocab_size: int, causal: bool = True, **overrides) -> Transformer:
    """A random transformer whose logits are spread far apart (embedding std 1), so greedy has no near-ties."""
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=vocab_size, block_size=512, n_layer=2, n_head=2, n_embd=32, dropout=0.0,
                               causal=causal)
    for name, value in overrides.items():
        setattr(config, name, value)
    model = Transformer(config)
    with torch.no_grad():
        model.token_embedding.weight.mul_(50.0)  # tied with the head
    return model.eval()


@torch.no_grad()
def recompute_greedy(model, prompt: list[int], n: int, window=None):
    """Greedy decoding by a full forward over the context each step; returns tokens and each step's logits.

    `window(start, length) -> start` applies a context rule; by default the whole sequence is seen.
    """
    tokens, logits_seen, start = list(prompt), [], 0
    for _ in range(n):
        if window is not None:
            start = window(start, len(tokens))
        logits, _ = model(torch.tensor([tokens[start:]]))
        logits_seen.append(logits[0, -1])
        tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(prompt) :], torch.stack(logits_seen)


@torch.no_grad()
def cached_logits(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The cache's logits when fed `tokens` after `prompt`: `(len(tokens), V)`."""
    decoder = TransformerDecoder(model, torch.tensor([prompt]), None, len(tokens))
    steps = [decoder.prefill()[0]]
    for token in tokens[:-1]:
        steps.append(decoder.step(torch.tensor([token]))[0])
    return torch.stack(steps)


def top2_margin(logits: torch.Tensor) -> float:
    top = logits.topk(2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min())


@pytest.mark.parametrize("prompt", [[5], [3, 1, 4, 1, 5, 9, 2, 6], list(range(10, 40))])
def test_cached_greedy_equals_full_recompute(char_tokenizer, prompt):
    model = peaked_transformer(char_tokenizer.vocab_size)
    n = 220
    expected, expected_logits = recompute_greedy(model, prompt, n)
    # Ties are impossible: the recomputed winner leads by far more than the tolerance at every step.
    assert top2_margin(expected_logits) > 20 * TOLERANCE
    cached = [int(t) for t in generate_ids(model, [prompt], n, temperature=0.0)]
    assert cached == expected
    assert (cached_logits(model, prompt, expected) - expected_logits).abs().max() < TOLERANCE
    uncached = [int(t) for t in generate_ids(model, [prompt], n, temperature=0.0, use_cache=False)]
    assert uncached == expected


def test_dropping_the_causal_mask_breaks_cache_equality(char_tokenizer):
    prompt, tokens = [3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    sequence = torch.tensor([prompt + tokens])
    for causal, equal in ((True, True), (False, False)):
        model = peaked_transformer(char_tokenizer.vocab_size, causal=causal)
        with torch.no_grad():
            full = model(sequence)[0][0, len(prompt) - 1 : -1]  # the logits that predict `tokens`
        difference = (cached_logits(model, prompt, tokens) - full).abs().max()
        # Without the mask, earlier positions see later tokens in a full forward, which a cache cannot redo.
        assert bool(difference < TOLERANCE) is equal, f"causal={causal}: max difference {difference:.2e}"


def test_batch_with_left_padding_equals_one_prompt_at_a_time(char_tokenizer):
    prompts = [[7], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [2, 7, 1, 8]]
    torch.manual_seed(0)
    gru = build_model("gru_lm_tiny", vocab_size=61).eval()
    with torch.no_grad():
        gru.head.weight.mul_(30.0)  # peaked logits: no near-ties for batch-size rounding to flip
    for model in (peaked_transformer(char_tokenizer.vocab_size), gru):
        batch = torch.stack(list(generate_ids(model, prompts, 40, temperature=0.0)), dim=1)
        for row, prompt in enumerate(prompts):
            single = torch.stack(list(generate_ids(model, [prompt], 40, temperature=0.0)), dim=1)
            assert batch[row].tolist() == single[0].tolist(), type(model).__name__


def test_sliding_window_beyond_the_context(char_tokenizer):
    block = 32
    model = peaked_transformer(char_tokenizer.vocab_size, block_size=block)

    def documented_window(start: int, length: int) -> int:
        # Full cache + new token: keep the last block // 2 tokens (new one included).
        if length - start > block:
            return length - block // 2
        return start

    for prompt in ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], list(range(5, 50))):  # the second exceeds the context
        start = max(0, len(prompt) - block)
        expected, logits = recompute_greedy(model, prompt, 100, lambda s, n: documented_window(max(s, start), n))
        assert top2_margin(logits) > 20 * TOLERANCE
        assert [int(t) for t in generate_ids(model, [prompt], 100, temperature=0.0)] == expected
        assert (cached_logits(model, prompt, expected) - logits).abs().max() < TOLERANCE
        # The rule differs from a plain "last block_size tokens" crop, so the test can tell them apart.
        _, cropped = recompute_greedy(model, prompt, 100, lambda s, n: max(0, n - block))
        assert (cropped - logits).abs().max() > 100 * TOLERANCE


@pytest.mark.parametrize("name", ["gru_lm_tiny", "rnn_lm_tiny"])
def test_recurrent_generation_runs_past_any_length(name):
    torch.manual_seed(0)
    model = build_model(name, vocab_size=50).eval()
    with torch.no_grad():
        model.head.weight.mul_(30.0)
    prompt, n = [1, 2, 3], 600
    generated = [int(t) for t in generate_ids(model, [prompt], n, temperature=0.0)]
    with torch.no_grad():
        logits, _ = model(torch.tensor([prompt + generated]))  # one teacher-forced pass over everything
    predicted = logits[0, len(prompt) - 1 : -1]
    assert top2_margin(predicted) > 20 * TOLERANCE
    assert predicted.argmax(dim=-1).tolist() == generated


def test_same_seed_same_sample(char_tokenizer):
    model = build_model("transformer_tiny", vocab_size=char_tokenizer.vocab_size).eval()
    options = dict(max_new_tokens=80, temperature=1.0, top_k=20, top_p=0.95, tokenizer=char_tokenizer)
    first = generate(model, "KING:", seed=7, **options)
    assert generate(model, "KING:", seed=7, **options) == first
    assert generate(model, "KING:", seed=8, **options) != first
    assert len(first) == 80


def test_top_k_keeps_exactly_k_even_with_ties():
    logits = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0]])
    kept = top_k_filter(logits, 2)
    assert kept.isfinite().sum() == 2 and kept[0, 0] == 3.0
    assert top_k_filter(logits, 0).isfinite().all() and top_k_filter(logits, None).isfinite().all()


@pytest.mark.parametrize("p, kept", [(0.45, 1), (0.7, 2), (0.8, 3), (0.9, 4), (1.0, 4)])
def test_top_p_keeps_the_smallest_set_reaching_p(p, kept):
    probs = torch.tensor([[0.125, 0.5, 0.125, 0.25]])
    result = top_p_filter(probs.log(), p)
    assert int(result.isfinite().sum()) == kept
    order = [1, 3, 0, 2][:kept]  # most likely first
    assert result[0, order].isfinite().all()


def test_filtered_sampling_draws_from_the_renormalised_distribution():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = probs.log().repeat(20000, 1)
    generator = torch.Generator().manual_seed(0)
    draws = sample_next(logits, temperature=1.0, top_k=2, generator=generator)
    frequencies = torch.bincount(draws, minlength=4) / len(draws)
    assert frequencies[2:].sum() == 0
    assert abs(float(frequencies[0]) - 0.4 / 0.7) < 0.02
    assert sample_next(logits[:3], temperature=0.0).tolist() == [0, 0, 0]


def test_repetition_penalty_is_ctrl_style():
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    seen = torch.tensor([[True, True, False]])
    assert apply_repetition_penalty(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5]]


def test_stop_strings_end_generation_after_the_first_match(char_tokenizer):
    model = peaked_transformer(char_tokenizer.vocab_size)
    free = generate(model, "ROMEO:", 60, temperature=0.0, tokenizer=char_tokenizer)
    stop = free[20:22]
    end = free.find(stop) + len(stop)
    stopped = generate(model, "ROMEO:", 60, temperature=0.0, stop=[stop, "never-there"], tokenizer=char_tokenizer)
    assert stopped == free[:end]
    assert "".join(stream(model, "ROMEO:", 60, temperature=0.0, stop=[stop], tokenizer=char_tokenizer)) == stopped
    batch = generate(model, ["ROMEO:", "ROMEO:"], 60, temperature=0.0, stop=[stop], tokenizer=char_tokenizer)
    assert batch == [stopped, stopped]


def test_stream_yields_pieces_that_join_to_generate():
    words = WordTokenizer.train("the king is dead \n long live the queen \n")
    torch.manual_seed(1)
    model = build_model("gru_lm_tiny", vocab_size=words.vocab_size).eval()
    pieces = list(stream(model, "the king", 30, seed=3, tokenizer=words))
    assert len(pieces) > 3
    assert "".join(pieces) == generate(model, "the king", 30, seed=3, tokenizer=words)
    assert "".join(pieces) == generate(model, "the king", 30, seed=3, tokenizer=words, stream=False)
    rows = list(generate(model, ["the", "long live"], 10, seed=3, tokenizer=words, stream=True))
    assert all(len(step) == 2 for step in rows)


def test_bad_options_give_clear_errors(char_tokenizer):
    model = build_model("transformer_tiny", vocab_size=char_tokenizer.vocab_size).eval()
    cases = [
        (dict(temperature=-0.5), "temperature=-0.5"),
        (dict(top_p=0.0), "top_p=0.0"),
        (dict(top_p=1.5), "top_p=1.5"),
        (dict(top_k=-1), "top_k=-1"),
        (dict(max_new_tokens=-3), "max_new_tokens=-3"),
        (dict(stop=["ok", ""]), "stop strings"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[")):
            generate(model, "AB", tokenizer=char_tokenizer, **options)
    with pytest.raises(UnknownSymbolError, match="'é'"):
        generate(model, "café", tokenizer=char_tokenizer)
    with pytest.raises(ValueError, match=r"prompt='\\n'"):
        generate(model, "", tokenizer=char_tokenizer)
    translator = build_model("bahdanau_tiny", src_vocab_size=20, tgt_vocab_size=20)
    with pytest.raises(ValueError, match="zoo.translate"):
        generate(translator, "AB", tokenizer=char_tokenizer)
    assert generate(model, "AB", 0, tokenizer=char_tokenizer) == ""


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, char_tokenizer):
    folder = tmp_path_factory.mktemp("lm")
    save_pretrained(folder, peaked_transformer(char_tokenizer.vocab_size), {"tokenizer": char_tokenizer},
                    architecture="transformer_tiny")
    return folder


def test_generate_from_a_folder_or_a_loaded_model(model_folder):
    loaded = zoo.load(str(model_folder))
    text = zoo.generate(loaded, "ROMEO:", 30, temperature=0.0)
    assert zoo.generate(str(model_folder), "ROMEO:", 30, temperature=0.0) == text
    assert "".join(zoo.stream(loaded, "ROMEO:", 30, temperature=0.0)) == text
    assert len(text) == 30


def test_cli_streams_prompt_and_continuation(model_folder, capsys):
    main(["generate", str(model_folder), "--prompt", "ROMEO:", "--max_new_tokens", "25", "--temperature", "0"])
    out = capsys.readouterr().out
    assert out.rstrip("\n") == "ROMEO:" + zoo.generate(str(model_folder), "ROMEO:", 25, temperature=0.0).rstrip("\n")
    with pytest.raises(SystemExit, match="top_p=2.0"):
        main(["generate", str(model_folder), "--prompt", "A", "--top_p", "2"])
    with pytest.raises(SystemExit, match="outside this model's vocabulary"):
        main(["generate", str(model_folder), "--prompt", "ROMEO é"])


def test_cli_stops_quietly_when_its_reader_goes_away(model_folder):
    """`zoo generate ... | head -1`: the command ends without a traceback when the pipe closes."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write, whatever the timing
    command = [sys.executable, "-m", "zoo.cli", "generate", str(model_folder), "--prompt", "A\n",
               "--max_new_tokens", "50", "--temperature", "1", "--seed", "0"]
    try:
        process = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    stderr = process.stderr.decode()
    assert process.returncode == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr


def test_benchmark_runs_on_tiny_settings(tmp_path, capsys, monkeypatch):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "generate.py"
    spec = importlib.util.spec_from_file_location("bench_generate", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "DIMS", dict(vocab_size=11, block_size=128, n_layer=1, n_head=2, n_embd=16))
    monkeypatch.setattr(bench, "NEW_TOKENS", 4)
    monkeypatch.setattr(bench, "POSITIONS", (8, 16))
    monkeypatch.setattr(bench, "BATCHES", (1, 2))
    bench.run(str(tmp_path / "latency.png"), repeats=1)
    out = capsys.readouterr().out
    assert out.count("tokens/s") >= 4 and "uncached/cached" in out
    if importlib.util.find_spec("transformers") is not None:
        assert "zoo cached / HF generate at 1 thread(s)" in out
    assert (tmp_path / "latency.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no benchmark 'nope'"):
        main(["bench", "nope"])
