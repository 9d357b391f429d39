"""The registry of pretrained variants, `zoo list`, metrics.json, and the golden-logit tests.

The golden test iterates the registry: a variant shipped in checkpoints/ must load with
strict=True and reproduce its reference logits in tests/golden/NAME.json (written by
`zoo golden NAME`). Adding a variant is one registry line and no new test code.
"""

import dataclasses
import json
import warnings

import pytest
import torch
from huggingface_hub.utils import validate_repo_id

import zoo
from test_hub import save_tiny
from zoo import registry
from zoo.data import CORPORA
from zoo.export import GOLDEN_DIR, check_golden, golden_command, golden_reference
from zoo.hub import load_folder
from zoo.models import ARCHITECTURES, architecture
from zoo.registry import PRETRAINED, count_parameters, list_command, list_models, read_metrics

NAMES = sorted(PRETRAINED)


@pytest.fixture
def checkpoints(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    monkeypatch.setattr(registry, "CHECKPOINT_DIR", folder)
    return folder


# --- the registry -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_variant_is_complete(name):
    variant = PRETRAINED[name]
    family = architecture(variant.architecture)[0]
    assert name == f"{variant.architecture}.{variant.corpus}", "names are family_size.corpus"
    assert variant.corpus in CORPORA and variant.tokenizer in ("char", "word", "bpe")
    assert variant.recipe.is_file()
    validate_repo_id(variant.hub_repo)
    assert variant.revision
    assert variant.headline in (("test_bleu",) if family == "seq2seq" else ("val_loss", "test_ppl", "val_ppl"))


def test_hub_repos_are_distinct():
    repos = [v.hub_repo for v in PRETRAINED.values()]
    assert len(set(repos)) == len(repos)


def test_list_models_filters_by_pattern():
    assert list_models() == NAMES
    assert list_models("gru*") == [n for n in NAMES if n.startswith("gru")] != []
    assert list_models("*.multi30k_de_en") == ["bahdanau_small.multi30k_de_en", "seq2seq_noattn_small.multi30k_de_en"]
    assert list_models("nothing*") == []
    assert zoo.list_models is list_models


def test_zoo_list_prints_a_table_with_the_measured_metric(checkpoints, capsys):
    name = "gru_lm_small.shakespeare_char"
    save_tiny(checkpoints / name, metrics={"val_loss": 1.23456, "val_ppl": 3.4})
    list_command()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "params", "corpus", "tokenizer", "metric", "shipped"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == set(NAMES)
    shipped = rows[name]
    exact = sum(p.numel() for p in load_folder(checkpoints / name)[0].parameters())
    assert shipped[1] == registry.format_count(exact) and shipped[4] == "val_loss=1.235" and shipped[5] == "yes"
    assert all(row[1].startswith("~") and row[5] == "no" for n, row in rows.items() if n != name)
    list_command("gru*")
    assert {line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]} == set(list_models("gru*"))
    with pytest.raises(SystemExit, match="no model matches"):
        list_command("nothing*")


def test_parameter_estimate_matches_the_built_model():
    # A variant without a shipped folder: the count is estimated from the architecture and corpus.
    variant = dataclasses.replace(PRETRAINED["transformer_medium.ptb_word"], name="transformer_medium.unshipped")
    assert not variant.folder.exists()
    count, exact = count_parameters(variant)
    model = zoo.models.build_model(variant.architecture, vocab_size=10000)
    assert not exact and count == sum(p.numel() for p in model.parameters())


def test_metrics_are_read_tolerantly(tmp_path):
    assert read_metrics(tmp_path) == {}
    (tmp_path / "metrics.json").write_text(json.dumps({"val_loss": 1.5, "test": {"ppl": 80, "bleu": 30.5},
                                                      "decoding": "greedy", "ok": True}))
    assert read_metrics(tmp_path) == {"val_loss": 1.5, "test_ppl": 80.0, "test_bleu": 30.5}
    (tmp_path / "metrics.json").write_text("{broken")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_metrics(tmp_path) == {}
    assert "not valid JSON" in str(caught[0].message)


# --- golden logits ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_shipped_model_reproduces_its_golden_logits(name):
    """Every shipped variant loads strictly by name and reproduces tests/golden/NAME.json."""
    variant, golden = PRETRAINED[name], GOLDEN_DIR / f"{name}.json"
    if not variant.folder.is_dir() and not golden.is_file():
        pytest.skip(f"{name} is not shipped yet (no checkpoints/{name}, no reference logits)")
    assert variant.folder.is_dir(), f"{name} has reference logits but checkpoints/{name} is missing"
    assert golden.is_file(), f"{name} is shipped without reference logits: run 'zoo golden {name}'"
    pretrained = zoo.load(name)
    assert pretrained.folder == variant.folder
    reference = json.loads(golden.read_text())
    assert reference["name"] == name
    problems = check_golden(pretrained.model, reference)
    assert not problems, f"{name}: {'; '.join(problems)} (weights sha256 then: {reference['weights_sha256'][:12]})"


@pytest.mark.parametrize("arch", ["gru_lm_tiny", "transformer_tiny", "bahdanau_tiny"])
def test_golden_check_catches_a_changed_weight_file(tmp_path, arch):
    folder = tmp_path / "model"
    save_tiny(folder, arch)
    reference = golden_reference(folder, "model")
    assert check_golden(zoo.load(folder).model, reference) == []
    model, tokenizers = load_folder(folder)
    with torch.no_grad():  # as a re-trained or damaged weight file would
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    from zoo.hub import save_pretrained

    save_pretrained(folder, model, tokenizers, architecture=arch, dtype=torch.float16)
    problems = check_golden(zoo.load(folder).model, reference)
    assert problems and "differ by up to" in problems[0]


def test_golden_check_catches_a_loader_regression(tmp_path):
    """A loader that, say, kept fp16 weights in a wrongly initialised model must not pass."""
    folder = tmp_path / "model"
    save_tiny(folder)
    reference = golden_reference(folder, "model")
    fresh = zoo.models.build_model("gru_lm_tiny", vocab_size=load_folder(folder)[0].config.vocab_size)
    assert check_golden(fresh.eval(), reference) != []


def test_golden_command_writes_a_reference_the_registry_test_accepts(checkpoints, tmp_path, monkeypatch, capsys):
    name = "gru_lm_small.shakespeare_char"
    save_tiny(checkpoints / name)
    golden_command(name, out_dir=str(tmp_path / "golden"))
    assert f"wrote {tmp_path / 'golden' / name}.json" in capsys.readouterr().out
    monkeypatch.setattr("zoo.export.GOLDEN_DIR", tmp_path / "golden")
    monkeypatch.setattr(__import__(__name__), "GOLDEN_DIR", tmp_path / "golden")
    test_shipped_model_reproduces_its_golden_logits(name)
    with pytest.raises(SystemExit, match="is not shipped"):
        golden_command("transformer_small.shakespeare_char", out_dir=str(tmp_path / "golden"))


def test_architectures_of_the_registry_exist():
    assert {v.architecture for v in PRETRAINED.values()} <= set(ARCHITECTURES)
