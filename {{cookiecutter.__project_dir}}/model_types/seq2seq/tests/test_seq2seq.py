"""Sequence to sequence: the loss per target token, BLEU and ROUGE-L exact over any split of the validation
set, the data read from every source with one-line errors, and a trained demo run."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from conftest import read_metrics, run_launch
from pair_data import ENV, config_of, data_of, demo_rows, evaluation_totals, samples_of

from {{ cookiecutter.package_name }}.data.loader import (
    DataError,
)
from {{ cookiecutter.package_name }}.model_type import (
    generation,
    task,
    text_metrics,
)

WORDS = "the a cat dog saw found red blue ball box in park at home by sea".split()  # noqa: SIM905


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 9)))


def library_scores(predictions: list[str], references: list[str]) -> tuple[float, float]:
    """sacreBLEU's corpus BLEU and rouge-score's mean ROUGE-L F-measure, each run once over everything."""
    from rouge_score.rouge_scorer import RougeScorer
    from sacrebleu.metrics import BLEU

    scorer = RougeScorer(["rougeL"])
    pairs = zip(predictions, references, strict=True)
    rouge = [scorer.score(reference, prediction)["rougeL"].fmeasure for prediction, reference in pairs]
    return BLEU().corpus_score(predictions, [references]).score, math.fsum(rouge) / len(rouge)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bleu_and_rouge_of_summed_chunks_equal_the_libraries_run_once(seed: int) -> None:
    rng = random.Random(seed)
    references = [sentence(rng) or "x" for _ in range(37)]
    predictions = [sentence(rng) if rng.random() < 0.7 else ref for ref in references]
    cuts = sorted(rng.sample(range(1, 37), 5))
    totals = text_metrics.no_text_sums()
    for start, end in zip([0, *cuts], [*cuts, 37], strict=True):  # uneven chunks, as ranks' batches are
        for name, value in text_metrics.text_sums(predictions[start:end], references[start:end]).items():
            totals[name] += value
    bleu, rouge = library_scores(predictions, references)
    metrics = text_metrics.generation_metrics(totals)
    assert metrics["eval_bleu"] == bleu
    assert metrics["eval_rougeL"] == pytest.approx(rouge, rel=1e-12)
    assert 0 < bleu < 100 and 0 < rouge < 1


def test_nothing_generated_reports_no_generation_metrics() -> None:
    assert text_metrics.generation_metrics(text_metrics.no_text_sums()) == {}


@pytest.mark.parametrize("world_size", [2, 3])
def test_distributed_evaluation_equals_the_libraries_over_the_whole_validation_set(
    demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world_size: int
) -> None:
    """41 validation samples in batches of 4 (11 batches, dealt unevenly over the ranks): the reduced sums
    give the metrics of the libraries run once over every generated target, for any world size."""
    config = config_of(demo, tmp_path, "data.eval_batch_size=4", "eval.max_new_tokens=6")
    data = task.build_data(config, ENV)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = task.build_model(config, data).eval()
    generated: list[str] = []
    real = task.generate_texts

    def recording(*args, **kwargs) -> list[str]:
        texts = real(*args, **kwargs)
        generated.extend(texts)
        return texts

    monkeypatch.setattr(task, "generate_texts", recording)
    totals = evaluation_totals(model, data, world_size, batch_size=4)
    references = [data.val[index][2] for index in evaluated_order(data, world_size)]
    metrics = task.evaluation_metrics(totals)
    bleu, rouge = library_scores(generated, references)
    assert len(generated) == len(data.val) == 41 and totals["generated"] == 41
    assert metrics["eval_bleu"] == bleu and metrics["eval_rougeL"] == pytest.approx(rouge, rel=1e-12)
    assert totals == evaluation_totals(model, data, 1, batch_size=4)  # bitwise, whatever the world size


def evaluated_order(data, world_size: int) -> list[int]:
    """The validation samples in the order evaluation_totals generates them: rank by rank."""
    from {{ cookiecutter.package_name }}.data.sampling import EvalBatches
    from {{ cookiecutter.package_name }}.parallel.process_group import DistEnv

    order = []
    for rank in range(world_size):
        env = DistEnv(rank=rank, local_rank=rank, world_size=world_size, device=torch.device("cpu"))
        for indices in EvalBatches(len(data.val), 4, env, lengths=data.val_lengths):
            order.extend(indices)
    return order


def test_generation_metrics_can_be_switched_off(demo, tmp_path: Path) -> None:
    config = config_of(demo, tmp_path, "eval.generation_metrics=false")
    data = task.build_data(config, ENV)
    model = task.build_model(config, data).eval()
    with torch.no_grad():
        sums = task.evaluation_sums(model, data.collate([data.val[0], data.val[1]]))
    metrics = task.evaluation_metrics({name: float(value) for name, value in sums.items()})
    assert metrics.keys() == {"eval_loss", "eval_perplexity"}


def test_the_loss_is_summed_over_target_tokens_and_counted_per_token(demo, tmp_path: Path) -> None:
    """Targets of different lengths: the loss sum over two micro-batches divided by their target tokens is
    the mean over every target token of both, which a mean of per-batch means is not."""
    data = task.build_data(config_of(demo, tmp_path), ENV)
    model = task.build_model(config_of(demo, tmp_path), data).eval()
    items = [data.train[i] for i in range(6)]
    first, second = data.collate(items[:1]), data.collate(items[1:])
    whole = data.collate(items)
    with torch.no_grad():
        summed = task.loss_sum(model, first) + task.loss_sum(model, second)
        counted = task.count_targets(first) + task.count_targets(second)
        reference = model(
            input_ids=whole["input_ids"], attention_mask=whole["attention_mask"], labels=whole["labels"]
        ).loss
    assert counted == task.count_targets(whole) == sum(len(item[1]) for item in items)
    assert (summed / counted).item() == pytest.approx(reference.item(), rel=1e-5)


def test_sources_get_the_prefix_and_targets_end_with_end_of_text(demo, tmp_path: Path) -> None:
    rows = [{"text_in": "The cat saw the red ball.", "text_out": "the cat"}] * 3
    fields = ["data.source_field=text_in", "data.target_field=text_out", "data.source_prefix='gist: '"]
    data = data_of(demo, tmp_path, rows, rows, *fields)
    tokenizer = data.preprocessor
    source, target, reference = data.val[0]
    assert tokenizer.decode(source, skip_special_tokens=True) == "gist: The cat saw the red ball."
    assert target[-1].item() == tokenizer.eos_token_id and reference == "the cat"
    batch = data.collate([data.train[0], data.train[1]])
    assert batch["decoder_input_ids"][:, 0].tolist() == [2, 2]  # the demo BART's decoder start
    assert torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1])


def test_long_targets_are_cut_and_keep_their_end(demo, tmp_path: Path) -> None:
    rows = [{"source": "a b", "target": " ".join(["the red ball"] * 20)}]
    data = data_of(demo, tmp_path, rows, None, "data.max_target_length=8")
    target = data.train[0][1]
    assert len(target) == 8 and target[-1].item() == data.preprocessor.eos_token_id


def test_csv_parquet_and_a_hub_dataset_folder_read_like_json_lines(demo, tmp_path: Path) -> None:
    import datasets

    rows = demo_rows(demo)
    reference = data_of(demo, tmp_path / "jsonl", rows, rows[:7])
    table = datasets.Dataset.from_list(rows)
    table.to_csv(tmp_path / "train.csv", index=False)
    table.to_parquet(tmp_path / "train.parquet")
    for name in ("train.csv", "train.parquet"):
        config = config_of(
            demo, tmp_path / f"run-{name}", f"data.train_file={tmp_path / name}", "data.val_file="
        )
        assert samples_of(task.build_data(config, ENV).train) == samples_of(reference.train), name
    datasets.DatasetDict(train=table, validation=datasets.Dataset.from_list(rows[:7])).save_to_disk(
        tmp_path / "saved"
    )
    data = task.build_data(config_of(demo, tmp_path / "hub", f"data.hub_dataset={tmp_path / 'saved'}"), ENV)
    assert samples_of(data.train) == samples_of(reference.train)
    assert samples_of(data.val) == samples_of(reference.val)


GOOD = {"source": "The cat saw the red ball.", "target": "the cat"}


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ([GOOD, '{"source": "cut sho'], "train.jsonl:2: not valid JSON"),
        ([GOOD, {"source": "a"}], "train.jsonl:2: missing field 'target'"),
        ([GOOD, {"target": "a"}], "train.jsonl:2: missing field 'source'"),
        ([GOOD, {"source": "a", "target": 3}], "train.jsonl:2: field 'target' must be a string"),
        ([GOOD, {"source": ["a"], "target": "b"}], "train.jsonl:2: field 'source' must be a string"),
        ([GOOD, {"source": "a", "target": "  "}], "train.jsonl:2: field 'target' is empty; give every"),
        ([GOOD, GOOD, {"source": "", "target": "b"}], "train.jsonl:3: field 'source' is empty; give every"),
    ],
)
def test_bad_data_names_the_file_the_line_and_the_fix(demo, tmp_path: Path, train, message: str) -> None:
    with pytest.raises(DataError) as error:
        data_of(demo, tmp_path, train)
    assert message in str(error.value)


def test_bad_csv_rows_are_named_by_row(demo, tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    train.write_text("source,target\ngood,fine\nalso good,\n")
    with pytest.raises(DataError, match=r"train\.csv: row 2: missing field 'target'"):
        task.build_data(config_of(demo, tmp_path, f"data.train_file={train}", "data.val_file="), ENV)


def test_the_generation_settings_are_saved_with_the_model(demo, tmp_path: Path) -> None:
    config = config_of(
        demo, tmp_path, "eval.max_new_tokens=7", "eval.num_beams=3", "data.source_prefix='go: '"
    )
    model = task.build_model(config, task.build_data(config, ENV))
    task.save_final(model, task.build_data(config, ENV), tmp_path / "final")
    from transformers import AutoConfig, GenerationConfig

    saved = GenerationConfig.from_pretrained(tmp_path / "final")
    assert (saved.max_new_tokens, saved.num_beams) == (7, 3)
    model_config = AutoConfig.from_pretrained(tmp_path / "final")
    assert getattr(model_config, generation.PREFIX_KEY) == "go: "
    assert getattr(model_config, generation.SOURCE_LENGTH_KEY) == 128  # the demo tokenizer's limit


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_two_process_run_logs_the_metrics_of_its_final_model(demo, tmp_path: Path, strategy: str) -> None:
    """Under torchrun, 2 ranks, 41 validation samples in 11 batches of 4 (6 and 5: under FSDP2 the second
    rank generates for a discarded batch too, so both run as many forwards): the logged metrics equal
    those of the saved model evaluated in this process over the same batches."""
    output_dir = tmp_path / "run"
    overrides = [*demo[1], f"output_dir={output_dir}", "train.precision=fp32", "train.epochs=2", "lora=null"]
    overrides.append(f"distributed.strategy={strategy}")
    result = run_launch([*overrides, "data.eval_batch_size=4", "eval.max_new_tokens=12"])
    assert result.returncode == 0, result.stderr[-3000:]
    records = [record for record in read_metrics(output_dir) if "eval_loss" in record]
    assert all({"eval_perplexity", "eval_bleu", "eval_rougeL"} <= record.keys() for record in records)
    assert records[-1]["eval_bleu"] > records[0]["eval_bleu"]
    config = config_of(demo, tmp_path, f"model.pretrained={output_dir / 'final'}", "eval.max_new_tokens=12")
    data = task.build_data(config, ENV)
    model = task.build_model(config, data).eval()
    assert task.evaluation_metrics(evaluation_totals(model, data, 1, batch_size=4)) == pytest.approx(
        {key: value for key, value in records[-1].items() if key.startswith("eval_")}, rel=1e-6
    )
