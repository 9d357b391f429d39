"""`zoo leaderboard`: render `evaluate/results` into `evaluate/LEADERBOARD.md` and PNG plots.

Everything shown is read from the result records; nothing is typed in. Each section says how
its numbers were measured (context policy, decoder, precision) and the lecture figure it checks.
"""

import os
from collections import defaultdict
from pathlib import Path

from zoo.eval import plots
from zoo.eval.records import REPO_ROOT, RESULTS_DIR, find, read_records
from zoo.io import atomic_write_text

LEADERBOARD = REPO_ROOT / "evaluate" / "LEADERBOARD.md"
PLOTS_DIR = REPO_ROOT / "evaluate" / "plots"


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if value != 0 and abs(value) < 1e-3:
            return f"{value:.2e}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def log_binned(xs: list, ys: list, per_octave: int = 6) -> dict:
    """Means of `ys` over bins of `xs` evenly spaced in log2 (a steadier curve for a log-x plot)."""
    import math

    bins: dict[int, list] = {}
    for x, y in zip(xs, ys):
        bins.setdefault(int(math.log2(x) * per_octave), []).append((x, y))
    points = [(sum(p[0] for p in group) / len(group), sum(p[1] for p in group) / len(group)) for group in bins.values()]
    return {"x": [p[0] for p in points], "y": [p[1] for p in points]}


def _value(records, model: str, metric: str, **where):
    found = find(records, model=model, metric=metric, **where)
    return found[0]["value"] if found else None


def _models(records, **where) -> list[str]:
    return sorted({r["model"] for r in find(records, **where)})


class Page:
    """Markdown sections and the plots they link to."""

    def __init__(self, plot_dir: Path, page_path: Path):
        self.parts: list[str] = []
        self.plot_dir, self.page_dir = Path(plot_dir), Path(page_path).parent

    def add(self, text: str) -> None:
        self.parts.append(text.strip() + "\n")

    def figure(self, name: str, caption: str) -> Path:
        path = self.plot_dir / f"{name}.png"
        self.add(f"![{caption}]({os.path.relpath(path, self.page_dir)})")
        return path


def lm_section(records, page: Page) -> None:
    for task in sorted({r["task"] for r in find(records, suite="lm")}):
        rows, curves = [], []
        ppl = next((r["metric"] for r in find(records, task=task) if r["metric"].endswith("_perplexity")), "perplexity")
        for model in _models(records, task=task):
            main = find(records, model=model, task=task, metric="bits_per_char")[0]
            rows.append([model, main["model_info"].get("n_parameters"), main["value"],
                         _value(records, model, ppl, task=task), _value(records, model, "bits_per_char_disjoint", task=task),
                         _value(records, model, f"{ppl}_disjoint", task=task), main["context_policy"]])
            curve = find(records, model=model, task=task, metric="loss_by_position")
            if curve:
                curves.append({"label": model, **log_binned(curve[0]["series"]["x"], curve[0]["series"]["y"])})
        details = find(records, task=task, metric="bits_per_char")[0]["details"]
        label = ppl.replace("_", " ").replace("perplexity", "ppl")
        page.add(f"### {task}: {details['corpus']} ({details['split']} split, {details['n_chars']:,} characters)\n\n"
                 f"Characters: {details['characters']}.\n\n"
                 + table(["model", "params", "bits/char", label, "bits/char (disjoint)", f"{label} (disjoint)", "context policy"], rows))
        if curves:
            plots.plot_curves(curves, page.figure(f"lm_{details['corpus']}_loss_by_position",
                                                  f"mean loss by context position, {details['corpus']}"),
                              title=f"{details['corpus']}: mean loss at context position t (fresh state per window; "
                                    "log-spaced bins)",
                              xlabel="position in window", ylabel="nats/token", logx=True)


def translation_section(records, page: Page) -> None:
    models = _models(records, suite="translation")
    if not models:
        return
    rows = [[m, _value(records, m, "bleu_greedy"), _value(records, m, "bleu_beam5"), _value(records, m, "chrf_greedy"),
             _value(records, m, "chrf_beam5"), _value(records, m, "teacher_forced_perplexity")] for m in models]
    signature = find(records, suite="translation", metric="bleu_greedy")[0]["details"]["signature"]
    chrf = find(records, suite="translation", metric="chrf_greedy")[0]["details"]["signature"]
    page.add("## Translation (Multi30k test_2016_flickr, de→en)\n\n"
             + table(["model", "BLEU greedy", "BLEU beam 5", "chrF greedy", "chrF beam 5", "teacher-forced ppl"], rows)
             + f"\n\nsacreBLEU signatures: `{signature}`; `{chrf}`. Teacher-forced perplexity is per target BPE token "
               "with the reference prefix fed (not a decoding metric).")
    curves, bucket_rows = [], []
    for record in find(records, suite="translation"):
        if record["metric"].startswith("bleu_by_source_length_"):
            decoder = record["metric"].rsplit("_", 1)[1]
            series = record["series"]
            curves.append({"label": f"{record['model']} ({decoder})", "x": series["x"], "y": series["y"]})
            bucket_rows.append([record["model"], decoder, *series["y"]])
            header = ["model", "decoder", *(f"{x} ({n})" for x, n in zip(series["x"], series["count"]))]
    page.add("### BLEU by source length (words; sentences per bucket in brackets)\n\n" + table(header, bucket_rows))
    plots.plot_curves(curves, page.figure("translation_bleu_by_source_length", "BLEU by source length"),
                      title="BLEU by source length: attention vs fixed context", xlabel="source words", ylabel="BLEU",
                      categorical=True)
    for record in find(records, suite="translation", metric="alignment"):
        for example in record["series"]["examples"]:
            path = page.figure(f"alignment_{record['model']}_{example['index']}", f"alignment, sentence {example['index']}")
            plots.plot_alignment(example["attention"], example["source_tokens"], example["target_tokens"], path,
                                 title=f"{example['source']}\n→ {example['hypothesis']}")


def speed_section(records, page: Page) -> None:
    models = [m for m in _models(records, suite="speed") if m != "attention_map"]
    if models:
        rows = [[m, _value(records, m, "train_tokens_per_second_float32"), _value(records, m, "train_tokens_per_second_bfloat16"),
                 _value(records, m, "decode_tokens_per_second") or _value(records, m, "decode_tokens_per_second_cached"),
                 _value(records, m, "decode_tokens_per_second_uncached")] for m in models]
        hardware = find(records, suite="speed")[0]["environment"]["hardware"]
        page.add("## Speed and memory\n\n"
                 f"Measured on {hardware['processor']} ({hardware['cpu_count']} CPUs, {hardware['torch_threads']} torch "
                 "threads); tokens/s, higher is better. Decoding is batch 1.\n\n"
                 + table(["model", "train fp32", "train bf16 autocast", "decode (cached/state)", "decode (no cache)"], rows))
        curves = [{"label": f"{r['model']} {r['metric'].removeprefix('decode_latency').strip('_') or 'state'}",
                   "x": r["series"]["x"], "y": [y * 1e3 for y in r["series"]["y"]]}
                  for r in find(records, suite="speed") if r["metric"].startswith("decode_latency")]
        plots.plot_curves(curves, page.figure("speed_decode_latency", "decode latency by position"),
                          title="per-token decode latency vs position (batch 1)", xlabel="position", ylabel="ms/token")
    kv = [r for r in find(records, suite="speed") if r["metric"].startswith("kv_cache_bytes_")]
    if kv:
        rows = [[r["model"], r["precision"], *r["series"]["y"], "yes" if r["series"]["y"] == r["series"]["formula"] else "NO"]
                for r in kv]
        page.add("### KV-cache bytes vs context length (batch 1), measured on the cache tensors\n\n"
                 f"Formula: {kv[0]['details']['formula']}.\n\n"
                 + table(["model", "dtype", *(f"T={t}" for t in kv[0]["series"]["x"]), "= formula"], rows))
        curves = [{"label": f"{r['model']} {r['precision']}", "x": r["series"]["x"], "y": r["series"]["y"]} for r in kv]
        plots.plot_curves(curves, page.figure("speed_kv_cache_bytes", "KV-cache bytes"), title="KV-cache bytes vs T",
                          xlabel="context length T", ylabel="bytes", logx=True, logy=True)
    attention_map_section(records, page)


def attention_map_section(records, page: Page) -> None:
    found = find(records, suite="speed", metric="attention_map_bytes")
    if not found:
        return
    series = found[0]["series"]
    rows = [list(row) for row in zip(series["x"], series["y"], [m / 1e6 for m in series["y"]], series["formula"],
                                     series["rss_increase"], [s * 1e3 for s in series["seconds"]])]
    page.add("### One attention map (one head, float32): the T² bill\n\n"
             "The notes: T=4096 gives 4096²·4 bytes ≈ 67 MB per head per layer. Bytes are measured on the "
             "materialised map; resident-memory growth shows only once the allocator has no freed block to reuse.\n\n"
             + table(["T", "bytes (tensor)", "MB", "T²·4", "resident memory growth", "ms to compute"], rows))
    plots.plot_curves([{"label": "measured", "x": series["x"], "y": series["y"]}],
                      page.figure("speed_attention_map_bytes", "attention map bytes"),
                      reference={"label": "T^2 * 4 bytes", "x": series["x"], "y": series["formula"]},
                      title="one attention map vs T", xlabel="T", ylabel="bytes", logx=True, logy=True)


def probes_section(records, page: Page) -> None:
    tasks = sorted({r["task"] for r in find(records, suite="probes")})
    for task in tasks:
        found = find(records, task=task, metric="accuracy_by_k")
        ks = found[0]["series"]["x"]
        rows = [[r["model"], r["model_info"].get("n_parameters"), *r["series"]["y"], r["details"]["train_seconds"]] for r in found]
        page.add(f"### {task} (chance {found[0]['details']['chance']:.3f})\n\n"
                 + table(["architecture", "params", *(f"k={k}" for k in ks), "train s"], rows))
        chance = found[0]["details"]["chance"]
        plots.plot_curves([{"label": r["model"], **r["series"]} for r in found],
                          page.figure(f"probes_{task.split('.')[-1]}", f"{task} accuracy vs k"),
                          reference={"label": "chance", "x": ks, "y": [chance] * len(ks)},
                          title=f"{task}: accuracy vs distance k", xlabel="k", ylabel="accuracy", logx=True)


def gradients_section(records, page: Page) -> None:
    found = find(records, suite="gradients")
    if not found:
        return
    rows = [[r["model"], r["metric"], r["value"], r["details"]["ratio_39"], r["details"]["fitted_39"]] for r in found]
    page.add("## Gradient paths\n\nNorm of the gradient of the last position's loss with respect to the hidden state "
             "(RNN, GRU) or the input embedding (every LM) k steps back; geometric mean over sequences. The lecture's "
             f"figure: a Jacobian factor of 0.9 gives 0.9^39 = {0.9 ** 39:.4f} (the notes round it to 0.017).\n\n"
             + table(["model", "measure", "fitted decay / step", "norm ratio k=39 / k=1", "decay^39"], rows))
    for metric in ("hidden_state_gradient", "input_saliency"):
        curves = [{"label": r["model"], **r["series"]} for r in found if r["metric"] == metric]
        if curves:
            plots.plot_curves(curves, page.figure(f"gradients_{metric}", metric), title=f"{metric} vs k",
                              xlabel="k (steps back)", ylabel="gradient norm", logy=True)


def render(results_dir=RESULTS_DIR, output=LEADERBOARD, plot_dir=PLOTS_DIR) -> Path:
    """Write the leaderboard page and its plots from the records under `results_dir`."""
    records = read_records(results_dir)
    if not records:
        raise FileNotFoundError(f"no results under {results_dir}; run 'zoo evaluate all' first")
    page = Page(plot_dir, output)
    commits = sorted({str(r["environment"]["git"]["commit"])[:10] for r in records})
    page.add("# Leaderboard\n\nGenerated by `zoo leaderboard` from the records in `evaluate/results` "
             f"(git commits {', '.join(commits)}); each record holds the model revision, task version, "
             "context policy, precision, batch size, seed, hardware and package versions.")
    if find(records, suite="lm"):
        page.add("## Language modelling, bits per character (lower is better)")
    lm_section(records, page)
    translation_section(records, page)
    speed_section(records, page)
    if find(records, suite="probes"):
        page.add("## Long-range probes (accuracy at distance k, trained from scratch)")
    probes_section(records, page)
    gradients_section(records, page)
    atomic_write_text(output, "\n".join(page.parts))
    return Path(output)


def leaderboard_command(results: str = str(RESULTS_DIR), output: str = str(LEADERBOARD), plots_dir: str = str(PLOTS_DIR)) -> None:
    """Render the evaluation results into a Markdown leaderboard with PNG plots.

    Args:
        results: folder of result records written by 'zoo evaluate'.
        output: the Markdown file to write.
        plots_dir: folder for the PNG plots.
    """
    try:
        path = render(results, output, plots_dir)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"zoo leaderboard: {error}") from None
    print(f"wrote {path}")
