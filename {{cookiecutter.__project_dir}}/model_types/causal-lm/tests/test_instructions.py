"""Instruction data: which tokens are targets, cut samples, refused files, and a step's loss as the mean
over every target token of the global batch, whatever the processes and micro-batches."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ON_THIS_MACHINE, read_metrics, run_launch
from predict_helpers import predictions
from test_equivalence import assert_same_tensors, float64_probe
from transformers import AutoModelForCausalLM, AutoTokenizer

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.data import (
    DataError,
)
from {{ cookiecutter.package_name }}.distributed import (
    DistEnv,
)
from {{ cookiecutter.package_name }}.model_type import (
    instructions,
    task,
)
from {{ cookiecutter.package_name }}.model_type import (
    padding_free as padding_free_module,
)
from {{ cookiecutter.package_name }}.model_type.settings import (
    PaddingFree,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
IGNORE = instructions.IGNORE_INDEX


def _write(path: Path, rows: list[object]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def _data(demo, tmp_path: Path, train: str | list[object], *extra: str):
    """The task's data for a training file (a demo file's name, or records), without validation."""
    directory, _ = demo
    train_file = directory / train if isinstance(train, str) else _write(tmp_path / "train.jsonl", train)
    config = load_config(
        [
            f"model.pretrained={directory / 'model'}",
            f"data.train_file={train_file}",
            "data.val_file=",
            f"data.chat_template={directory / 'chat_template.jinja'}",
            f"output_dir={tmp_path / 'out'}",
            *ON_THIS_MACHINE,
            "data.max_length=128",
            *extra,
        ]
    )
    return task.build_data(config, ENV)


def _targets(sample: tuple[torch.Tensor, torch.Tensor]) -> list[int]:
    ids, labels = sample
    return [int(token) for token, label in zip(ids, labels, strict=True) if label != IGNORE]


def test_prompt_completion_trains_on_the_completion_and_its_end_only(demo, tmp_path: Path) -> None:
    data = _data(demo, tmp_path, "instructions-train.jsonl")
    tokenizer = data.preprocessor
    rows = [json.loads(line) for line in (demo[0] / "instructions-train.jsonl").read_text().splitlines()]
    assert len(data.train) == len(rows)
    for sample, row in zip(data.train, rows[:50], strict=False):
        prompt = tokenizer(row["prompt"])["input_ids"]
        completion = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        assert sample[0].tolist() == [*prompt, *completion, tokenizer.eos_token_id]
        assert sample[1][: len(prompt)].tolist() == [IGNORE] * len(prompt)
        assert _targets(sample) == [*completion, tokenizer.eos_token_id]


def test_chat_trains_on_the_assistant_turns_only(demo, tmp_path: Path) -> None:
    data = _data(demo, tmp_path, "chat-train.jsonl")
    tokenizer = data.preprocessor
    rows = [json.loads(line) for line in (demo[0] / "chat-train.jsonl").read_text().splitlines()]
    assert any(len(row["messages"]) > 3 for row in rows[:50])  # conversations of two answers among them
    for sample, row in zip(data.train, rows[:50], strict=False):
        whole = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        assert tokenizer.decode(sample[0]) == whole
        answers = [m["content"] + tokenizer.eos_token for m in row["messages"] if m["role"] == "assistant"]
        assert tokenizer.decode(_targets(sample)) == "".join(answers)


@pytest.mark.parametrize("padding_free", ["never", "always"])
def test_prompt_positions_get_no_gradient(demo, tmp_path: Path, padding_free: str) -> None:
    """The loss reaches the logits that predict completion tokens, and no other: found through the
    gradient, against prompt lengths tokenized here, apart from the data pipeline."""
    data = _data(demo, tmp_path, "instructions-train.jsonl")
    config = load_config(
        [f"model.pretrained={demo[0] / 'model'}", f"data.padding_free={padding_free}", *ON_THIS_MACHINE]
    )
    model = task.build_model(config, data)
    # The demo model keeps packed samples apart: it is checked, and trains padding-free, when asked to.
    assert getattr(model, padding_free_module.SAMPLES_APART, False) == (padding_free == "always")
    samples = [data.train[index] for index in range(6)]
    batch = task.Collator(data.preprocessor.pad_token_id, padding_free=True)(samples)
    logits: list[torch.Tensor] = []

    def keep(module, inputs, output):
        output.retain_grad()
        logits.append(output)

    model.lm_head.register_forward_hook(keep)
    task.TASK.loss_sum(model, batch).backward()
    touched = logits[0].grad.abs().sum(dim=-1) != 0  # (row, position)
    rows = [json.loads(line) for line in (demo[0] / "instructions-train.jsonl").read_text().splitlines()]
    expected = []
    for (ids, _), record in zip(samples, rows[:6], strict=True):
        prompt = len(data.preprocessor(record["prompt"])["input_ids"])
        # Position t predicts token t + 1: the last prompt position predicts the first completion token.
        expected.append([prompt - 1 <= t < len(ids) - 1 for t in range(len(ids))])
    if padding_free == "always":  # one row, the samples end to end
        assert touched.tolist() == [[t for sample in expected for t in sample]]
    else:
        assert [
            row[: len(sample)] for row, sample in zip(touched.tolist(), expected, strict=True)
        ] == expected
        assert not any(
            any(row[len(sample) :]) for row, sample in zip(touched.tolist(), expected, strict=True)
        )


def packed_inputs_with(batch, **extra):
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], **extra}


def test_packed_samples_give_the_logits_they_give_alone(demo, tmp_path: Path) -> None:
    """The demo model attends within each sample of a padding-free row: packed logits equal unpacked
    ones. An all-ones 2-D mask over the same row lets samples see each other, which is why a
    padding-free batch never carries one."""
    data = _data(demo, tmp_path, "chat-train.jsonl")
    model = AutoModelForCausalLM.from_pretrained(demo[0] / "model").eval()
    samples = [data.train[index] for index in range(5)]
    assert len({len(ids) for ids, _ in samples}) > 1
    packed = padding_free_module.padding_free_batch(samples)
    with torch.no_grad():
        together = model(**padding_free_module.model_inputs(packed), use_cache=False).logits[0]
        alone = torch.cat(
            [model(input_ids=ids[None].long(), use_cache=False).logits[0] for ids, _ in samples]
        )
        mask = torch.ones_like(packed["input_ids"])
        leaking = model(**packed_inputs_with(packed, attention_mask=mask), use_cache=False).logits[0]
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    first = len(samples[0][0])  # the first sample sees nothing before it either way
    assert (leaking[first:] - alone[first:]).abs().max() > 1e-2
    with pytest.raises(ValueError, match="no attention mask"):
        padding_free_module.model_inputs({**packed, "attention_mask": mask})


def test_padded_and_padding_free_batches_have_the_same_loss_and_targets(demo, tmp_path: Path) -> None:
    data = _data(demo, tmp_path, "instructions-train.jsonl")
    model = AutoModelForCausalLM.from_pretrained(demo[0] / "model").eval()
    samples = [data.train[index] for index in range(7)]
    batch = data.collate(samples)
    packed = padding_free_module.the_form_for(model, batch)
    assert "packed_input_ids" in batch and "attention_mask" in packed  # not checked yet: padded rows
    setattr(model, padding_free_module.SAMPLES_APART, True)
    packed = padding_free_module.the_form_for(model, batch)
    assert "attention_mask" not in packed
    assert packed["input_ids"].shape == (1, sum(len(ids) for ids, _ in samples))
    assert task.count_targets(packed) == task.count_targets(batch)
    with torch.no_grad():
        torch.testing.assert_close(task.loss_sum(model, batch), task.loss_sum(model, packed))
        setattr(model, padding_free_module.SAMPLES_APART, False)
        torch.testing.assert_close(task.loss_sum(model, batch), task.loss_sum(model, packed))


def test_auto_packs_with_flash_attention_only() -> None:
    def model(attention: str) -> torch.nn.Module:
        module = torch.nn.Linear(1, 1)
        module.config = SimpleNamespace(_attn_implementation=attention)
        return module

    auto, always, never = PaddingFree.auto, PaddingFree.always, PaddingFree.never
    assert padding_free_module.worth_trying(auto, model("flash_attention_2"))
    assert not padding_free_module.worth_trying(auto, model("sdpa"))
    assert padding_free_module.worth_trying(always, model("sdpa"))
    assert not padding_free_module.worth_trying(never, model("flash_attention_2"))
    config = load_config(["data.padding_free=always"])
    assert config.data.padding_free is always and load_config([]).data.padding_free is auto


class AttendsAcrossSamples(torch.nn.Module):
    """A model that ignores position ids and sees the whole row, as older attention code does."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids=None, **kwargs):
        return self.model(input_ids=input_ids, **kwargs)


def test_a_model_that_lets_packed_samples_meet_gets_padded_batches(demo, tmp_path: Path) -> None:
    data = _data(demo, tmp_path, "instructions-train.jsonl")
    model = AutoModelForCausalLM.from_pretrained(demo[0] / "model").train()
    samples = [data.train[index][0] for index in range(2)]
    assert padding_free_module.attends_within_samples(model, samples)
    assert model.training  # the check leaves the mode as it was
    leaky = AttendsAcrossSamples(model)
    task.choose_padding_free(leaky, data.train)
    assert not getattr(leaky, padding_free_module.SAMPLES_APART)
    batch = data.collate([data.train[index] for index in range(3)])
    assert "attention_mask" in padding_free_module.the_form_for(leaky, batch)


def test_a_long_sample_keeps_its_prompt_end_and_its_response_start() -> None:
    ids = list(range(30))
    labels = [IGNORE] * 20 + ids[20:]  # a 20-token prompt, a 10-token response
    kept, kept_labels, cut = instructions.window(ids, labels, 12)
    assert cut and kept == list(range(14, 26))  # 6 = half the window before the response, 6 of it
    assert kept_labels == [IGNORE] * 6 + list(range(20, 26))
    short = [IGNORE] * 20 + ids[20:22]  # a short response: all of it, and the prompt's last tokens
    assert instructions.window(ids[:22], short, 12)[0] == list(range(10, 22))
    assert instructions.window(ids[:5], short[:5], 12) == (ids[:5], short[:5], False)


def test_cut_samples_and_samples_without_a_response_are_counted_in_one_warning(
    demo, tmp_path: Path, caplog
) -> None:
    long = {"prompt": "The cat saw the red ball. " * 20 + "Who?", "completion": " the cat"}
    rows = [long, {"prompt": "Who?", "completion": ""}, {"prompt": "What?", "completion": " a box"}]
    train = _write(tmp_path / "train.jsonl", rows)
    for run in ("preprocessing", "reading the cache"):  # every run on the data says so
        caplog.clear()
        with caplog.at_level("INFO"):
            data = _data(demo, tmp_path, train, "data.max_length=32")
        cached = any("from an earlier run" in r.getMessage() for r in caplog.records)
        assert cached == (run == "reading the cache"), run
        assert len(data.train) == 2  # the sample with no response token is left out
        assert max(len(data.train[index][0]) for index in range(2)) == 32
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and "1 of 3 samples were longer than 32" in warnings[0], (run, warnings)
        assert "1 had no response tokens and were left out" in warnings[0]


@pytest.mark.parametrize(
    "rows,message",
    [
        (
            [{"prompt": "a", "completion": "b"}, {"messages": [{"role": "user", "content": "c"}]}],
            'train.jsonl:2: a {"messages"} record, but line 1 is a {"prompt", "completion"} one',
        ),
        ([{"text": "a"}, {"prompt": "a", "completion": "b"}], 'train.jsonl:2: a {"prompt", "completion"}'),
        ([{"messages": [{"role": "robot", "content": "c"}]}], "train.jsonl:1: message 1: 'role' must be"),
        ([{"messages": []}], "train.jsonl:1: field 'messages' must be a non-empty list"),
        ([{"prompt": "a", "completion": "b"}, {"prompt": "a"}], "train.jsonl:2: missing field 'completion'"),
        ([{"prompt": 3, "completion": "b"}], "train.jsonl:1: field 'prompt' must be a string"),
        ([{"prompt": "a", "completion": ""}], "no sample has a response token"),
    ],
)
def test_bad_instruction_data_names_file_and_line(demo, tmp_path: Path, rows, message: str) -> None:
    with pytest.raises(DataError) as raised:
        _data(demo, tmp_path, rows)
    assert message in str(raised.value), str(raised.value)


def test_chat_data_without_a_template_names_data_chat_template(demo, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"has no chat template; set data\.chat_template="):
        _data(demo, tmp_path, "chat-train.jsonl", "data.chat_template=")


def test_a_conversation_the_chat_template_refuses_is_named_by_line(demo, tmp_path: Path) -> None:
    template = Path(__file__).with_name("refusing_chat_template.jinja")
    rows = [
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"messages": [{"role": "system", "content": "a"}, {"role": "assistant", "content": "b"}]},
    ]
    with pytest.raises(DataError) as raised:
        _data(demo, tmp_path, rows, f"data.chat_template={template}")
    assert "train.jsonl:2: the chat template refused the conversation: system messages" in str(raised.value)


def _completion_lengths_vary(path: Path, count: int, seed: int) -> None:
    """Prompt/completion pairs whose completions hold 1 to 20 tokens."""
    rng, words = random.Random(seed), ["cat", "dog", "ball", "tree", "box", "river", "house", "cup"]
    rows = []
    for _ in range(count):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) + "?"
        completion = " " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 19)))
        rows.append({"prompt": prompt, "completion": completion})
    _write(path, rows)


LORA = ["lora.r=4", "lora.alpha=8", "lora.dropout=0", "train.lr=0.5"]


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_a_step_is_the_mean_over_every_target_token_of_the_global_batch(
    deterministic, tmp_path: Path, finetune: str
) -> None:
    """1 process x 8 samples and 2 processes x 2 samples x 2 micro-batches train the same weights in 5
    SGD steps (float64: they differ by the order of sums), though the micro-batches hold different
    numbers of target tokens; weighting each micro-batch's own mean by its samples does not."""
    if finetune == "lora":
        pytest.importorskip("peft", reason="LoRA needs peft, which finetune=lora projects install")
    data = tmp_path / "pairs.jsonl"
    _completion_lengths_vary(data, 40, seed=3)
    kept = [item for item in deterministic if not item.startswith(("data.train_file=", "data.val_file="))]
    overrides = [*kept, f"data.train_file={data}", "data.val_file=", "train.max_steps=5", "train.lr=0.05"]
    overrides += LORA if finetune == "lora" else ["lora=null"]
    overrides.append("data.padding_free=always")  # the demo model keeps packed samples apart
    one = float64_probe("sgd", "1x8x1", overrides, tmp_path)
    (tmp_path / "start").mkdir()  # the same run, its own files: about the initial weights
    start = float64_probe("sgd", "1x8x1", [*overrides, "train.lr=1e-30"], tmp_path / "start")
    assert any(not torch.allclose(one[name], start[name]) for name in start)  # training moved them
    two = float64_probe("sgd", "2x2x2", overrides, tmp_path)
    assert_same_tensors(two, one, "2 x 2 x 2")
    means = float64_probe("sgd", "2x2x2", overrides, tmp_path, "micro_batch_means")
    with pytest.raises(AssertionError):
        assert_same_tensors(means, one, "per-micro-batch means")


@pytest.mark.slow
def test_chat_demo_trains_with_two_processes_and_answers_through_predict(demo, tmp_path: Path) -> None:
    directory, overrides = demo
    chat = [
        f"data.train_file={directory / 'chat-train.jsonl'}",
        f"data.val_file={directory / 'chat-val.jsonl'}",
        f"data.chat_template={directory / 'chat_template.jinja'}",
        "data.max_length=128",
        "lora=null",
        "train.epochs=4",
    ]
    result = run_launch([*overrides, *chat, f"output_dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-4000:]
    losses = [record["eval_loss"] for record in read_metrics(tmp_path) if "eval_loss" in record]
    assert losses[-1] < losses[0] / 2, losses
    question = [{"role": "user", "content": "A dog found the red ball by the sea. Who?"}]
    inputs = Path(_write(tmp_path / "questions.jsonl", [{"messages": question}, {"text": "A dog"}]))
    answers = predictions(tmp_path / "final", inputs, tmp_path / "answers.jsonl", "--max-new-tokens", "4")
    assert len(answers) == 2
    # final/ carries the chat template, and predict asks through it as the assistant, as training did.
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "final")
    asked = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    assert asked.endswith("<|assistant|>\n")
    ids = tokenizer(asked, add_special_tokens=False, return_tensors="pt")["input_ids"]
    output = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert answers[0]["completion"] == tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True)
