"""python -m <package>.predict on a sequence-to-sequence model: a target per source in order, what
evaluation generates by default, its own settings on request, and one line for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ON_THIS_MACHINE, read_metrics
from inprocess import fit
from pair_data import ENV, config_of, demo_rows, write_rows
from predict_helpers import prediction_error, predictions, run_predict

from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.data.loader import (
    to_device,
)
from {{ cookiecutter.package_name }}.model_type import (
    task,
)

SOURCES = [
    "The cat saw the red ball in the park.",
    "A dog",
    "My sister helped the old man at home by the sea.",
]


@pytest.fixture(scope="module")
def saved(demo, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, object]:
    """The final/ of a short run on the demo in this process (its settings recorded), with the run's
    validation data and the model as evaluation builds it from that folder."""
    directory = tmp_path_factory.mktemp("saved")
    settings = ["eval.max_new_tokens=9", "data.source_prefix='gist: '"]
    # Every parameter trains (lora=null), whatever the render's finetune answer: adapters on the demo's
    # random base learn too little in two epochs to tell sources apart.
    fit([*ON_THIS_MACHINE, *demo[1], f"output_dir={directory}", "train.epochs=2", "lora=null", *settings])
    config = config_of(demo, directory / "again", f"model.pretrained={directory / 'final'}", *settings)
    data = task.build_data(config, ENV)
    return directory / "final", data, task.build_model(config, data).eval()


def test_predict_writes_a_target_per_source_in_order(saved, tmp_path: Path) -> None:
    final, output = saved[0], tmp_path / "predictions.jsonl"
    rows = [{"source": source, "target": "ignored"} for source in SOURCES]
    alone = [predictions(final, Path(write_rows(tmp_path / "one.jsonl", [row])), output)[0] for row in rows]
    assert all(record.keys() == {"target"} and isinstance(record["target"], str) for record in alone)
    assert len({record["target"] for record in alone}) > 1  # so that the order shows
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", rows))
    for batch_size in ("1", "2", "32"):  # grouped by length and padded: the records must not change
        assert predictions(final, inputs, output, "--batch-size", batch_size) == alone


def test_predict_generates_by_default_what_evaluation_generates(demo, saved, tmp_path: Path) -> None:
    """The saved prefix, source length, max_new_tokens and beams: evaluation's own generation."""
    final, data, model = saved
    references = [data.val[index] for index in range(len(data.val))]
    batch = to_device(data.collate(references), torch.device("cpu"))
    with torch.no_grad():
        evaluated = task.generate_texts(model, data.preprocessor, batch["input_ids"], batch["attention_mask"])
    sources = [row["source"] for row in demo_rows(demo, "val", len(references))]
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", [{"source": source} for source in sources]))
    assert [record["target"] for record in predictions(final, inputs, tmp_path / "out.jsonl")] == evaluated
    shorter = predictions(
        final, inputs, tmp_path / "shorter.jsonl", "--max-new-tokens", "2", "--num-beams", "2"
    )
    assert all(
        len(data.preprocessor(record["target"], add_special_tokens=False)["input_ids"]) <= 2
        for record in shorter
    )
    assert [record["target"] for record in shorter] != evaluated


def test_predict_from_the_adapter_folder_writes_what_final_writes(demo, tmp_path: Path) -> None:
    """A LoRA run's final/adapter/ (the base plus the adapter) carries the run's settings as final/ does."""
    settings = ["eval.max_new_tokens=5", "eval.num_beams=2", "data.source_prefix='gist: '"]
    fit([*ON_THIS_MACHINE, *demo[1], f"output_dir={tmp_path}", "train.max_steps=6", "lora.r=4", *settings])
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", [{"source": source} for source in SOURCES]))
    merged = predictions(tmp_path / "final", inputs, tmp_path / "merged.jsonl")
    assert predictions(tmp_path / "final" / "adapter", inputs, tmp_path / "adapter.jsonl") == merged


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"source": "fine"}, {"source": 5}], "inputs.jsonl:2: field 'source' must be a string"),
        ([{"source": "fine"}, "{not json"], "inputs.jsonl:2: not valid JSON"),
        ([{"target": "x"}], "inputs.jsonl:1: missing field 'source'"),
        ([{"source": "fine"}, {"source": " "}], "inputs.jsonl:2: field 'source' is empty; give every line"),
    ],
)
def test_predict_refuses_bad_input_in_one_line(saved, tmp_path: Path, capsys, rows, message: str) -> None:
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", rows))
    assert message in prediction_error(saved[0], inputs, capsys)


def test_predict_refuses_a_model_without_the_training_settings(demo, tmp_path: Path, capsys) -> None:
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", [{"source": "fine"}]))
    assert "does not say how training prepared the sources" in prediction_error(
        demo[0] / "model", inputs, capsys
    )


@pytest.mark.slow
def test_the_trained_demo_writes_the_gist_of_each_sentence(demo, trained: Path, tmp_path: Path) -> None:
    """The README's command on the two-process demo run (2 epochs): over a third of the reference words."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    assert AutoModelForSeq2SeqLM.from_pretrained(trained / "final") is not None
    assert AutoTokenizer.from_pretrained(trained / "final") is not None
    val = demo[0] / "val.jsonl"
    rows = [json.loads(line) for line in val.read_text(encoding="utf-8").splitlines()]
    output = tmp_path / "predictions.jsonl"
    result = run_predict(str(trained / "final"), str(val), "--output", str(output))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(rows)
    words = [
        set(record["target"].split()) & set(row["target"].split())
        for record, row in zip(records, rows, strict=True)
    ]
    evals = [record for record in read_metrics(trained) if "eval_loss" in record]
    if load_config([]).lora is None:
        assert sum(map(len, words)) > sum(len(row["target"].split()) for row in rows) / 3  # untrained: ~0.1
    else:  # adapters on the demo's random base (finetune=lora) learn slowly, but they learn
        assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
