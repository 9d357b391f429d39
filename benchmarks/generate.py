"""Decoding speed: zoo transformer with and without its KV cache, Hugging Face GPT-2, and the GRU.

Prints (1) tokens/s for greedy decoding of 256 new tokens after a 64-token prompt, batch 1 and 8,
for the zoo transformer with its KV cache, the same model recomputing its whole window each step,
and `transformers`' `GPT2LMHeadModel.generate(use_cache=True)` built with the same dimensions
(random weights, so only speed is compared), each library at torch's thread setting and at 1
thread; (2) the latency of one decoding step at position T (64 ... 1024) for the cached and
uncached transformer and the GRU LM, where the O(T), O(T^2) and O(1) shapes show.

    python benchmarks/generate.py [--plot latency.png] [--repeats 3]      (or: zoo bench generate)

Needs the `bench` extra (`pip install -e .[bench]`) for the Hugging Face baseline.
"""

import argparse
import io
import os
import statistics
import time

import torch

from zoo.generation import generate_ids, intra_op_threads
from zoo.io import atomic_write_bytes
from zoo.models import build_model

DIMS = {"vocab_size": 65, "block_size": 1280, "n_layer": 4, "n_head": 4, "n_embd": 256}
PROMPT_LEN, NEW_TOKENS, BATCHES = 64, 256, (1, 8)
POSITIONS = (64, 128, 256, 512, 1024)


def zoo_transformer() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("transformer_small", dropout=0.0, **DIMS).eval()


def hf_gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=DIMS["vocab_size"], n_positions=DIMS["block_size"], n_embd=DIMS["n_embd"],
        n_layer=DIMS["n_layer"], n_head=DIMS["n_head"], activation_function="gelu",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def zoo_decode(model, prompt: torch.Tensor, new_tokens: int, use_cache: bool = True) -> None:
    """Greedy decoding through the zoo's loop (`zoo.generation.generate_ids`)."""
    for _ in generate_ids(model, prompt.tolist(), new_tokens, temperature=0.0, use_cache=use_cache):
        pass


def hf_decode(model, prompt: torch.Tensor, new_tokens: int) -> None:
    """`generate(use_cache=True)`, greedy, exactly `new_tokens` tokens."""
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, use_cache=True)
    assert out.shape[1] == prompt.shape[1] + new_tokens


def on_threads(threads: int, decode):
    """`decode` run on `threads` intra-op threads."""
    def run(n: int) -> None:
        with intra_op_threads(threads):
            decode(n)
    return run


def engines(model, gpt2, prompt: torch.Tensor) -> dict:
    """name -> (threads, decode(new_tokens), timed runs wanted: 1 for the slow recompute, else all).

    Each library runs at torch's thread setting and, on a machine with more cores, at 1 thread too."""
    counts = sorted({torch.get_num_threads(), 1}, reverse=True)
    table = {}
    for threads in counts:
        table[f"zoo, KV cache, {threads} thread(s)"] = (
            threads, on_threads(threads, lambda n: zoo_decode(model, prompt, n)), None)
        if gpt2 is not None:
            table[f"HF generate, {threads} thread(s)"] = (
                threads, on_threads(threads, lambda n: hf_decode(gpt2, prompt, n)), None)
    table[f"zoo, no cache (recompute), {counts[0]} thread(s)"] = (
        counts[0], on_threads(counts[0], lambda n: zoo_decode(model, prompt, n, use_cache=False)), 1)
    return table


def throughput(repeats: int) -> list[tuple[str, int, float]]:
    """`(engine, batch, tokens/s)` rows: engines take turns, so a change in the machine's load hits
    them alike; each keeps its fastest run. Also prints zoo cached / HF at each thread count."""
    model, rows = zoo_transformer(), []
    try:
        gpt2 = hf_gpt2()
    except ImportError:
        gpt2 = None
        print("transformers is not installed (pip install -e .[bench]); skipping the Hugging Face baseline")
    for batch in BATCHES:
        prompt = torch.randint(0, DIMS["vocab_size"], (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
        table = engines(model, gpt2, prompt)
        for _, decode, _ in table.values():
            decode(8)  # warm-up
        best = {name: float("inf") for name in table}
        for round_ in range(repeats):
            for name, (_, decode, runs) in table.items():
                if runs is None or round_ < runs:
                    best[name] = min(best[name], timed_once(lambda: decode(NEW_TOKENS)))
        speed = {name: batch * NEW_TOKENS / seconds for name, seconds in best.items()}
        for name, tokens_per_second in speed.items():
            rows.append((name, batch, tokens_per_second))
            print(f"  batch {batch}  {name:<44} {tokens_per_second:9.1f} tokens/s", flush=True)
        for threads in sorted({threads for threads, _, _ in table.values()}):
            zoo_speed = speed.get(f"zoo, KV cache, {threads} thread(s)")
            hf_speed = speed.get(f"HF generate, {threads} thread(s)")
            if zoo_speed and hf_speed:
                print(f"  batch {batch}  zoo cached / HF generate at {threads} thread(s): {zoo_speed / hf_speed:.2f}x")
    return rows


def timed_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@torch.inference_mode()
def step_latency(model, T: int, use_cache: bool, repeats: int) -> float:
    """Median seconds of one decoding step at position T (T tokens already seen)."""
    tokens = torch.randint(0, DIMS["vocab_size"], (1, T + 1), generator=torch.Generator().manual_seed(T))
    if not use_cache:
        return statistics.median(timed_once(lambda: model(tokens)) for _ in range(repeats))
    cache = model.init_state(1, max_len=T + 1)
    model(tokens[:, :T], cache)

    def step():
        cache.length = T
        model(tokens[:, T:], cache)

    return statistics.median(timed_once(step) for _ in range(repeats))


@torch.inference_mode()
def gru_latency(model, T: int, repeats: int) -> float:
    tokens = torch.randint(0, DIMS["vocab_size"], (1, T + 1), generator=torch.Generator().manual_seed(T))
    _, state = model(tokens[:, :T])
    return statistics.median(timed_once(lambda: model(tokens[:, T:], state)) for _ in range(repeats))


def latency_table(repeats: int) -> list[tuple[int, float, float, float]]:
    """`(T, cached ms, uncached ms, GRU ms)` rows, at torch's thread setting."""
    transformer = zoo_transformer()
    torch.manual_seed(0)
    gru = build_model("gru_lm_small", vocab_size=DIMS["vocab_size"], dropout=0.0).eval()
    rows = []
    print(f"  ({torch.get_num_threads()} thread(s), batch 1)")
    print(f"  {'T':>5} {'cached ms':>10} {'uncached ms':>12} {'GRU ms':>8} {'uncached/cached':>16}")
    for T in POSITIONS:
        cached = step_latency(transformer, T, True, 10 * repeats) * 1e3
        uncached = step_latency(transformer, T, False, repeats) * 1e3
        recurrent = gru_latency(gru, T, 10 * repeats) * 1e3
        rows.append((T, cached, uncached, recurrent))
        print(f"  {T:>5} {cached:>10.3f} {uncached:>12.3f} {recurrent:>8.3f} {uncached / cached:>15.1f}x", flush=True)
    return rows


def plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    positions = [r[0] for r in rows]
    figure, axes = plt.subplots(figsize=(6, 4))
    labels = ("transformer, KV cache (O(T))", "transformer, recompute (O(T^2))", "GRU (O(1))")
    for column, label in enumerate(labels, 1):
        axes.plot(positions, [r[column] for r in rows], marker="o", label=label)
    axes.set(xscale="log", yscale="log", xlabel="position T", ylabel="ms per token", title="Per-token decoding latency")
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buffer.getvalue())
    print(f"plot written to {path}")


def run(plot_path: str | None = None, repeats: int = 3) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {os.getloadavg()[0]:.2f}")
    print(f"model: {DIMS}, greedy, prompt {PROMPT_LEN} tokens, {NEW_TOKENS} new tokens")
    print(f"tokens/s (engines take turns; best of {repeats} runs, recompute timed once):")
    throughput(repeats)
    print("per-token latency at position T (median):")
    rows = latency_table(repeats)
    if plot_path:
        plot(rows, plot_path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", help="write the latency plot (PNG) to this path")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement")
    args = parser.parse_args(argv)
    run(args.plot, args.repeats)


if __name__ == "__main__":
    main()
