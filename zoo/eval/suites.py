"""The five suites, each turning one model (or none) and one task definition into result records.

Task definitions live in `evaluate/suites/<suite>.yaml`; `zoo.eval.runner` decides which model
runs which suite and writes the records.
"""

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from zoo.data import load_corpus, read_pairs
from zoo.eval import gradients, lm, probes, speed, translation
from zoo.eval.records import make_record
from zoo.io import atomic_write_text


@dataclass
class RunContext:
    """What every suite needs besides the model: where data and results live, device, seed, environment."""

    output: Path
    data_dir: str | None = None
    device: str = "cpu"
    seed: int = 0
    env: dict = field(default_factory=dict)


@dataclass
class LoadedModel:
    """A loaded model with what records say about it (`info`: name, revision, family, corpus, ...)."""

    pretrained: object
    info: dict

    @property
    def model(self):
        return self.pretrained.model

    @property
    def family(self) -> str:
        return self.info["family"]


def _task(suite: dict, name: str, task: dict) -> dict:
    return {"suite": suite["suite"], "name": f"{suite['suite']}.{name}", "version": f"{suite['version']}.{task['version']}",
            "definition": task}


def _text_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------------- lm
def _lm_policies(model, task: dict) -> list[tuple[str, str, dict]]:
    """`(suffix, description, token_losses options)` of each context policy scored for `model`."""
    batch = task["batch_size"]
    if lm.is_recurrent(model):
        chunk = task["chunk_len"]
        return [("", f"state carried across the whole text (one stream, fed {chunk} tokens per forward)",
                 {"policy": "carry", "chunk_len": chunk})]
    window = model.config.block_size
    stride = min(task["transformer_stride"], window)
    return [
        ("", f"sliding window of {window} tokens, stride {stride} (every token after the first window sees "
             f">= {window - stride} tokens)", {"policy": "sliding", "window": window, "stride": stride,
                                                 "batch_size": batch}),
        ("_disjoint", f"disjoint windows of {window} tokens (token t of a window sees t tokens)",
         {"policy": "disjoint", "window": window, "batch_size": batch}),
    ]


def run_lm(loaded: LoadedModel, suite: dict, name: str, task: dict, ctx: RunContext) -> list[dict]:
    """Bits per character, perplexity and per-position loss of one LM on its corpus's evaluation text."""
    model, tokenizer = loaded.model, loaded.pretrained.tokenizer
    text = load_corpus(task["corpus"], ctx.data_dir)[task["split"]]
    ids, n_chars = lm.encode_for_scoring(tokenizer, text)
    spec = _task(suite, name, task)
    word = getattr(tokenizer, "kind", "") == "word"
    level = {"word": "word", "char": "char"}.get(getattr(tokenizer, "kind", ""), "token")
    common = {"corpus": task["corpus"], "split": task["split"], "text_sha256": _text_sha(text),
              "characters": "decoded word text: single spaces, one newline per <eos>" if word else "characters of the text",
              "first_token_context": "<eos>" if word else "'\\n'"}
    records = []
    for suffix, description, options in _lm_policies(model, task):
        policy = dict(options)
        start = time.perf_counter()
        losses = lm.token_losses(model, ids, policy.pop("policy"), **policy)
        score = lm.LMScore(float(losses.double().sum()), len(losses), n_chars)
        details = {**common, "total_nll_nats": score.total_nll, "n_tokens": score.n_tokens, "n_chars": n_chars,
                   "seconds": time.perf_counter() - start, **options}
        batch = options.get("batch_size", 1)
        for metric, value, unit in (
            ("bits_per_char", score.bits_per_char, "bits/char"),
            ("nll_per_token", score.total_nll / score.n_tokens, "nats/token"),
            (f"{level}_perplexity", score.perplexity, f"per {level}"),
        ):
            records.append(make_record(loaded.info, spec, metric + suffix, value, unit=unit, context_policy=description,
                                       batch_size=batch, seed=ctx.seed, details=details, env=ctx.env))
    records.append(_position_curve_record(loaded, spec, ids, task, ctx))
    return records


def _position_curve_record(loaded: LoadedModel, spec: dict, ids, task: dict, ctx: RunContext) -> dict:
    model = loaded.model
    length = task["curve_length"] if lm.is_recurrent(model) else min(task["curve_length"], model.config.block_size)
    curve, n_windows = lm.position_curve(model, ids, length, task["curve_windows"], task["batch_size"])
    policy = f"disjoint windows of {length} tokens, each from an empty state (first {n_windows} windows)"
    return make_record(loaded.info, spec, "loss_by_position", None, unit="nats/token", context_policy=policy,
                       batch_size=task["batch_size"], seed=ctx.seed,
                       details={"corpus": task["corpus"], "split": task["split"], "n_windows": n_windows},
                       series={"x": list(range(1, length + 1)), "y": [round(v, 6) for v in curve.tolist()]},
                       env=ctx.env)


# -------------------------------------------------------------------------------------- translation
def run_translation(loaded: LoadedModel, suite: dict, name: str, task: dict, ctx: RunContext) -> list[dict]:
    """BLEU and chrF (greedy and beam), BLEU by source length, teacher-forced perplexity, alignments."""
    sources, references = read_pairs(task["corpus"], ctx.data_dir)[task["split"]]
    spec = _task(suite, name, task)
    common = {"corpus": task["corpus"], "split": task["split"], "n_sentences": len(sources),
              "references_sha256": _text_sha("\n".join(references) + "\n")}
    records = []
    for decoder, options in task["decoders"].items():
        start = time.perf_counter()
        hypotheses = translation.decode_corpus(loaded.pretrained, sources, options["beam_size"], task["batch_size"],
                                               options.get("length_penalty", 1.0), task.get("max_length"))
        seconds = time.perf_counter() - start
        path = ctx.output / "translation" / f"{loaded.info['name'].replace('/', '__')}.{decoder}.txt"
        atomic_write_text(path, "\n".join(hypotheses) + "\n")
        scores = translation.corpus_scores(hypotheses, references)
        details = {**common, "decoder": decoder, **options, "hypotheses": path.name, "seconds": seconds,
                   "bleu_detail": scores["bleu_detail"]}
        policy = f"{decoder} decoding from the full source sentence"
        for metric in ("bleu", "chrf"):
            records.append(make_record(loaded.info, spec, f"{metric}_{decoder}", scores[metric], unit=metric,
                                       context_policy=policy, batch_size=task["batch_size"], seed=ctx.seed,
                                       details={**details, "signature": scores[f"{metric}_signature"]}, env=ctx.env))
        buckets = translation.bleu_by_length(hypotheses, references, sources, task["length_buckets"])
        records.append(make_record(loaded.info, spec, f"bleu_by_source_length_{decoder}", None, unit="bleu",
                                   context_policy=policy, batch_size=task["batch_size"], seed=ctx.seed,
                                   details={**details, "signature": scores["bleu_signature"],
                                            "length_unit": "source words (whitespace)"},
                                   series=buckets, env=ctx.env))
    records.append(_teacher_forced_record(loaded, spec, sources, references, task, common, ctx))
    if loaded.model.config.attention:
        records.append(_alignment_record(loaded, spec, sources, task, ctx))
    return records


def _teacher_forced_record(loaded, spec, sources, references, task, common, ctx) -> dict:
    tokenizers = loaded.pretrained.tokenizers
    total, count = translation.teacher_forced_nll(loaded.model, tokenizers["source"], tokenizers["target"], sources,
                                                  references, task["batch_size"])
    return make_record(loaded.info, spec, "teacher_forced_perplexity", translation.perplexity(total, count),
                       unit="per target BPE token", context_policy="teacher forced: the reference prefix is fed",
                       batch_size=task["batch_size"], seed=ctx.seed,
                       details={**common, "total_nll_nats": total, "n_tokens": count, "tokens": "target BPE, <eos> included"},
                       env=ctx.env)


def _alignment_record(loaded, spec, sources, task, ctx) -> dict:
    examples = [dict(translation.alignment_example(loaded.pretrained, sources[i]), index=i)
                for i in task["alignment_sentences"] if i < len(sources)]
    return make_record(loaded.info, spec, "alignment", None, context_policy="greedy decoding", batch_size=1,
                       seed=ctx.seed, details={"split": task["split"]}, series={"examples": examples}, env=ctx.env)


# -------------------------------------------------------------------------------------------- speed
def run_speed(loaded: LoadedModel, suite: dict, ctx: RunContext) -> list[dict]:
    """Training and decoding throughput, decode latency by position, KV-cache bytes."""
    tasks = suite["tasks"]
    records = _train_speed(loaded, suite, tasks["train_throughput"], ctx)
    records += _decode_speed(loaded, suite, tasks["decode"], ctx)
    if loaded.family == "transformer":
        records += _kv_cache(loaded, suite, tasks["kv_cache"], ctx)
    return records


def _train_speed(loaded, suite, task, ctx) -> list[dict]:
    spec, model, records = _task(suite, "train_throughput", task), loaded.model, []
    seq_len = task["translation_seq_len"] if loaded.family == "seq2seq" else task["seq_len"]
    if loaded.family == "transformer":
        seq_len = min(seq_len, model.config.block_size)
    for precision in task["precisions"]:
        result = speed.training_tokens_per_second(model, task["batch_size"], seq_len, precision, task["steps"],
                                                  task["warmup"], ctx.seed)
        shape = f"batch {task['batch_size']} x {seq_len} tokens" + (" (source and target)" if loaded.family == "seq2seq" else "")
        records.append(make_record(loaded.info, spec, f"train_tokens_per_second_{precision}",
                                   result["tokens_per_second"], unit="tokens/s", context_policy=shape,
                                   precision=precision if precision == "float32" else f"{precision} autocast",
                                   batch_size=task["batch_size"], seed=ctx.seed,
                                   details={**result, "seq_len": seq_len, "optimizer": "AdamW"}, env=ctx.env))
    return records


def _decode_speed(loaded, suite, task, ctx) -> list[dict]:
    spec, model = _task(suite, "decode", task), loaded.model
    if loaded.family == "seq2seq":
        rate = speed.translation_decode_tokens_per_second(model, task["translation_tokens"], seed=ctx.seed)
        return [make_record(loaded.info, spec, "decode_tokens_per_second", rate, unit="tokens/s",
                            context_policy=f"greedy, batch 1, {task['translation_tokens']} target steps",
                            batch_size=1, seed=ctx.seed, env=ctx.env)]
    n_tokens = task["n_tokens"]
    variants = [("", True)]
    if loaded.family == "transformer":
        n_tokens = min(n_tokens, model.config.block_size - 1)
        variants = [("_cached", True), ("_uncached", False)]
    records = []
    for suffix, use_cache in variants:
        latencies = speed.decode_latencies(model, n_tokens, use_cache, task["repeats"], ctx.seed)
        policy = ("KV cache" if use_cache else "no cache: the prefix is recomputed every step") if suffix else "recurrent state"
        common = {"batch_size": 1, "seed": ctx.seed, "context_policy": policy, "env": ctx.env}
        records.append(make_record(loaded.info, spec, f"decode_tokens_per_second{suffix}", n_tokens / sum(latencies),
                                   unit="tokens/s", details={"n_tokens": n_tokens, "repeats": task["repeats"]}, **common))
        records.append(make_record(loaded.info, spec, f"decode_latency{suffix}", None, unit="seconds/token",
                                   series={"x": list(range(1, n_tokens + 1)), "y": latencies}, **common))
    return records


def _kv_cache(loaded, suite, task, ctx) -> list[dict]:
    spec, config, records = _task(suite, "kv_cache", task), loaded.model.config, []
    for dtype_name in task["dtypes"]:
        result = speed.kv_cache_bytes(config, task["context_lengths"], getattr(torch, dtype_name))
        formula = "2 * n_layer * n_head * head_dim * T * bytes"
        records.append(make_record(
            loaded.info, spec, f"kv_cache_bytes_{dtype_name}", None, unit="bytes", precision=dtype_name, batch_size=1,
            seed=ctx.seed, context_policy="cache preallocated for T positions",
            details={"formula": formula, "n_layer": config.n_layer, "n_head": config.n_head, "head_dim": config.head_dim},
            series={"x": result["x"], "y": result["measured"], "formula": result["formula"]}, env=ctx.env))
    return records


def run_attention_map(suite: dict, ctx: RunContext) -> list[dict]:
    """Bytes and time of one head's T x T attention map, for each T (model-independent)."""
    task = suite["tasks"]["attention_map"]
    result = speed.attention_map_bytes(task["lengths"], task["head_dim"], torch.float32, ctx.device, ctx.seed)
    info = {"name": "attention_map", "revision": None}
    return [make_record(info, _task(suite, "attention_map", task), "attention_map_bytes", result["measured"][-1],
                        unit="bytes", precision="float32", batch_size=1, seed=ctx.seed,
                        context_policy="one head, one T x T map, materialised",
                        details={"formula": "T^2 * 4 bytes", "head_dim": task["head_dim"], "T": result["x"][-1]},
                        series={"x": result["x"], "y": result["measured"], "formula": result["formula"],
                                "seconds": result["seconds"], "rss_increase": result["rss_increase"],
                                "peak_cuda": result["peak_cuda"]}, env=ctx.env)]


# ------------------------------------------------------------------------------------------- probes
def run_probes(suite: dict, ctx: RunContext, progress=None) -> dict[str, list[dict]]:
    """Train every architecture on every probe task; records grouped by `probe.<architecture>`."""
    grouped: dict[str, list[dict]] = {}
    for arch_key, arch in suite["architectures"].items():
        info = {"name": f"probe.{arch_key}", "revision": None, "architecture": arch["architecture"],
                "overrides": arch.get("overrides", {}), "trained": "from scratch by the probe"}
        for task_name, task in suite["tasks"].items():
            result = probes.run_probe(arch["architecture"], arch.get("overrides", {}), task, suite["ks"], suite["steps"],
                                      suite["batch_size"], suite["learning_rate"], suite["n_eval"], suite["seed"],
                                      ctx.device)
            info["n_parameters"] = result["n_parameters"]
            details = {k: result[k] for k in ("train_seconds", "final_loss", "chance")}
            details.update(steps=suite["steps"], learning_rate=suite["learning_rate"], n_eval=suite["n_eval"])
            grouped.setdefault(info["name"], []).append(make_record(
                dict(info), _task(suite, task_name, task), "accuracy_by_k", result["y"][-1], unit="accuracy",
                context_policy="k drawn from the grid per training batch; scored on fresh sequences per k",
                batch_size=suite["batch_size"], seed=suite["seed"], details=details,
                series={"x": result["x"], "y": result["y"]}, env=ctx.env))
            if progress is not None:
                progress()
    return grouped


# ---------------------------------------------------------------------------------------- gradients
def run_gradients(loaded: LoadedModel, suite: dict, corpus: str, ctx: RunContext) -> list[dict]:
    """Hidden-state gradient norms (RNN, GRU) and input saliency (every LM) against distance k."""
    task = suite["tasks"]["gradient_paths"]
    model, tokenizer = loaded.model, loaded.pretrained.tokenizer
    split = task["splits"][corpus]
    ids = torch.tensor(tokenizer.encode(load_corpus(corpus, ctx.data_dir)[split]))
    recurrent = lm.is_recurrent(model)
    max_k, warmup = task["max_k"], task["warmup"] if recurrent else 0
    if not recurrent and model.config.block_size < max_k + 1:
        max_k = model.config.block_size - 1
    device = next(model.parameters()).device
    tokens = gradients.sample_sequences(ids, task["n_sequences"], warmup + max_k + 2, task["seed"]).to(device)
    spec, records = _task(suite, "gradient_paths", task), []
    measures = [("input_saliency", gradients.input_saliency, "||d loss_T / d x_{T-k}|| on token embeddings")]
    if recurrent:
        measures.insert(0, ("hidden_state_gradient", gradients.hidden_state_gradients, "||d loss_T / d h_{T-k}||"))
    for metric, measure, what in measures:
        summary = gradients.summarise(measure(model, tokens, max_k, warmup), task["fit_from"])
        series = {"x": summary.pop("x"), "y": summary.pop("y")}
        records.append(make_record(
            loaded.info, spec, metric, summary["decay_per_step"], unit="fitted decay per step",
            context_policy=f"{warmup} warm-up tokens, then {max_k + 1} tracked steps", batch_size=task["n_sequences"],
            seed=task["seed"], details={**summary, "measure": what, "corpus": corpus, "split": split,
                                         "summary": "geometric mean over sequences"},
            series=series, env=ctx.env))
    return records
