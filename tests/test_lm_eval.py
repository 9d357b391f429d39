"""The zoo LM as an lm-evaluation-harness model: local tasks only (a JSON file and task YAMLs written here),
no network. Skipped when lm_eval is not installed (`pip install -e ".[lm-eval]"`)."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval", reason="lm_eval is not installed; pip install -e '.[lm-eval]'")

from zoo.eval.adapter import ZooLMAdapter  # noqa: E402
from zoo.hub import save_pretrained  # noqa: E402
from zoo.models import build_model  # noqa: E402
from zoo.tokenizers import WordTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["<eos>", "<unk>", "the", "cat", "sat", "on", "mat", "king", "and", "queen", "good", "night", "my", "lord"]
MC_ROWS = [{"context": "the cat sat on the", "choices": [" mat", " king"], "label": 0},
           {"context": "good night my", "choices": [" lord", " cat"], "label": 0},
           {"context": "the king and the", "choices": [" queen", " on"], "label": 1}]
TEXTS = [{"text": "the king and the queen\n"}, {"text": "good night my lord\n"}]


def _task(folder: Path, name: str, rows: list[dict], body: str) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n{body}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny word-level GRU LM folder and three local tasks (multiple choice, perplexity, generation)."""
    root = tmp_path_factory.mktemp("lm_eval")
    torch.manual_seed(0)
    model = build_model("gru_lm_tiny", vocab_size=len(WORDS), dropout=0.0)
    folder = save_pretrained(root / "gru_lm_tiny.tiny_words", model, {"tokenizer": WordTokenizer(WORDS)}, "gru_lm_tiny")
    tasks = root / "tasks"
    tasks.mkdir()
    _task(tasks, "zoo_tiny_mc", MC_ROWS, 'output_type: multiple_choice\ndoc_to_text: "{{context}}"\n'
          'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\n')
    _task(tasks, "zoo_tiny_ppl", TEXTS, 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
          "metric_list:\n  - metric: word_perplexity\n")
    _task(tasks, "zoo_tiny_gen", [{"context": "the king", "target": " and"}],
          'output_type: generate_until\ndoc_to_text: "{{context}}"\ndoc_to_target: "{{target}}"\n'
          'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 4\n  do_sample: false\n'
          "metric_list:\n  - metric: exact_match\n    higher_is_better: true\n")
    return folder, tasks


def test_simple_evaluate_scores_as_the_adapter_does(setup, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from lm_eval.tasks import TaskManager

    from zoo.eval.lm_eval_model import ZooLM

    folder, tasks = setup
    results = lm_eval.simple_evaluate(model=ZooLM(name=str(folder), batch_size=2), tasks=["zoo_tiny_mc", "zoo_tiny_ppl"],
                                      task_manager=TaskManager(include_path=str(tasks)), log_samples=False)["results"]
    adapter = ZooLMAdapter.from_pretrained(folder)
    picks = [max(range(2), key=lambda i: adapter.loglikelihood([(row["context"], row["choices"][i])])[0][0])
             for row in MC_ROWS]
    accuracy = sum(pick == row["label"] for pick, row in zip(picks, MC_ROWS)) / len(MC_ROWS)
    assert results["zoo_tiny_mc"]["acc,none"] == pytest.approx(accuracy)
    # lm-eval's word perplexity: exp(-sum log p / words), words counted as len(re.split(r"\s+", text)).
    logprob = sum(adapter.loglikelihood_rolling([row["text"] for row in TEXTS]))
    words = sum(len(re.split(r"\s+", row["text"])) for row in TEXTS)
    assert results["zoo_tiny_ppl"]["word_perplexity,none"] == pytest.approx(math.exp(-logprob / words), rel=1e-5)


def test_lm_eval_command_line_finds_the_zoo_model(setup, tmp_path):
    folder, tasks = setup
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import subprocess_env

    done = subprocess.run([sys.executable, "-m", "zoo.eval.lm_eval_model", "--model", "zoo", "--model_args",
                           f"name={folder}", "--tasks", "zoo_tiny_gen", "--include_path", str(tasks), "--output_path",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT,
                          env=subprocess_env(HF_DATASETS_OFFLINE=1))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "zoo_tiny_gen" in done.stdout and "exact_match" in done.stdout
    assert list((tmp_path / "out").rglob("results_*.json")), "lm-eval wrote no results file"
