"""Shared fixtures: a tiny data directory with the layout of the real one, and the real one when present.

The fixture corpora are generated, so the tests never need the real data or the network; tests
that read the real corpora skip with a reason when they are absent.
"""

import gzip
import os
import random
import sys
from pathlib import Path

import pytest
import torch

from zoo.data import CORPORA, default_data_dir

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

WORDS = (
    "the king queen lord lady my thy good sir night day love death heart crown sword blood and of to "
    "in is not with what shall will be his her our your come go speak hear"
).split()
DE_EN = [
    ("ein mann", "a man"), ("eine frau", "a woman"), ("ein hund", "a dog"), ("zwei kinder", "two children"),
    ("spielt", "plays"), ("läuft", "runs"), ("im park", "in the park"), ("am strand", "on the beach"),
]


def _lines(rng: random.Random, n_lines: int, words=WORDS) -> list[str]:
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(n_lines)]


def _shakespeare(rng: random.Random, n_chars: int = 6000) -> str:
    text, speakers = [], ["KING", "QUEEN", "LORD", "LADY"]
    while sum(map(len, text)) < n_chars:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        text.append(f"{rng.choice(speakers)}:\n{line.capitalize()}{rng.choice('.,;!?')}\n\n")
    return "".join(text)


def _pairs(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    de, en = [], []
    for _ in range(n):
        parts = rng.sample(DE_EN, rng.randint(2, 3))
        de.append(" ".join(p[0] for p in parts).capitalize() + ".")
        en.append(" ".join(p[1] for p in parts).capitalize() + ".")
    return de, en


def make_data_dir(root: Path, seed: int = 0) -> Path:
    """Write small corpora under `root` with the file layout of `/work/shared/data` (see `zoo.data.CORPORA`)."""
    rng = random.Random(seed)
    files = {}
    files[CORPORA["shakespeare_char"]["files"]["text"]] = _shakespeare(rng)
    for corpus in ("ptb_word", "wikitext2_word"):
        for split, n_lines in (("train", 300), ("val", 40), ("test", 40)):
            lines = _lines(rng, n_lines, WORDS + ["<unk>", "N"])
            files[CORPORA[corpus]["files"][split]] = "".join(f" {line} \n" for line in lines)
    for split, n in (("train", 200), ("val", 20), ("test", 20)):
        de, en = _pairs(rng, n)
        files[CORPORA["multi30k_de_en"]["files"][f"{split}.de"]] = "\n".join(de) + "\n"
        files[CORPORA["multi30k_de_en"]["files"][f"{split}.en"]] = "\n".join(en) + "\n"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
        else:
            path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """A generated data directory with every corpus's files, a few KB each."""
    return make_data_dir(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The real corpora (`ZOO_DATA_DIR` or `../shared/data`); skips when they are not on this machine."""
    data_dir = default_data_dir()
    if data_dir is None or not (data_dir / CORPORA["shakespeare_char"]["files"]["text"]).is_file():
        pytest.skip("real corpora not found: set ZOO_DATA_DIR or place them in ../shared/data")
    return data_dir


# Set by `lightning.seed_everything`; children (DDP ranks, `zoo fit`) would inherit them.
SEED_VARIABLES = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")


@pytest.fixture(autouse=True)
def _isolated():
    """Every test starts from the same seed and leaves Lightning's seed variables as it found them."""
    torch.manual_seed(0)
    random.seed(0)
    before = {name: os.environ.get(name) for name in SEED_VARIABLES}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def subprocess_env(**extra) -> dict:
    """Environment for child processes: this checkout importable, one thread, no network needed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(TESTS), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["HF_HUB_OFFLINE"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


PYTHON = sys.executable
