"""Token classification's metrics equal seqeval's: the project's own entity reading against seqeval's
``get_entities`` and its micro precision, recall and F1 on thousands of random (and malformed) tag
sequences; evaluation sums over batches against seqeval on the same predictions; and a two-process run's
figures, on a validation set that does not divide evenly, against seqeval over the whole set."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pytest
import torch
from conftest import read_metrics, run_launch
from tagging_data import TAGS, noisy_copy, random_sentences
from transformers import AutoModelForTokenClassification

from {{ cookiecutter.package_name }}.model_type import scoring
from {{ cookiecutter.package_name }}.model_type.entities import (
    entities,
    entity_counts,
    entity_scores,
    is_tag,
)
from {{ cookiecutter.package_name }}.model_type.predict import (
    Tagger,
)
from {{ cookiecutter.package_name }}.model_type.task import (
    load_tokenizer,
)

seqeval = pytest.importorskip("seqeval.metrics", reason="seqeval proves the metrics: pip install seqeval")
from seqeval.metrics.sequence_labeling import get_entities  # noqa: E402


def seqeval_figures(truth: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    with warnings.catch_warnings():  # seqeval warns where a figure is 0 for want of entities
        warnings.simplefilter("ignore")
        return {
            "eval_precision": seqeval.precision_score(truth, predicted),
            "eval_recall": seqeval.recall_score(truth, predicted),
            "eval_f1": seqeval.f1_score(truth, predicted),
            "eval_accuracy": seqeval.accuracy_score(truth, predicted),
        }


def project_figures(truth: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    counts = [sum(column) for column in zip(*map(entity_counts, truth, predicted), strict=True)]
    words = sum(len(tags) for tags in truth)
    correct = sum(
        a == b for tags, guess in zip(truth, predicted, strict=True) for a, b in zip(tags, guess, strict=True)
    )
    return {**entity_scores(*counts), "eval_accuracy": correct / words}


def test_the_tags_of_the_tests_are_all_well_formed_and_others_are_not() -> None:
    assert all(is_tag(tag) for tag in TAGS)
    assert not any(is_tag(tag) for tag in ["PER", "B-", "B_PER", "L-PER", "U-PER", "o", "", "X-PER"])


def test_entities_are_seqevals_on_random_and_malformed_sequences() -> None:
    rng = random.Random(0)
    sentences = random_sentences(rng, 5000)
    sentences += [["I-PER"], ["O", "I-PER", "I-PER"], ["B-PER", "I-LOC"], ["E-PER", "E-PER"]]
    sentences += [["S-LOC", "I-LOC"], ["B-PER", "S-PER", "E-PER"], ["I-LOC", "O", "E-LOC"]]
    for tags in sentences:
        assert entities(tags) == set(get_entities(tags)), tags


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.5, 1.0])
def test_the_figures_are_seqevals_to_the_last_bit(rate: float) -> None:
    rng = random.Random(int(rate * 10))
    for _ in range(200):
        truth = random_sentences(rng, rng.randint(1, 12))
        truth[0] = truth[0] or ["O"]  # at least one word
        predicted = noisy_copy(rng, truth, rate)
        assert project_figures(truth, predicted) == seqeval_figures(truth, predicted)


def test_no_entities_anywhere_gives_zeros_as_seqeval_does() -> None:
    truth, predicted = [["O", "O"]], [["O", "O"]]
    assert project_figures(truth, predicted) == seqeval_figures(truth, predicted)


def test_split_sentences_count_as_the_whole_set() -> None:
    """Sums over any split of the sentences (ranks, batches) give the figures of the whole set."""
    rng = random.Random(1)
    truth = random_sentences(rng, 101)
    truth = [tags or ["O"] for tags in truth]
    predicted = noisy_copy(rng, truth, 0.3)
    parts = [slice(0, 17), slice(17, 50), slice(50, 101)]
    sums = [0, 0, 0]
    for part in parts:
        counts = zip(*map(entity_counts, truth[part], predicted[part]), strict=True)
        for index, count in enumerate(map(sum, counts)):
            sums[index] += count
    expected = seqeval_figures(truth, predicted)
    del expected["eval_accuracy"]
    assert entity_scores(*sums) == expected


def test_evaluation_sums_over_batches_are_seqevals_of_the_same_predictions(demo, tmp_path: Path) -> None:
    """The task's own evaluation, batch by batch, against seqeval on the predictions the same forwards make
    (words past data.max_length included: they count as O)."""
    from tagging_data import task_data

    rows = [json.loads(line) for line in (demo[0] / "val.jsonl").read_text().splitlines()]
    data = task_data(demo, tmp_path, rows, rows, "data.max_length=12")
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(
        demo[0] / "model", num_labels=len(data.label_names), id2label=dict(enumerate(data.label_names))
    ).eval()
    names, outside = data.label_names, data.label_names.index("O")
    totals = dict.fromkeys(scoring.SUM_NAMES, 0.0)
    truth, predicted = [], []
    samples = [data.val[index] for index in range(len(data.val))]
    with torch.no_grad():
        for start in range(0, len(samples), 7):
            batch = data.collate(samples[start : start + 7])
            for key, value in scoring.evaluation_sums(model, batch).items():
                totals[key] += value.item()
            guesses = scoring.word_predictions(scoring.logits(model, batch), batch, outside)
            for tags, guess in zip(batch["word_tags"].tolist(), guesses.tolist(), strict=True):
                words = sum(tag >= 0 for tag in tags)
                truth.append([names[tag] for tag in tags[:words]])
                predicted.append([names[tag] for tag in guess[:words]])
    assert [tags for tags in truth] == [row["tags"] for row in rows]  # every sentence once, whole
    assert totals["words"] > totals["seen_words"]  # some words lie past data.max_length
    figures = scoring.evaluation_metrics(totals)
    expected = seqeval_figures(truth, predicted)
    assert {key: figures[key] for key in expected} == expected
    assert totals["predicted_entities"] > 0 and totals["true_entities"] > 0


@pytest.mark.slow
def test_two_processes_report_seqevals_figures_over_the_whole_validation_set(demo, tmp_path: Path) -> None:
    """101 validation sentences on 2 ranks (51 and 50): the logged figures are seqeval's over all 101,
    tagged by the final model as predict tags them."""
    output_dir = tmp_path / "run"
    overrides = [*demo[1], f"output_dir={output_dir}", "train.precision=fp32", "train.epochs=1"]
    result = run_launch(overrides, nproc=2)
    assert result.returncode == 0, result.stderr[-4000:]
    logged = [record for record in read_metrics(output_dir) if "eval_f1" in record][-1]
    rows = [json.loads(line) for line in (demo[0] / "val.jsonl").read_text().splitlines()]
    assert len(rows) % 2 == 1
    final = output_dir / "final"
    model = AutoModelForTokenClassification.from_pretrained(final).eval()
    tagger = Tagger(model, load_tokenizer(final), torch.device("cpu"))
    with torch.no_grad():
        records = tagger.predict(tagger.prepare([row["tokens"] for row in rows]))
    truth, predicted = [row["tags"] for row in rows], [record["tags"] for record in records]
    expected = seqeval_figures(truth, predicted)
    assert {key: logged[key] for key in expected} == pytest.approx(expected, rel=1e-12)
    assert 0 < logged["eval_f1"] < 1  # entities found and missed: the comparison has teeth
