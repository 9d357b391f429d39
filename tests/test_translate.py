"""Translation: greedy and beam search over the Seq2Seq model, hypotheses, attention, CLI."""

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.hub import save_pretrained
from zoo.models import build_model
from zoo.tokenizers import BPETokenizer
from zoo.generation import intra_op_threads
from zoo.translate import beam_search, greedy_search, length_normalise, translate

SOURCE = ["ein mann fährt fahrrad .", "eine frau liest ein buch im park .", "zwei hunde .",
          "ein kind spielt am strand mit einem ball ."]
TARGET = ["a man rides a bike .", "a woman reads a book in the park .", "two dogs .",
          "a child plays on the beach with a ball ."]


@pytest.fixture(autouse=True)
def one_thread():
    """The models here are tiny: one intra-op thread is fastest, and unaffected by a busy machine."""
    with intra_op_threads(1):
        yield


def make_translator(folder, architecture: str = "bahdanau_tiny", eos_bias: float = 0.0):
    """A random translator with peaked output logits (no near-ties), saved and loaded like a real one."""
    source, target = BPETokenizer.train(SOURCE, 80), BPETokenizer.train(TARGET, 80)
    torch.manual_seed(0)
    model = build_model(architecture, src_vocab_size=source.vocab_size, tgt_vocab_size=target.vocab_size)
    with torch.no_grad():
        model.output.weight.mul_(20.0)
        model.output.bias[target.eos_id] += eos_bias
    save_pretrained(folder, model, {"source": source, "target": target}, architecture=architecture)
    return zoo.load(str(folder))


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    return make_translator(tmp_path_factory.mktemp("translator"))


def source_batch(loaded, sentences):
    source = loaded.tokenizers["source"]
    ids = [source.encode(s) + [source.eos_id] for s in sentences]
    lengths = torch.tensor([len(i) for i in ids])
    src = torch.full((len(ids), int(lengths.max())), source.pad_id)
    for row, row_ids in enumerate(ids):
        src[row, : len(row_ids)] = torch.tensor(row_ids)
    return src, lengths


def test_beam_size_one_equals_greedy(translator):
    target = translator.tokenizers["target"]
    src, lengths = source_batch(translator, SOURCE)
    limits = torch.full_like(lengths, 15)
    greedy = greedy_search(translator.model, src, lengths, target.bos_id, target.eos_id, limits)
    beams = beam_search(translator.model, src, lengths, target.bos_id, target.eos_id, limits, beam_size=1)
    for one_greedy, (one_beam,) in zip(greedy, beams):
        assert one_beam["tokens"] == one_greedy["tokens"]
        assert one_beam["log_prob"] == pytest.approx(one_greedy["log_prob"], abs=1e-4)


def test_beam_results_are_sorted_and_n_best_long(translator):
    results = translate(translator, SOURCE, beam_size=4, n_best=3, max_length=12)
    assert len(results) == len(SOURCE)
    for hypotheses in results:
        assert len(hypotheses) == 3
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        for h in hypotheses:
            length = len(h.tokens) + h.finished  # eos counts
            assert h.score == pytest.approx(length_normalise(h.log_prob, length, 1.0))
    assert translate(translator, SOURCE[0], beam_size=4, max_length=12) == results[0][0].text


def test_beam_search_is_exact_when_the_beam_covers_everything(translator):
    """With beam_size = vocabulary size and max_length 2, beam search must find the best sequence."""
    model, target = translator.model, translator.tokenizers["target"]
    src, lengths = source_batch(translator, SOURCE[:1])
    V, bos, eos = target.vocab_size, target.bos_id, target.eos_id
    with torch.no_grad():
        states, mask, state = model.encode(src, lengths)
        logits, state, _ = model.decode_step(torch.tensor([bos]), states, mask, state)
        first = torch.log_softmax(logits, -1)[0]  # (V,)
        logits, _, _ = model.decode_step(torch.arange(V), states.expand(V, -1, -1), mask.expand(V, -1),
                                         state.expand(V, -1))
        second = first.unsqueeze(1) + torch.log_softmax(logits, -1)  # (V, V): log P(a, b)
    second[eos] = float("-inf")  # nothing follows eos
    best_pair = divmod(int(second.argmax()), V)
    best = max((float(first[eos]), []), (float(second.max()), [t for t in best_pair if t != eos]))
    found = beam_search(model, src, lengths, bos, eos, torch.tensor([2]), beam_size=V, length_penalty=0.0)[0][0]
    assert found["log_prob"] == pytest.approx(best[0], abs=1e-4)
    assert found["tokens"] == best[1]


def test_eos_ends_hypotheses_and_max_length_cuts(tmp_path, translator):
    eager = make_translator(tmp_path, eos_bias=1000.0)  # eos is by far the likeliest token
    for beam_size in (1, 3):
        (hypothesis,) = translate(eager, SOURCE[:1], beam_size=beam_size, n_best=1, return_attention=True)[0]
        assert hypothesis.tokens == [] and hypothesis.text == "" and hypothesis.finished
        assert hypothesis.attention.shape[0] == 1  # one step: the eos
    for beam_size in (1, 3):
        (hypothesis,) = translate(translator, SOURCE[:1], beam_size=beam_size, max_length=5, return_attention=True)[0]
        assert len(hypothesis.tokens) + hypothesis.finished <= 5
        assert hypothesis.attention.shape[0] == len(hypothesis.tokens) + hypothesis.finished


@pytest.mark.parametrize("beam_size", [1, 3])
def test_attention_rows_sum_to_one_over_the_real_source(translator, beam_size):
    source = translator.tokenizers["source"]
    results = translate(translator, SOURCE, beam_size=beam_size, n_best=1, max_length=10, return_attention=True)
    for sentence, (hypothesis,) in zip(SOURCE, results):
        steps = len(hypothesis.tokens) + hypothesis.finished
        assert hypothesis.attention.shape == (steps, len(source.encode(sentence)) + 1)
        assert torch.allclose(hypothesis.attention.sum(dim=1), torch.ones(steps), atol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("max_length", [12, None])  # None: rows stop at different steps (2 * length + 10)
def test_batching_does_not_change_results(translator, beam_size, max_length):
    batched = translate(translator, SOURCE, beam_size=beam_size, max_length=max_length, batch_size=3)
    assert batched == [translate(translator, s, beam_size=beam_size, max_length=max_length) for s in SOURCE]


def test_bad_options_give_clear_errors(translator, tmp_path):
    for options, message in [
        (dict(beam_size=0), "beam_size=0"),
        (dict(beam_size=2, n_best=3), "n_best=3"),
        (dict(length_penalty=-1.0), "length_penalty=-1.0"),
        (dict(length_norm="average"), "length_norm='average'"),
        (dict(max_length=0), "max_length=0"),
    ]:
        with pytest.raises(ValueError, match=message):
            translate(translator, "ein mann .", **options)
    fixed_context = make_translator(tmp_path, "seq2seq_noattn_tiny")
    assert isinstance(translate(fixed_context, "ein mann ."), str)
    with pytest.raises(ValueError, match="no attention"):
        translate(fixed_context, "ein mann .", return_attention=True)


def test_length_penalties():
    assert length_normalise(-6.0, 3, 1.0) == pytest.approx(-2.0)
    assert length_normalise(-6.0, 3, 0.0) == pytest.approx(-6.0)
    assert length_normalise(-6.0, 3, 1.0, "gnmt") == pytest.approx(-6.0 / (8 / 6))


def test_cli_translates_text_and_files(translator, tmp_path, capsys):
    folder = str(translator.folder)
    main(["translate", folder, SOURCE[0], "--max_length", "12"])
    assert capsys.readouterr().out == translate(translator, SOURCE[0], max_length=12) + "\n"
    lines = tmp_path / "source.txt"
    lines.write_text("\n".join(SOURCE[:2]) + "\n", encoding="utf-8")
    main(["translate", folder, "--input", str(lines), "--beam_size", "3", "--n_best", "2", "--max_length", "12"])
    out = capsys.readouterr().out.strip().split("\n\n")
    assert len(out) == 2 and all(len(block.splitlines()) == 2 for block in out)
    with pytest.raises(SystemExit, match="beam_size=0"):
        main(["translate", folder, SOURCE[0], "--beam_size", "0"])
