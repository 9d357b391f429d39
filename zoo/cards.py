"""Model cards (`README.md` with Hub metadata), generated from what was measured, never typed in.

Sources: the registry (corpus, Hub repo, recipe), the folder's `config.json` (architecture and the
`training` record that `zoo export` and `zoo finetune` write: steps, hyper-parameters, command,
wall time, hardware) and its `metrics.json`. The YAML header carries what the Hub reads: license,
datasets, language, tags, library_name, pipeline_tag, base_model and a `model-index` of the metrics.
"""

from pathlib import Path

from zoo.hub import CONFIG_FILE, read_config, resolve_folder_name
from zoo.io import atomic_write_text
from zoo.registry import find_variant, format_count, read_metrics
from zoo.tokenizers import load_tokenizers

CARD_FILE = "README.md"

# corpus -> what the card says about it. License terms: shared/data/SOURCES.md.
CORPORA = {
    "shakespeare_char": {
        "title": "Tiny Shakespeare", "dataset": "karpathy/tiny_shakespeare", "language": ["en"], "license": "mit",
        "terms": "The training text is Shakespeare (public domain) as distributed in the MIT-licensed char-rnn "
                 "repository; the weights are released under the MIT license.",
        "limits": "It knows only the characters of Tiny Shakespeare; text with any other character is refused "
                  "(the character vocabulary has no unknown symbol).",
    },
    "ptb_word": {
        "title": "Penn Treebank (Mikolov)", "dataset": "ptb-text-only/ptb_text_only", "language": ["en"],
        "license": "other", "license_name": "ldc-user-agreement-non-members",
        "license_link": "https://catalog.ldc.upenn.edu/LDC99T42",
        "terms": "Trained on the Penn Treebank (LDC99T42), which is under the LDC User Agreement for "
                 "Non-Members: treat these weights as research-use only; no redistribution rights are assumed.",
        "limits": "Its text is lower-cased Wall Street Journal prose with numbers written N and a 10,000-word "
                  "vocabulary; every other word becomes <unk>.",
    },
    "wikitext2_word": {
        "title": "WikiText-2", "dataset": "Salesforce/wikitext", "language": ["en"], "license": "cc-by-sa-3.0",
        "terms": "Trained on WikiText-2 (CC BY-SA 3.0): attribution and share-alike apply.",
        "limits": "Its vocabulary is WikiText-2's 33,278 words; every other word becomes <unk>.",
    },
    "multi30k_de_en": {
        "title": "Multi30k (WMT16 Task 1, de-en)", "dataset": "bentrevett/multi30k", "language": ["de", "en"],
        "license": "other", "license_name": "multi30k-non-commercial-research",
        "license_link": "https://github.com/multi30k/dataset",
        "terms": "Multi30k is provided solely for non-commercial research and educational use; the weights "
                 "carry the same restriction. Cite Elliott et al. (2016).",
        "limits": "It translates German to English only, and was trained on short image descriptions: "
                  "other text translates poorly.",
    },
}
FAMILIES = {
    "rnn_lm": "an Elman RNN language model",
    "gru_lm": "a GRU language model",
    "transformer": "a decoder-only causal transformer language model (GPT-style, with a KV cache for decoding)",
    "seq2seq": "a GRU encoder-decoder translator with additive (Bahdanau) attention",
}
METRIC_TYPES = {"loss": "loss", "ppl": "perplexity", "bleu": "bleu", "chrf": "chrf", "bpt": "bits", "bpc": "bpc",
                "acc": "accuracy", "accuracy": "accuracy"}
SPLITS = {"val": "validation", "valid": "validation", "validation": "validation", "test": "test", "train": "train"}
SAMPLE_PROMPTS = {"char": ["ROMEO:", "The ", "a"], "word": ["the company said", "the"]}


def describe(config: dict) -> str:
    """One phrase for the model family, e.g. "a GRU language model"."""
    if config["family"] == "seq2seq" and not config["config"].get("attention", True):
        return "a GRU encoder-decoder translator without attention (one fixed context vector)"
    return FAMILIES.get(config["family"], f"a {config['family']} model")


def model_facts(folder, name: str | None = None) -> dict:
    """Everything a card says, gathered from the folder and the registry.

    Keys: name, config, training, metrics, variant, parent, corpus, task, tokenizers, params.
    """
    import torch

    from zoo.models import model_from_config

    folder = Path(folder)
    config = read_config(folder)
    training = config.get("training") or {}
    name = name or folder.name
    variant = find_variant(name)
    parent = training.get("parent") or {}
    corpus = variant.corpus if variant else config.get("corpus") or parent.get("corpus")
    with torch.device("meta"):
        params = sum(p.numel() for p in model_from_config(config["family"], config["config"]).parameters())
    return {
        "name": name, "config": config, "training": training, "metrics": read_metrics(folder), "variant": variant,
        "parent": parent, "corpus": corpus, "task": "translation" if config["family"] == "seq2seq" else "text-generation",
        "tokenizers": load_tokenizers(folder), "params": params,
    }


def _metric_entry(key: str) -> tuple[str, str | None]:
    """`(metric type, dataset split)` of a metrics.json key such as "test_ppl"."""
    words = key.lower().split("_")
    split = SPLITS.get(words[0])
    kind = next((METRIC_TYPES[w] for w in words if w in METRIC_TYPES), key)
    return kind, split


def card_metadata(facts: dict, repo_id: str | None = None):
    """The YAML header as `huggingface_hub.ModelCardData`."""
    from huggingface_hub import EvalResult, ModelCardData

    corpus = CORPORA.get(facts["corpus"], {})
    finetuned = bool(facts["parent"])
    data_name = facts["training"].get("data") or "user text" if finetuned else None
    dataset_type = "custom" if finetuned else corpus.get("dataset", facts["corpus"] or "custom")
    dataset_name = data_name if finetuned else corpus.get("title", facts["corpus"] or "custom")
    results = []
    for key, value in facts["metrics"].items():
        if key.endswith("_before"):  # the parent's score, shown in the text only
            continue
        kind, split = _metric_entry(key)
        results.append(EvalResult(task_type=facts["task"], dataset_type=dataset_type, dataset_name=dataset_name,
                                  metric_type=kind, metric_value=round(value, 4), dataset_split=split,
                                  metric_name=key))
    tags = ["zoo", "pytorch", "lightning", "safetensors", facts["config"]["family"],
            f"{facts['tokenizers'][next(iter(facts['tokenizers']))].kind}-level"]
    if finetuned:
        tags.append("fine-tuned")
    return ModelCardData(
        model_name=repo_id or facts["name"],
        license=corpus.get("license", "unknown"),  # a corpus the card does not know
        license_name=corpus.get("license_name"),
        license_link=corpus.get("license_link"),
        language=corpus.get("language"),
        datasets=None if finetuned or "dataset" not in corpus else [corpus["dataset"]],
        library_name="pytorch",
        pipeline_tag=facts["task"],
        tags=tags,
        base_model=facts["parent"].get("repo_id") if finetuned else None,
        eval_results=results or None,
    )


def _duration(seconds) -> str:
    if seconds is None:
        return "not recorded"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"


def _training_section(facts: dict) -> str:
    training = facts["training"]
    if not training:
        return "## Training\n\nNo training record in config.json (the folder was not written by `zoo export`).\n"
    rows = [
        ("command", f"`{training['command']}`" if training.get("command") else "not recorded"),
        ("optimizer steps", training.get("global_step", "not recorded")),
        ("wall time", _duration(training.get("wall_seconds"))),
        ("hardware", training.get("hardware") or "not recorded"),
        ("torch", training.get("torch") or "not recorded"),
    ]
    if facts["parent"]:
        rows.insert(0, ("fine-tuned from", f"`{facts['parent'].get('name')}`"))
        rows.insert(1, ("on", f"`{training.get('data') or 'user text'}`"))
    hyper = {k: v for k, v in (training.get("hyper_parameters") or {}).items() if not str(k).startswith("_")}
    lines = ["## Training", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    if hyper:
        lines += ["", "Hyper-parameters:", "", "| name | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in sorted(hyper.items())]
    return "\n".join(lines) + "\n"


def _results_section(facts: dict) -> str:
    if not facts["metrics"]:
        return "## Results\n\nNot measured yet (no metrics.json in the folder).\n"
    lines = ["## Results", "", "| metric | value |", "|---|---|"]
    lines += [f"| {key} | {value:.4f} |" for key, value in facts["metrics"].items()]
    return "\n".join(lines) + "\n"


def _prompt(tokenizer) -> str:
    """A sample prompt the tokenizer can encode."""
    for prompt in SAMPLE_PROMPTS.get(tokenizer.kind, ["Hello"]):
        if tokenizer.kind not in SAMPLE_PROMPTS or not tokenizer.unknown(prompt):
            return prompt
    return tokenizer.decode([i for i in range(min(3, tokenizer.vocab_size))])


def _generate_snippet(facts: dict, load_name: str) -> str:
    if facts["task"] == "translation":
        return f'''```python
import torch
import zoo

pretrained = zoo.load({load_name!r})
model, source, target = pretrained.model, pretrained.tokenizers["source"], pretrained.tokenizers["target"]
src = torch.tensor([source.encode("Ein Mann fährt Fahrrad.") + [source.eos_id]])  # (1, S)
encoder_states, src_mask, state = model.encode(src, torch.tensor([src.shape[1]]))
token, output = torch.tensor([target.bos_id]), []  # (1,)
with torch.no_grad():
    for _ in range(40):  # greedy decoding
        logits, state, _ = model.decode_step(token, encoder_states, src_mask, state)
        token = logits.argmax(-1)
        if token.item() == target.eos_id:
            break
        output.append(token.item())
print(target.decode(output))
```'''
    prompt = _prompt(next(iter(facts["tokenizers"].values())))
    return f'''```python
import torch
import zoo

model, tokenizer = zoo.load({load_name!r})
tokens = torch.tensor([tokenizer.encode({prompt!r})])  # (1, T)
state = model.init_state(1)  # hidden state (RNN, GRU) or KV cache (transformer)
output = []
with torch.no_grad():
    logits, state = model(tokens, state)
    for _ in range(50):  # sample with temperature 0.8
        next_token = torch.multinomial(torch.softmax(logits[:, -1] / 0.8, dim=-1), 1)  # (1, 1)
        output.append(next_token.item())
        logits, state = model(next_token, state)
print({prompt!r} + tokenizer.decode(output))
```'''


def _use_section(facts: dict, load_name: str) -> str:
    data_hint = "pairs.tsv" if facts["task"] == "translation" else "my_text.txt"
    data_note = ("a TSV file of `source<TAB>target` lines" if facts["task"] == "translation"
                 else "a plain text file, tokenized with this model's own tokenizer")
    return f"""## Use

```bash
# with the zoo package installed (pip install -e . in a clone of its repository):
zoo download {load_name}   # fills the Hugging Face cache; zoo.load then works offline
```

{_generate_snippet(facts, load_name)}

### Fine-tune

On {data_note} (the last 10% is held out to report the validation loss before and after):

```bash
zoo finetune {load_name} --data {data_hint} --max_steps 300 --out my-model
```

or in Python, with your own `Trainer`:

```python
lit = zoo.lightning_module({load_name!r})  # a LightningModule holding these weights
```
"""


def render_card(folder, name: str | None = None, repo_id: str | None = None, load_name: str | None = None) -> str:
    """The model card text (YAML header + Markdown) of a model folder.

    Args:
        folder: the model folder (config.json, weights, tokenizer, optional metrics.json).
        name: the model's name (default: the folder's name; a registry name adds the registry facts).
        repo_id: the Hub repo it is published as (default: the registry's, for a registered name).
        load_name: what the snippets pass to `zoo.load` (default: the registry name, else the repo id).
    """
    from huggingface_hub import ModelCard

    facts = model_facts(folder, name)
    variant = facts["variant"]
    repo_id = repo_id or (variant.hub_repo if variant else None)
    load_name = load_name or (variant.name if variant else repo_id or str(folder))
    corpus = CORPORA.get(facts["corpus"], {})
    config = facts["config"]
    trained_on = f"fine-tuned from `{facts['parent'].get('name')}`" if facts["parent"] else (
        f"trained on {corpus.get('title', facts['corpus'] or 'an unrecorded corpus')}")
    recipe = f" Recipe: `configs/{variant.name}.yaml`." if variant and variant.recipe.is_file() else ""
    intro = (f"# {facts['name']}\n\n`{facts['name']}` is {describe(config)} ({format_count(facts['params'])} "
             f"parameters, architecture `{config.get('architecture')}`), {trained_on}, from the zoo of sequence models "
             f"that lead from recurrence to attention.{recipe} Weights: `model.safetensors` ({config.get('dtype')}), "
             f"loaded with `strict=True`.\n")
    config_rows = "\n".join(f"| {k} | {v} |" for k, v in config["config"].items())
    limits = " ".join(part for part in (
        corpus.get("limits", ""),
        "A small model: it shows how the architecture behaves, not state-of-the-art quality. "
        "Its output can be wrong or nonsensical, and reflects its training text.",
        "Fine-tuned on user text whose terms also apply." if facts["parent"] else "",
    ) if part)
    body = "\n".join([
        intro,
        f"## Architecture\n\n| field | value |\n|---|---|\n{config_rows}\n",
        _training_section(facts),
        _results_section(facts),
        _use_section(facts, load_name),
        f"## Limits\n\n{limits}\n",
        f"## License\n\n{corpus.get('terms', 'See the license of the training data.')}\n",
    ])
    data = card_metadata(facts, repo_id)
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))


def validate_card(text: str):
    """Parse a card as the Hub would; `ModelCard`, or ValueError naming what is missing."""
    from huggingface_hub import ModelCard

    card = ModelCard(text)
    data = card.data.to_dict()
    missing = [key for key in ("license", "library_name", "pipeline_tag", "tags") if not data.get(key)]
    if data.get("license") == "other" and not data.get("license_name"):
        missing.append("license_name")
    if missing:
        raise ValueError(f"model card metadata lacks {missing}")
    return card


def write_card(folder, name: str | None = None, repo_id: str | None = None) -> Path:
    """(Re)write `folder/README.md` atomically from the folder's config, metrics and the registry."""
    text = render_card(folder, name, repo_id)
    validate_card(text)
    path = Path(folder) / CARD_FILE
    atomic_write_text(path, text)
    return path


def card_command(name: str, repo_id: str | None = None) -> None:
    """(Re)write the model card README.md of a shipped model (checkpoints/NAME) or of a model folder.

    Args:
        name: a registry name (see `zoo list`) or the path of a model folder.
        repo_id: the Hub repo the card names (default: the registry's).
    """
    from zoo.hub import user_errors

    with user_errors("card"):
        folder, model_name = resolve_folder_name(name)
        if not (folder / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{folder} has no {CONFIG_FILE}: {model_name} is not exported yet; train and "
                                    "export it first (scripts/train_checkpoints.sh NAME)")
        path = write_card(folder, model_name, repo_id)
    print(f"wrote {path}")
