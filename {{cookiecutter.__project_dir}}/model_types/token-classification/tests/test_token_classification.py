"""Token classification: the JSON Lines format, tag mapping, words split into sub-words (the first carries
the tag), words past data.max_length, bad-data errors, dynamic padding, final/."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import METRIC, read_metrics, run_launch
from tagging_data import ENV, config_of, demo_rows, samples_of, task_data, write_rows

from {{ cookiecutter.package_name }}.data.loader import DataError
from {{ cookiecutter.package_name }}.model_type import task
from {{ cookiecutter.package_name }}.model_type.alignment import (
    IGNORE,
    UNSEEN,
    Collator,
    word_starts,
)

ROWS = [
    {"tokens": ["Ada", "met", "Alan", "Turing"], "tags": ["B-PER", "O", "B-PER", "I-PER"]},
    {"tokens": ["Oslo", "."], "tags": ["B-LOC", "O"]},
]


def test_tags_get_sorted_ids_saved_as_label_names(demo, tmp_path: Path) -> None:
    data = task_data(demo, tmp_path, ROWS, ROWS[1:])
    assert data.label_names == ["B-LOC", "B-PER", "I-PER", "O"]
    assert [tags for _, _, tags in samples_of(data.train)] == [[1, 3, 1, 2], [0, 3]]
    assert [tags for _, _, tags in samples_of(data.val)] == [[0, 3]]


def test_each_word_is_tagged_on_its_first_sub_word(demo, tmp_path: Path) -> None:
    """The demo's names are not in its vocabulary: each splits into characters (## pieces)."""
    data = task_data(demo, tmp_path, ROWS)
    tokenizer = data.preprocessor
    ids, starts, tags = samples_of(data.train)[0]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    assert [pieces[start] for start in starts] == ["A", "met", "A", "T"]  # Ada, met, Alan, Turing
    assert pieces[starts[0] + 1] == "##d"  # a word of several tokens
    batch = Collator(tokenizer.pad_token_id)([(ids, starts, tags)])
    labels = batch["labels"][0].tolist()
    assert [labels[start] for start in starts] == tags
    assert sum(label != IGNORE for label in labels) == 4  # one per word: no sub-word or special token


def test_word_starts_from_word_ids_mark_words_without_tokens() -> None:
    assert word_starts([None, 0, 0, 2, None], 4) == [1, UNSEEN, 3, UNSEEN]


def test_words_past_max_length_keep_their_tags_but_get_no_label(demo, tmp_path: Path) -> None:
    long = {"tokens": ["Ada"] * 20, "tags": ["B-PER"] * 20}
    data = task_data(demo, tmp_path, [long], [long], "data.max_length=10")
    ids, starts, tags = samples_of(data.val)[0]
    assert len(ids) == 10 and len(tags) == 20  # every word's tag is kept for the metrics
    # [CLS] A ##d ##a A ##d ##a A ##d [SEP]: the third word is cut, but its first token is in
    assert starts[:3] == [1, 4, 7] and starts[3:] == [UNSEEN] * 17
    batch = data.collate([(ids, starts, tags)])
    assert int((batch["labels"] != IGNORE).sum()) == 3


def test_batches_are_padded_to_their_own_longest_sample() -> None:
    batch = Collator(pad_token_id=0)([([5, 6, 7], [1, UNSEEN], [2, 1]), ([8], [0], [3])])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 2, IGNORE], [3, IGNORE, IGNORE]]
    assert batch["word_tags"].tolist() == [[2, 1], [3, UNSEEN]]
    assert batch["word_starts"].tolist() == [[1, UNSEEN], [0, UNSEEN]]


GOOD = {"tokens": ["a", "b"], "tags": ["O", "B-X"]}
NOT_LIST = "must be a list of strings"


@pytest.mark.parametrize(
    ("train", "val", "message"),
    [
        ([GOOD, "{not json"], None, "train.jsonl:2: not valid JSON"),
        ([GOOD, {"tokens": ["a"]}], None, "train.jsonl:2: missing field 'tags'"),
        ([{"tags": ["O"]}], None, "train.jsonl:1: missing field 'tokens'"),
        ([GOOD, {"tokens": ["a", "b", "c"], "tags": ["O", "O"]}], None, "train.jsonl:2: 3 tokens but 2 tags"),
        ([GOOD, {"tokens": [], "tags": []}], None, "train.jsonl:2: field 'tokens' is an empty list"),
        ([GOOD, {"tokens": ["a", 5], "tags": ["O", "O"]}], None, f"train.jsonl:2: field 'tokens' {NOT_LIST}"),
        ([GOOD, {"tokens": "a b", "tags": ["O", "O"]}], None, f"train.jsonl:2: field 'tokens' {NOT_LIST}"),
        ([GOOD, {"tokens": ["a"], "tags": [1]}], None, f"train.jsonl:2: field 'tags' {NOT_LIST}"),
        ([{"tokens": "a b", "tags": "O O"}], None, f"train.jsonl:1: field 'tokens' {NOT_LIST}"),
        ([GOOD, {"tokens": ["a"], "tags": None}], None, f"train.jsonl:2: field 'tags' {NOT_LIST}"),
        ([GOOD, {"tokens": ["a"], "tags": ["PER"]}], None, "train.jsonl:2: tag 'PER' is not O, or B-, I-,"),
        ([GOOD], [GOOD, {"tokens": ["a"], "tags": ["B-Y"]}], "val.jsonl:2: tag 'B-Y' never appears in"),
        ([], None, "train.jsonl: no records"),
    ],
)  # fmt: skip
def test_bad_data_names_file_and_line(demo, tmp_path: Path, train, val, message: str) -> None:
    with pytest.raises(DataError) as error:
        task_data(demo, tmp_path, train, val)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_several_processes_tokenize_as_one_and_a_rerun_reads_the_cache(
    demo, tmp_path: Path, monkeypatch
) -> None:
    directory, _ = demo
    files = [f"data.train_file={directory / 'train.jsonl'}", f"data.val_file={directory / 'val.jsonl'}"]
    one = task.build_data(config_of(demo, tmp_path / "one", *files, "data.preprocessing_processes=1"), ENV)
    two = task.build_data(config_of(demo, tmp_path / "two", *files, "data.preprocessing_processes=2"), ENV)
    (folder,) = (tmp_path / "two" / "out" / "cache").glob("token-classification-*")
    assert len(list(folder.glob("train_*_of_00002.arrow"))) == 2
    assert samples_of(two.train) == samples_of(one.train) and samples_of(two.val) == samples_of(one.val)

    def no_tokenizing(self, batch):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(task.Tokenize, "__call__", no_tokenizing)
    again = task.build_data(config_of(demo, tmp_path / "one", *files, "data.preprocessing_processes=1"), ENV)
    assert samples_of(again.train) == samples_of(one.train) and again.label_names == one.label_names
    with pytest.raises(AssertionError, match="tokenized again"):  # other settings: other tokens
        task.build_data(config_of(demo, tmp_path / "one", *files, "data.max_length=8"), ENV)


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json"])
def test_csv_parquet_and_json_files_read_like_json_lines(demo, tmp_path: Path, suffix: str) -> None:
    import pandas as pd

    rows = demo_rows(demo)
    reference = task_data(demo, tmp_path / "jsonl", rows, rows[:10])
    frames = [pd.DataFrame(rows), pd.DataFrame(rows[:10])]
    if suffix == ".csv":  # a cell holds no list: words and tags separated by spaces
        frames = [frame.map(" ".join) for frame in frames]
    paths = [tmp_path / f"train{suffix}", tmp_path / f"val{suffix}"]
    for frame, path in zip(frames, paths, strict=True):
        if suffix == ".json":  # one JSON array, not lines
            frame.to_json(path, orient="records")
        else:
            {".csv": frame.to_csv, ".parquet": frame.to_parquet}[suffix](path, index=False)
    files = [f"data.train_file={paths[0]}", f"data.val_file={paths[1]}"]
    data = task.build_data(config_of(demo, tmp_path / "other", *files), ENV)
    assert samples_of(data.train) == samples_of(reference.train)
    assert samples_of(data.val) == samples_of(reference.val)
    assert data.label_names == reference.label_names


def test_a_hub_dataset_with_class_id_tags_reads_their_names(demo, tmp_path: Path) -> None:
    """conll2003's layout: tags as Sequence(ClassLabel); other field names, a saved DatasetDict."""
    import datasets

    rows = demo_rows(demo)
    names = sorted({tag for row in rows for tag in row["tags"]}, reverse=True)  # ids not in sorted order
    words, tags = datasets.List(datasets.Value("string")), datasets.List(datasets.ClassLabel(names=names))
    features = datasets.Features({"words": words, "ner": tags})
    split = {
        "words": [row["tokens"] for row in rows],
        "ner": [[names.index(tag) for tag in row["tags"]] for row in rows],
    }
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        train=datasets.Dataset.from_dict(split, features=features),
        validation=datasets.Dataset.from_dict(split, features=features),
    ).save_to_disk(str(saved))
    reference = task_data(demo, tmp_path / "jsonl", rows, rows)
    keys = [f"data.hub_dataset={saved}", "data.tokens_field=words", "data.tags_field=ner"]
    data = task.build_data(config_of(demo, tmp_path / "hub", *keys), ENV)
    assert data.label_names == reference.label_names
    assert samples_of(data.train) == samples_of(reference.train) == samples_of(data.val)


@pytest.mark.slow
def test_final_model_loads_with_auto_classes_and_keeps_tag_names(trained: Path) -> None:
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    final = trained / "final"
    model = AutoModelForTokenClassification.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    tags = ["B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O"]
    assert model.config.id2label == dict(enumerate(tags))
    assert model.config.label2id == {tag: index for index, tag in enumerate(tags)}
    with torch.no_grad():
        encoded = tokenizer(["Ada", "met", "Alan"], is_split_into_words=True, return_tensors="pt")
        logits = model(**encoded).logits
    assert logits.shape[-1] == len(tags)
    last = read_metrics(trained)[-1]
    assert {"eval_precision", "eval_recall", "eval_accuracy", "eval_loss"} <= last.keys()
    assert last[METRIC] > 0.3  # the demo is learnable


@pytest.mark.slow
def test_a_bad_record_ends_launch_in_one_line_naming_it(demo, tmp_path: Path) -> None:
    rows = ['{"tokens": ["a", "b"], "tags": ["O", "B-X"]}'] * 30 + ['{"tokens": ["a", "b"], "tags": ["O"]}']
    bad = write_rows(tmp_path / "bad.jsonl", rows)
    result = run_launch([*demo[1], f"data.train_file={bad}", f"output_dir={tmp_path / 'out'}"])
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}:31: 2 tokens but 1 tags"), errors
    assert not (tmp_path / "out" / "checkpoints").exists()
