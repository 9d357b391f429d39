"""Loading by folder, registry name and repo id; offline behaviour; broken folders; model cards;
the folder a push uploads; and the download side end to end against a local `olah` Hub."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants as hf_constants

import zoo
from olah_server import OlahServer, olah_executable
from zoo import registry
from zoo.cards import CORPORA, render_card, validate_card, write_card
from zoo.hub import (LOAD_FILES, ModelNotAvailableError, load, load_folder, prepare_upload, push_command,
                     save_pretrained, upload_files)
from zoo.models import build_model
from zoo.registry import PRETRAINED, UnknownModelError, Variant
from zoo.tokenizers import BPETokenizer, CharTokenizer, WordTokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 4
WORDS = "the company said N shares rose <unk> in the year\nthe market fell\n" * 4
PAIRS = [("ein mann läuft .", "a man runs ."), ("eine frau spielt .", "a woman plays ."),
         ("zwei hunde laufen .", "two dogs run .")] * 4


def save_tiny(folder: Path, arch: str = "gru_lm_tiny", seed: int = 0, metrics: dict | None = None,
              training: dict | None = None, **overrides) -> torch.nn.Module:
    """A tiny model folder (fp16 weights, as shipped); returns the model."""
    torch.manual_seed(seed)
    if arch.startswith(("bahdanau", "seq2seq")):
        source = BPETokenizer.train([s for s, _ in PAIRS], vocab_size=60)
        target = BPETokenizer.train([t for _, t in PAIRS], vocab_size=60)
        tokenizers = {"source": source, "target": target}
        overrides = {"src_vocab_size": source.vocab_size, "tgt_vocab_size": target.vocab_size, **overrides}
    else:
        tokenizer = WordTokenizer.train(WORDS) if "ptb" in folder.name else CharTokenizer.train(TEXT)
        tokenizers = {"tokenizer": tokenizer}
        overrides = {"vocab_size": tokenizer.vocab_size, **overrides}
    model = build_model(arch, **overrides)
    save_pretrained(folder, model, tokenizers, architecture=arch, dtype=torch.float16,
                    metadata={"training": training} if training else None)
    if metrics is not None:
        (folder / "metrics.json").write_text(json.dumps(metrics))
    return model


def weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """An empty checkpoint dir and HF cache, and an endpoint nobody listens on: nothing leaks in or out."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    monkeypatch.setattr(registry, "CHECKPOINT_DIR", checkpoints)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)  # the local servers are reached directly
    return checkpoints


# --- local resolution and errors -------------------------------------------------------------


def test_load_folder_round_trip_is_strict_and_fp32(tmp_path, hub_env):
    model = save_tiny(tmp_path / "m")
    pretrained = zoo.load(tmp_path / "m")
    loaded, tokenizer = pretrained
    assert loaded.training is False and all(p.dtype == torch.float32 for p in loaded.parameters())
    expected = {k: v.half().float() for k, v in model.state_dict().items()}
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in expected.items())
    assert tokenizer.decode(tokenizer.encode("To be")) == "To be"
    assert pretrained.folder == tmp_path / "m" and pretrained.family == "gru_lm"


def test_registry_name_and_repo_id_resolve_to_the_shipped_folder_without_network(hub_env):
    name = "gru_lm_small.shakespeare_char"
    save_tiny(hub_env / name)
    start = time.monotonic()
    by_name, by_repo = zoo.load(name), zoo.load(PRETRAINED[name].hub_repo)
    assert time.monotonic() - start < 10
    assert by_name.folder == by_repo.folder == hub_env / name
    assert same_weights(by_name.model, by_repo.model)


def test_unknown_name_suggests_and_points_to_zoo_list(hub_env):
    with pytest.raises(UnknownModelError) as error:
        zoo.load("gru_lm.shakspeare")
    assert "did you mean 'gru_lm_small.shakespeare_char'" in str(error.value)
    assert "see 'zoo list'" in str(error.value)


def test_missing_local_path_is_named(hub_env):
    with pytest.raises(FileNotFoundError, match="no model folder './nowhere/model'"):
        zoo.load("./nowhere/model")


def test_revision_with_a_local_folder_is_refused(tmp_path, hub_env):
    save_tiny(tmp_path / "m")
    with pytest.raises(ValueError, match="applies to Hub models"):
        zoo.load(tmp_path / "m", revision="v1")


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "unreachable"])
def test_not_local_fails_at_once_saying_how_to_get_it(hub_env, monkeypatch, offline):
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(ModelNotAvailableError) as error:
        zoo.load("gru_lm_small.shakespeare_char")
    assert time.monotonic() - start < 8, "must not hang waiting for the network"
    message = str(error.value)
    assert "zoo download gru_lm_small.shakespeare_char" in message
    assert ("HF_HUB_OFFLINE is set" if offline else "http://127.0.0.1:9 cannot be reached") in message
    assert PRETRAINED["gru_lm_small.shakespeare_char"].hub_repo in message


def test_corrupt_or_truncated_weights_are_a_clear_error(tmp_path):
    save_tiny(tmp_path / "m")
    weights_file = tmp_path / "m" / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:-100])
    with pytest.raises(ValueError, match="corrupt or truncated.*download the model again"):
        load_folder(tmp_path / "m")
    weights_file.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_folder(tmp_path / "m")


def test_config_that_does_not_match_the_weights_is_a_clear_error(tmp_path):
    save_tiny(tmp_path / "m")
    config_path = tmp_path / "m" / "config.json"
    config = json.loads(config_path.read_text())
    config["config"]["hidden_size"] *= 2
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="does not match its weights.*hidden_size|does not match its weights"):
        load_folder(tmp_path / "m")


@pytest.mark.parametrize("damage, message", [
    ("no-tokenizer", "tokenizer.json is missing"),
    ("no-config", "config.json is missing"),
    ("bad-json", "not valid JSON"),
    ("no-family", "lacks \\['family'\\]"),
])
def test_broken_folders_name_the_problem(tmp_path, damage, message):
    folder = tmp_path / "m"
    save_tiny(folder)
    if damage == "no-tokenizer":
        (folder / "tokenizer.json").unlink()
    elif damage == "no-config":
        (folder / "config.json").unlink()
    elif damage == "bad-json":
        (folder / "config.json").write_text("{")
    else:
        config = json.loads((folder / "config.json").read_text())
        del config["family"]
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises((FileNotFoundError, ValueError), match=message):
        load_folder(folder)


def test_download_command_reports_one_line_errors(hub_env, monkeypatch, capsys):
    from zoo.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as error:
        main(["download", "gru_lm_smal.shakespeare_char"])
    assert str(error.value).startswith("zoo download: unknown model 'gru_lm_smal.shakespeare_char'; did you mean")
    with pytest.raises(SystemExit) as error:
        main(["download", "gru_lm_small.shakespeare_char"])
    assert "HF_HUB_OFFLINE is set" in str(error.value)


# --- model cards and the folder a push uploads ---------------------------------------------


TRAINING = {"global_step": 1500, "hyper_parameters": {"arch": "gru_lm_small", "learning_rate": 0.003,
                                                      "_instantiator": "lightning.pytorch.cli.instantiate_module"},
            "command": "zoo fit --config configs/gru_lm_small.shakespeare_char.yaml", "wall_seconds": 3725,
            "hardware": "AMD EPYC, 2 CPU cores", "torch": "2.13.0"}


@pytest.mark.parametrize("name", ["gru_lm_small.shakespeare_char", "gru_lm_medium.ptb_word",
                                  "bahdanau_small.multi30k_de_en"])
def test_card_metadata_comes_from_the_registry_and_the_measured_results(tmp_path, name):
    arch = {"gru_lm_small.shakespeare_char": "gru_lm_tiny", "gru_lm_medium.ptb_word": "gru_lm_tiny",
            "bahdanau_small.multi30k_de_en": "bahdanau_tiny"}[name]
    metrics = {"val_loss": 1.4567, "test": {"ppl": 123.4, "bleu": 31.25}}
    save_tiny(tmp_path / name, arch, metrics=metrics, training=TRAINING)
    card = validate_card(render_card(tmp_path / name))
    data, corpus = card.data, CORPORA[PRETRAINED[name].corpus]
    assert data.license == corpus["license"] and data.license_name == corpus.get("license_name")
    if data.license == "other":
        assert data.license_link
    assert data.datasets == [corpus["dataset"]] and data.library_name == "pytorch"
    assert data.pipeline_tag == ("translation" if "multi30k" in name else "text-generation")
    measured = {r.metric_name: (r.metric_value, r.dataset_split) for r in data.eval_results}
    assert measured == {"val_loss": (1.4567, "validation"), "test_ppl": (123.4, "test"), "test_bleu": (31.25, "test")}
    assert data.model_name == PRETRAINED[name].hub_repo
    text = card.text
    for fact in ("zoo fit --config configs/gru_lm_small.shakespeare_char.yaml", "| optimizer steps | 1500 |",
                 "1 h 2 min", "AMD EPYC, 2 CPU cores", "| learning_rate | 0.003 |", "| val_loss | 1.4567 |",
                 f"zoo.load({name!r})", "zoo finetune", corpus["terms"]):
        assert fact in text, fact
    assert "_instantiator" not in text


def test_card_without_metrics_or_training_record_says_so(tmp_path):
    folder = tmp_path / "transformer_small.shakespeare_char"
    save_tiny(folder, "transformer_tiny")
    card = validate_card(render_card(folder))
    assert not card.data.eval_results
    assert "Not measured yet" in card.text and "No training record" in card.text


@pytest.mark.parametrize("arch", ["gru_lm_tiny", "transformer_tiny", "bahdanau_tiny"])
def test_card_code_runs(tmp_path, arch):
    """The card's Python example works on the model it describes."""
    folder = tmp_path / "model"
    save_tiny(folder, arch, **({"block_size": 128} if arch == "transformer_tiny" else {}))
    text = render_card(folder, load_name=str(folder))
    snippet = text.split("```python\n")[1].split("```")[0]
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]


def test_write_card_is_atomic_and_replaces_the_old_card(tmp_path):
    folder = tmp_path / "gru_lm_small.shakespeare_char"
    save_tiny(folder, metrics={"val_loss": 2.0})
    (folder / "README.md").write_text("hand-written")
    write_card(folder)
    assert "val_loss" in (folder / "README.md").read_text()
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


def test_prepare_upload_lists_exactly_the_model_files_and_a_valid_card(hub_env, capsys):
    name = "gru_lm_small.shakespeare_char"
    folder = hub_env / name
    save_tiny(folder, metrics={"val_loss": 1.5}, training=TRAINING)
    (folder / "notes.txt").write_text("scratch")
    (folder / ".model.safetensors.tmp").write_text("half-written")
    assert prepare_upload(name) == folder
    assert upload_files(folder) == ["config.json", "model.safetensors", "tokenizer.json", "metrics.json", "README.md"]
    card = validate_card((folder / "README.md").read_text())
    assert card.data.model_name == PRETRAINED[name].hub_repo
    push_command(name, dry_run=True)
    out = capsys.readouterr().out
    assert f"would upload to http://127.0.0.1:9/{PRETRAINED[name].hub_repo}" in out
    assert "notes.txt" not in out and ".tmp" not in out and "README.md" in out


def test_push_refuses_a_folder_that_does_not_load(hub_env):
    folder = hub_env / "gru_lm_small.shakespeare_char"
    save_tiny(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(SystemExit, match="zoo push: .*tokenizer.json is missing"):
        push_command("gru_lm_small.shakespeare_char", dry_run=True)


def test_push_of_an_unregistered_folder_needs_a_repo_id(tmp_path, hub_env):
    save_tiny(tmp_path / "mine")
    with pytest.raises(SystemExit, match="pass --repo_id"):
        push_command(str(tmp_path / "mine"), dry_run=True)


# --- the Hub round trip against a local olah server ---------------------------------------------

REPO = "zoo-test/tiny-gru"


@pytest.fixture(scope="module")
def olah(tmp_path_factory):
    if olah_executable() is None:
        pytest.skip("olah-cli is not installed (pip install -e '.[dev]'): the Hub round-trip tests need it")
    with OlahServer(tmp_path_factory.mktemp("olah")) as server:
        yield server


@pytest.fixture
def hub(olah, hub_env, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", olah.endpoint)
    return olah


def test_hub_round_trip_by_repo_id_and_pinned_revisions(hub, tmp_path, monkeypatch):
    first = save_tiny(tmp_path / "v1", seed=1, metrics={"val_loss": 3.0})
    write_card(tmp_path / "v1", "tiny-gru", repo_id=REPO)
    sha1 = hub.commit_folder(REPO, tmp_path / "v1", "first weights", tag="v1")

    main = zoo.load(REPO)  # branch main, nothing cached yet
    only_needed = sorted(p.name for p in main.folder.iterdir())
    assert only_needed == sorted(LOAD_FILES), "load must fetch only config, weights and tokenizer"
    by_tag, by_sha = zoo.load(REPO, revision="v1"), zoo.load(REPO, revision=sha1)
    assert by_tag.folder.name == by_sha.folder.name == sha1
    shipped = load_folder(tmp_path / "v1")[0]
    assert all(same_weights(m.model, shipped) for m in (main, by_tag, by_sha))
    assert not same_weights(main.model, first)  # fp16 in the folder: the comparison is not vacuous...
    assert torch.allclose(main.model.head.weight, first.head.weight, atol=1e-3)  # ...but close to the original

    # A second commit: a new download picks it up, the pinned revision keeps the old weights.
    save_tiny(tmp_path / "v2", seed=2)
    sha2 = hub.commit_folder(REPO, tmp_path / "v2", "second weights")
    from zoo.hub import download_snapshot

    assert download_snapshot(REPO, "main").name == sha2
    assert same_weights(zoo.load(REPO).model, load_folder(tmp_path / "v2")[0])
    assert same_weights(zoo.load(REPO, revision=sha1).model, shipped)
    assert same_weights(zoo.load(REPO, revision="v1").model, shipped)

    # Offline, the cache serves what was downloaded and nothing else, at once.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert same_weights(zoo.load(REPO, revision=sha1).model, shipped)
    start = time.monotonic()
    with pytest.raises(ModelNotAvailableError, match="zoo download"):
        zoo.load(REPO, revision="never-pushed")
    assert time.monotonic() - start < 5


def test_registry_name_downloads_its_pinned_revision(hub, tmp_path, monkeypatch):
    repo = "zoo-test/tiny-pinned"
    save_tiny(tmp_path / "v1", seed=3)
    sha1 = hub.commit_folder(repo, tmp_path / "v1", "first")
    save_tiny(tmp_path / "v2", seed=4)
    hub.commit_folder(repo, tmp_path / "v2", "second")
    variant = Variant("tiny_pinned.test", "gru_lm_tiny", "shakespeare_char", "val_loss", revision=sha1, repo_id=repo)
    monkeypatch.setitem(PRETRAINED, variant.name, variant)
    pretrained = load(variant.name)
    assert pretrained.folder.name == sha1
    assert same_weights(pretrained.model, load_folder(tmp_path / "v1")[0])
    with pytest.raises(ModelNotAvailableError, match="not available"):
        load("zoo-test/no-such-repo")


def test_zoo_download_command_then_offline_load_in_fresh_processes(hub, tmp_path):
    """The CLI as a user runs it: HF_ENDPOINT set in the environment, then offline reuse."""
    folder = tmp_path / "v1"
    save_tiny(folder, seed=5, metrics={"val_loss": 2.5})
    write_card(folder, "tiny-cli", repo_id="zoo-test/tiny-cli")
    sha = hub.commit_folder("zoo-test/tiny-cli", folder, "weights", tag="release")
    save_tiny(tmp_path / "later", seed=6)
    hub.commit_folder("zoo-test/tiny-cli", tmp_path / "later", "later weights on main")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_ENDPOINT": hub.endpoint,
           "HF_HUB_CACHE": str(tmp_path / "cache")}
    env.pop("HF_HUB_OFFLINE", None)
    run = subprocess.run([sys.executable, "-m", "zoo.cli", "download", "zoo-test/tiny-cli", "--revision", "release"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    downloaded = Path(run.stdout.strip().splitlines()[-1])
    assert downloaded.name == sha
    assert sorted(p.name for p in downloaded.iterdir()) == sorted(upload_files(folder))
    check = ("import zoo, torch; m = zoo.load('zoo-test/tiny-cli', revision='release').model; "
             "print(sum(float(p.double().sum()) for p in m.parameters()))")
    offline = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120,
                             env={**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert offline.returncode == 0, offline.stderr[-2000:]
    expected = sum(float(p.detach().double().sum()) for p in load_folder(folder)[0].parameters())
    assert float(offline.stdout.strip()) == pytest.approx(expected, rel=1e-9)


# --- the real Hub, only when asked for --------------------------------------------------------


@pytest.mark.skipif(not (os.environ.get("HF_TOKEN") and os.environ.get("ZOO_LIVE_HUB") == "1"),
                    reason="live Hub test: set HF_TOKEN (write access) and ZOO_LIVE_HUB=1 to run it")
def test_live_hub_push_and_download(tmp_path, monkeypatch, capsys):
    from huggingface_hub import HfApi

    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    api = HfApi()
    repo_id = f"{api.whoami()['name']}/zoo-live-test-{os.getpid()}"
    folder = tmp_path / "live"
    save_tiny(folder, metrics={"val_loss": 1.0})
    try:
        push_command(str(folder), repo_id=repo_id, private=True)
        assert "commit:" in capsys.readouterr().out
        assert same_weights(zoo.load(repo_id).model, load_folder(folder)[0])
    finally:
        api.delete_repo(repo_id, missing_ok=True)
