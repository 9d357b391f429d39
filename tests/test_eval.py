"""The evaluation harness: known values reproduced exactly, batch-size invariance, sacreBLEU parity with
its command line, gradient paths against direct autograd, and `zoo evaluate` / `zoo leaderboard` end to end
on tiny models."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch.nn import functional as F

from zoo.data import load_corpus, read_pairs, train_tokenizer
from zoo.eval import gradients, lm, probes, speed, translation
from zoo.eval.adapter import ZooLMAdapter
from zoo.eval.plots import plot_alignment
from zoo.eval.records import file_sha256, read_records
from zoo.hub import save_pretrained
from zoo.models import build_model
from zoo.models.transformer import TransformerConfig
from zoo.tokenizers import BPETokenizer, CharTokenizer, WordTokenizer

ROOT = Path(__file__).resolve().parents[1]


def fixed_distribution_lm(probabilities: list[float]):
    """An RNN LM whose every prediction is `probabilities`, whatever the context."""
    model = build_model("rnn_lm_tiny", vocab_size=len(probabilities), dropout=0.0).eval()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor(probabilities).log())
    return model


def test_bits_per_char_equals_a_hand_computation():
    tokenizer = CharTokenizer(["\n", "a", "b", "c"])
    p = [0.1, 0.2, 0.3, 0.4]
    text = "abcab\nca"
    # Every character is predicted (the first from the line-break context) with probability p[id].
    by_hand = -sum(math.log(p[tokenizer.index[c]]) for c in text) / len(text) / math.log(2)
    score = lm.score_text(fixed_distribution_lm(p), tokenizer, text)
    assert (score.n_tokens, score.n_chars) == (8, 8)
    assert score.bits_per_char == pytest.approx(by_hand, abs=1e-6)
    # A transformer with a zeroed (tied) head predicts uniformly: exactly log2(V) bits per character.
    transformer = build_model("transformer_tiny", vocab_size=4, dropout=0.0).eval()
    with torch.no_grad():
        transformer.head.weight.zero_()
    for policy in ("sliding", "disjoint"):
        assert lm.score_text(transformer, tokenizer, text * 20, policy).bits_per_char == pytest.approx(2.0, abs=1e-6)


def test_word_level_characters_are_the_decoded_text():
    tokenizer = WordTokenizer(["<eos>", "the", "cat", "sat", "<unk>"])
    ids, n_chars = lm.encode_for_scoring(tokenizer, " the cat \n sat dog \n")
    assert ids.tolist() == [0, 1, 2, 0, 3, 4, 0]  # <eos> context, then every word and line end
    assert n_chars == len("the cat\nsat <unk>\n") == 18
    score = lm.score_text(fixed_distribution_lm([0.2] * 5), tokenizer, " the cat \n sat dog \n")
    assert score.perplexity == pytest.approx(5.0, rel=1e-5)
    assert score.bits_per_char == pytest.approx(6 * math.log2(5) / 18, rel=1e-5)


@pytest.mark.parametrize("arch", ["gru_lm_tiny", "transformer_tiny"])
def test_perplexity_equals_exp_mean_nll_of_a_direct_forward(arch):
    model = build_model(arch, vocab_size=11, dropout=0.0).eval()
    ids = torch.randint(0, 11, (50,))
    with torch.no_grad():
        logits, _ = model(ids[None, :-1])
    direct = math.exp(F.cross_entropy(logits[0], ids[1:]).item())
    policy = "carry" if arch.startswith("gru") else "disjoint"  # 49 targets fit one window of 64
    losses = lm.token_losses(model, ids, policy, chunk_len=7)
    assert lm.LMScore(float(losses.sum()), len(losses), 49).perplexity == pytest.approx(direct, rel=1e-5)


def test_lm_scores_do_not_depend_on_batch_size_or_chunk_length():
    transformer = build_model("transformer_tiny", vocab_size=13, dropout=0.0).eval()
    gru = build_model("gru_lm_tiny", vocab_size=13, dropout=0.0).eval()
    ids = torch.randint(0, 13, (700,))
    one = lm.token_losses(transformer, ids, "sliding", stride=24, batch_size=1)
    eight = lm.token_losses(transformer, ids, "sliding", stride=24, batch_size=8)
    torch.testing.assert_close(one, eight, rtol=0, atol=1e-5)
    torch.testing.assert_close(lm.token_losses(gru, ids, "carry", chunk_len=1),
                               lm.token_losses(gru, ids, "carry", chunk_len=256), rtol=0, atol=1e-5)
    for model in (transformer, gru):
        curve_one, _ = lm.position_curve(model, ids, 32, batch_size=1)
        curve_eight, _ = lm.position_curve(model, ids, 32, batch_size=8)
        torch.testing.assert_close(curve_one, curve_eight, rtol=0, atol=1e-5)


@pytest.mark.parametrize("n_targets,window,stride", [(700, 64, 24), (64, 64, 16), (10, 64, 32), (130, 64, 64)])
def test_sliding_windows_score_every_token_once_with_the_stated_context(n_targets, window, stride):
    seen = []
    for start, first, end in lm.window_spans(n_targets, window, stride):
        assert end - start == min(window, n_targets)
        seen.extend(range(first, end + 1))
        if start > 0:
            assert first - 1 - start >= window - stride  # inputs before the first scored target
    assert seen == list(range(1, n_targets + 1))


def test_adapter_scores_text_and_batching_does_not_change_it():
    tokenizer = CharTokenizer(["\n", " ", "a", "b", "c"])
    for model in (build_model("gru_lm_tiny", vocab_size=5, dropout=0.0), build_model("transformer_tiny", vocab_size=5)):
        adapter = ZooLMAdapter(model.eval(), tokenizer, batch_size=1)
        requests = [("ab", " c"), ("", "abc"), ("c" * 100, "ab"), ("a b", "\nc")]
        single = adapter.loglikelihood(requests)
        adapter.batch_size = 8
        batched = adapter.loglikelihood(requests)
        for (one, greedy_one), (many, greedy_many) in zip(single, batched):
            assert one == pytest.approx(many, abs=1e-5) and greedy_one == greedy_many
        # log p("abc" after a line break) is minus the NLL that score_text sums.
        assert single[1][0] == pytest.approx(-lm.score_text(model, tokenizer, "abc").total_nll, abs=1e-5)
        assert adapter.loglikelihood_rolling(["abc"])[0] == pytest.approx(single[1][0], abs=1e-5)
    peaked = fixed_distribution_lm([0.05, 0.05, 0.7, 0.1, 0.1])
    adapter = ZooLMAdapter(peaked, tokenizer)
    assert [greedy for _, greedy in adapter.loglikelihood([("b", "aa"), ("b", "ab")])] == [True, False]
    outputs = adapter.generate_until([("c", {"until": ["b"], "max_gen_toks": 3}), ("c", {"until": ["a"], "max_gen_toks": 3})])
    assert outputs == ["aaa", ""]  # greedy 'a' each step; the text is cut before a stop string


def test_adapter_refuses_translators():
    with pytest.raises(ValueError, match="translation model"):
        ZooLMAdapter(build_model("bahdanau_tiny", src_vocab_size=9, tgt_vocab_size=9), None)


def test_sacrebleu_scores_equal_the_command_line(tmp_path):
    hypotheses = ["A man in an orange hat.", "Two dogs run on the beach", "", "A woman plays."]
    references = ["A man in an orange hat staring at something.", "Two dogs are running on the beach.",
                  "A child.", "A woman is playing a guitar."]
    (tmp_path / "hyp.txt").write_text("\n".join(hypotheses) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(references) + "\n")
    mine = translation.corpus_scores(hypotheses, references)
    done = subprocess.run([sys.executable, "-m", "sacrebleu", str(tmp_path / "ref.txt"), "-i", str(tmp_path / "hyp.txt"),
                           "-m", "bleu", "chrf", "-w", "6", "--format", "json"], capture_output=True, text=True, check=True)
    bleu, chrf = json.loads(done.stdout)
    assert mine["bleu"] == pytest.approx(bleu["score"], abs=1e-5) and mine["bleu_signature"] == bleu["signature"]
    assert mine["chrf"] == pytest.approx(chrf["score"], abs=1e-5) and mine["chrf_signature"] == chrf["signature"]


def test_bleu_by_source_length_buckets():
    sources = ["a b", "a b c d e", "a " * 12, "x"]
    same = ["a man plays in the park ."] * 4
    result = translation.bleu_by_length(same, same, sources, [2, 10])
    assert result["x"] == ["1-2", "3-10", ">10"] and result["count"] == [2, 1, 1]
    assert result["y"][0] == pytest.approx(100.0)


def test_hidden_state_gradients_match_direct_autograd():
    model = build_model("rnn_lm_tiny", vocab_size=7, dropout=0.0, n_layer=2).eval()
    tokens = torch.randint(0, 7, (3, 5 + 6 + 2))
    norms = gradients.hidden_state_gradients(model, tokens, max_k=6, warmup=5)
    # Recompute d loss_T / d h_{T-2} directly: run to h_{T-2}, make it a leaf, finish the sequence.
    with torch.no_grad():
        _, state = model(tokens[:, : 5 + 6 - 1])  # h after token index 9 == h_{T-2} (T = index 11)
    leaf = state.clone().requires_grad_(True)
    logits, _ = model(tokens[:, 10:12], leaf)
    F.cross_entropy(logits[:, -1], tokens[:, -1], reduction="sum").backward()
    torch.testing.assert_close(norms[:, 1], leaf.grad.norm(dim=(0, 2)), rtol=1e-4, atol=1e-7)
    summary = gradients.summarise(torch.tensor([[0.9**k for k in range(1, 101)]] * 2))
    assert summary["decay_per_step"] == pytest.approx(0.9, rel=1e-6)
    assert summary["ratio_39"] == pytest.approx(0.9**38, rel=1e-6)


def test_input_saliency_reaches_every_position_of_the_transformer():
    model = build_model("transformer_tiny", vocab_size=9, dropout=0.0)
    norms = gradients.input_saliency(model, torch.randint(0, 9, (2, 42)), max_k=40)
    assert norms.shape == (2, 40) and bool((norms > 0).all())


def test_probe_batches_hold_the_answer_at_distance_k():
    import random

    inputs, targets = probes.copy_batch(4, k=5, n_copy=2, n_symbols=8, n_filler=4, rng=random.Random(0))
    assert inputs.shape == (4, 2 + 5 + 2 - 1 + 1) and bool((inputs[:, 7] == 12).all())  # GO after symbols + filler
    torch.testing.assert_close(targets[:, -2:], inputs[:, :2])
    inputs, targets = probes.recall_batch(4, k=6, n_keys=8, n_values=8, n_before=1, rng=random.Random(0))
    query = inputs[:, -1]
    assert bool((inputs[:, 2] == query).all())  # the target pair: (key, value) at positions 2, 3
    torch.testing.assert_close(targets[:, -1], inputs[:, 3])
    assert inputs.shape[1] - 1 - 3 - 1 == 6  # tokens strictly between the value and the query


def test_memory_figures_equal_their_formulas():
    config = TransformerConfig(n_layer=4, n_head=4, n_embd=256)
    result = speed.kv_cache_bytes(config, [128, 4096], torch.float32)
    assert result["measured"] == result["formula"] == [2 * 4 * 4 * 64 * t * 4 for t in (128, 4096)]
    maps = speed.attention_map_bytes([64, 1024])
    assert maps["measured"] == [64 * 64 * 4, 1024 * 1024 * 4]


def test_plot_alignment_writes_a_png_and_checks_its_labels(tmp_path):
    weights = torch.softmax(torch.randn(3, 4), dim=-1)
    path = tmp_path / "alignment.png"
    plot_alignment(weights, ["ein", "mann", ".", "<eos>"], ["a", "man", "<eos>"], path, title="ein mann .")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="does not match"):
        plot_alignment(weights, ["ein", "mann"], ["a", "man", "<eos>"])


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, tiny_data_dir):
    """Untrained tiny models of every family, saved as model folders named `<arch>.<corpus>`."""
    root = tmp_path_factory.mktemp("models")
    char = train_tokenizer("char", load_corpus("shakespeare_char", tiny_data_dir))
    word = train_tokenizer("word", load_corpus("ptb_word", tiny_data_dir))
    pairs = read_pairs("multi30k_de_en", tiny_data_dir)
    source, target = BPETokenizer.train(pairs["train"][0], 120), BPETokenizer.train(pairs["train"][1], 120)
    folders = []
    torch.manual_seed(0)
    for arch, corpus, tokenizer in (("rnn_lm_tiny", "shakespeare_char", char), ("transformer_tiny", "shakespeare_char", char),
                                    ("gru_lm_tiny", "ptb_word", word)):
        model = build_model(arch, vocab_size=tokenizer.vocab_size, dropout=0.0)
        folders.append(save_pretrained(root / f"{arch}.{corpus}", model, {"tokenizer": tokenizer}, arch, torch.float16))
    model = build_model("bahdanau_tiny", src_vocab_size=source.vocab_size, tgt_vocab_size=target.vocab_size)
    folders.append(save_pretrained(root / "bahdanau_tiny.multi30k_de_en", model, {"source": source, "target": target},
                                   "bahdanau_tiny", torch.float16))
    return folders


@pytest.fixture(scope="module")
def small_suites(tmp_path_factory):
    """The shipped suite definitions, shrunk to run in seconds."""
    folder = tmp_path_factory.mktemp("suites")
    for path in (ROOT / "evaluate" / "suites").glob("*.yaml"):
        suite = yaml.safe_load(path.read_text())
        if suite["suite"] == "probes":
            suite.update(steps=5, ks=[2, 4], n_eval=8, architectures={"gru": suite["architectures"]["gru"]})
        if suite["suite"] == "speed":
            suite["tasks"]["attention_map"]["lengths"] = [16, 32]
            suite["tasks"]["decode"].update(n_tokens=8, repeats=1, translation_tokens=4)
            suite["tasks"]["train_throughput"].update(steps=1, warmup=0, batch_size=2, seq_len=8, translation_seq_len=8)
        if suite["suite"] == "gradients":
            suite["tasks"]["gradient_paths"].update(max_k=40, n_sequences=2, warmup=5)
        (folder / path.name).write_text(yaml.safe_dump(suite))
    return folder


@pytest.fixture(scope="module")
def evaluated(tiny_models, small_suites, tiny_data_dir, tmp_path_factory):
    """`zoo evaluate` over the tiny models, every suite, as a user runs it."""
    output = tmp_path_factory.mktemp("results")
    models = ",".join(str(f) for f in tiny_models)
    done = subprocess.run([sys.executable, "-m", "zoo.cli", "evaluate", models, "--suite", "all", "--output", str(output),
                           "--data_dir", str(tiny_data_dir), "--suite_dir", str(small_suites)],
                          capture_output=True, text=True, cwd=ROOT, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return output, read_records(output)


def _env():
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import subprocess_env

    return subprocess_env()


def test_evaluate_writes_reproducible_records(evaluated, tiny_models):
    output, records = evaluated
    assert {r["suite"] for r in records} == {"lm", "translation", "speed", "probes", "gradients"}
    by_name = {f.name: f for f in tiny_models}
    for record in records:
        for key in ("model", "revision", "task", "task_version", "metric", "context_policy", "precision", "batch_size",
                    "seed", "environment"):
            assert key in record, key
        assert record["environment"]["packages"]["torch"] == torch.__version__
        assert "commit" in record["environment"]["git"]
        if record["model"] in by_name:
            assert record["revision"] == "sha256:" + file_sha256(by_name[record["model"]] / "model.safetensors")
    bpc = [r for r in records if r["metric"] == "bits_per_char"]
    assert {r["model"] for r in bpc} == {"rnn_lm_tiny.shakespeare_char", "transformer_tiny.shakespeare_char",
                                         "gru_lm_tiny.ptb_word"}
    assert all(r["details"]["split"] == ("val" if "shakespeare" in r["model"] else "test") for r in bpc)
    policies = {r["model"]: r["context_policy"] for r in bpc}
    assert "carried" in policies["rnn_lm_tiny.shakespeare_char"]
    assert "stride" in policies["transformer_tiny.shakespeare_char"]
    assert any(r["metric"] == "bits_per_char_disjoint" for r in records)
    word_ppl = [r for r in records if r["metric"] == "word_perplexity"]
    assert [r["model"] for r in word_ppl] == ["gru_lm_tiny.ptb_word"] and word_ppl[0]["unit"] == "per word"


def test_evaluated_lm_score_equals_direct_scoring(evaluated, tiny_models, tiny_data_dir):
    _, records = evaluated
    from zoo.hub import load

    pretrained = load(tiny_models[0])
    text = load_corpus("shakespeare_char", tiny_data_dir)["val"]
    record = next(r for r in records if r["model"] == "rnn_lm_tiny.shakespeare_char" and r["metric"] == "bits_per_char")
    assert record["value"] == pytest.approx(lm.score_text(pretrained.model, pretrained.tokenizer, text).bits_per_char,
                                            abs=1e-6)


def test_evaluated_bleu_equals_the_command_line_on_the_written_hypotheses(evaluated, tiny_data_dir, tmp_path):
    output, records = evaluated
    record = next(r for r in records if r["metric"] == "bleu_beam5")
    references = read_pairs("multi30k_de_en", tiny_data_dir)["test"][1]
    (tmp_path / "ref.txt").write_text("\n".join(references) + "\n")
    hypotheses = output / "translation" / record["details"]["hypotheses"]
    done = subprocess.run([sys.executable, "-m", "sacrebleu", str(tmp_path / "ref.txt"), "-i", str(hypotheses),
                           "-m", "bleu", "-w", "6", "--format", "json"], capture_output=True, text=True, check=True)
    cli = json.loads(done.stdout)  # one metric: a single object
    assert record["value"] == pytest.approx(cli["score"], abs=1e-5)
    assert record["details"]["signature"] == cli["signature"]
    assert any(r["metric"] == "alignment" for r in records)
    assert any(r["metric"] == "teacher_forced_perplexity" for r in records)


def test_leaderboard_and_metrics_json(evaluated, tiny_models, tmp_path):
    output, _ = evaluated
    page, plots_dir = tmp_path / "LEADERBOARD.md", tmp_path / "plots"
    done = subprocess.run([sys.executable, "-m", "zoo.cli", "leaderboard", "--results", str(output), "--output",
                           str(page), "--plots_dir", str(plots_dir)], capture_output=True, text=True, cwd=ROOT, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    text = page.read_text()
    for heading in ("bits per character", "Translation", "KV-cache", "attention map", "probes", "Gradient paths"):
        assert heading.lower() in text.lower()
    assert (plots_dir / "alignment_bahdanau_tiny.multi30k_de_en_0.png").is_file()
    assert (plots_dir / "lm_shakespeare_char_loss_by_position.png").is_file()
    from zoo.eval.runner import write_metrics_files

    written = write_metrics_files(",".join(str(f) for f in tiny_models), output)
    metrics = json.loads((tiny_models[0] / "metrics.json").read_text())
    assert len(written) == len(tiny_models) and {"val_loss", "val_bpc", "val_ppl"} <= set(metrics)
    assert "test_bleu" in json.loads((tiny_models[-1] / "metrics.json").read_text())


def test_evaluate_rejects_bad_input_with_one_clear_line(tiny_models, tmp_path):
    for args, message in ((["all", "--suite", "speling"], "unknown suite"),
                          (["no_such_model.ptb_word", "--suite", "lm"], "no_such_model"),
                          ([str(tiny_models[0]), "--suite", "lm", "--corpus", "wikitext2_word", "--output", str(tmp_path)],
                           "no lm task")):
        done = subprocess.run([sys.executable, "-m", "zoo.cli", "evaluate", *args], capture_output=True, text=True,
                              cwd=ROOT, env=_env())
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
