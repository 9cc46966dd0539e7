"""python -m <package>.predict on a token classifier: tokens and tags per input line, in order, whatever the
batching; words past the model's limit tagged O; bad input lines named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from predict_helpers import prediction_error, predictions, run_predict
from tagging_data import write_rows

from {{ cookiecutter.package_name }}.config import (
    LoraConfig,
)
from {{ cookiecutter.package_name }}.model_type import task
from {{ cookiecutter.package_name }}.task import lora
from {{ cookiecutter.package_name }}.task.hugging_face import (
    load_classifier,
    save_pretrained,
)
from {{ cookiecutter.package_name }}.task.lora import (
    add_adapters,
)
from {{ cookiecutter.package_name }}.task.spec import (
    TaskData,
)

TAGS = ["B-LOC", "B-PER", "I-PER", "O"]
SENTENCES = [
    ["Ada", "Lovelace", "met", "Alan", "in", "Oslo", "."],
    ["Nothing", "happened", "."],
    ["Yesterday"],
    ["The", "weather", "in", "Paris", "was", "fine", "today", "and", "Marie", "flew", "to", "Kyoto", "."],
]


@pytest.fixture(scope="module")
def tagger(demo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as training saves final/: the demo checkpoint with a seeded four-tag head."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    model_dir, final = demo[0] / "model", tmp_path_factory.mktemp("final")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = load_classifier(AutoModelForTokenClassification, str(model_dir), TAGS)
    save_pretrained(model, AutoTokenizer.from_pretrained(model_dir), final)
    return final


def test_predict_writes_the_tokens_and_a_tag_per_word_in_order(tagger: Path, tmp_path: Path) -> None:
    rows = [{"tokens": words, "tags": ["ignored"]} for words in SENTENCES]
    output = tmp_path / "predictions.jsonl"
    alone = [predictions(tagger, Path(write_rows(tmp_path / "one.jsonl", [row])), output)[0] for row in rows]
    for record, words in zip(alone, SENTENCES, strict=True):
        assert record.keys() == {"tokens", "tags"} and record["tokens"] == words
        assert len(record["tags"]) == len(words) and set(record["tags"]) <= set(TAGS)
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", rows))
    for batch_size in ("1", "2", "32"):  # batches are grouped by length: they run in another order
        assert predictions(tagger, inputs, output, "--batch-size", batch_size) == alone


def test_an_adapter_folder_predicts_as_the_merged_final(demo, tagger: Path, tmp_path: Path) -> None:
    """``final/adapter/`` (peft's adapter and the trained head, beside the tagger's config) loads on its
    base checkpoint with the tagger's own number of tags, and tags as the merged ``final/`` does."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    model = AutoModelForTokenClassification.from_pretrained(tagger)
    adapted = add_adapters(model, LoraConfig(r=4, dropout=0.0), seed=0)
    data = TaskData(train=[], val=None, collate=list, label_names=TAGS)
    data.preprocessor = AutoTokenizer.from_pretrained(tagger)
    with torch.no_grad(), torch.random.fork_rng():  # adapters that change the logits: B made non-zero
        torch.manual_seed(0)
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    final = tmp_path / "final"
    adapted.peft_config["default"].base_model_name_or_path = str(demo[0] / "model")
    lora.save_final(task.TASK, adapted, data, final)
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", [{"tokens": words} for words in SENTENCES]))
    merged = predictions(final, inputs, tmp_path / "merged.jsonl")
    assert predictions(final / "adapter", inputs, tmp_path / "adapter.jsonl") == merged
    assert merged != predictions(tagger, inputs, tmp_path / "base.jsonl")  # the adapters count


def test_words_past_the_model_limit_are_tagged_o(tagger: Path, tmp_path: Path) -> None:
    words = ["Lovelace"] * 40  # 8 tokens each: 126 of the demo model's 128 positions reach 16 words
    inputs = Path(write_rows(tmp_path / "long.jsonl", [{"tokens": words}]))
    (record,) = predictions(tagger, inputs, tmp_path / "predictions.jsonl")
    assert len(record["tags"]) == 40 and record["tags"][16:] == ["O"] * 24


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"text": "a"}', "inputs.jsonl:2: missing field 'tokens'"),
        ('{"tokens": "a b"}', "inputs.jsonl:2: field 'tokens' must be a list of strings"),
        ('{"tokens": ["a", 1]}', "inputs.jsonl:2: field 'tokens' must be a list of strings"),
        ('{"tokens": []}', "inputs.jsonl:2: field 'tokens' is an empty list"),
        ("{not json", "inputs.jsonl:2: not valid JSON"),
    ],
)
def test_bad_input_is_one_line_naming_file_and_line(tagger: Path, tmp_path: Path, capsys, line, message):
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", [{"tokens": ["fine"]}, line]))
    assert message in prediction_error(tagger, inputs, capsys)


def test_the_command_line_as_the_readme_shows_it(tagger: Path, tmp_path: Path) -> None:
    inputs = write_rows(tmp_path / "inputs.jsonl", [{"tokens": words} for words in SENTENCES[:2]])
    done = run_predict(str(tagger), inputs, "--output", str(tmp_path / "out.jsonl"))
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
