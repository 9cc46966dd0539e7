"""Answers that cannot make a working project are refused by the pre-generation hook, before any file is
written: non-zero exit, FailedHookException, one `error:` line on stderr naming the answer, no output left.

The impossible GPU x backend x precision x model type combinations are the complement of the valid ones
that tests/test_answer_matrix.py renders, both generated from one rule.
"""

from __future__ import annotations

import pytest
from cookiecutter.exceptions import FailedHookException
from template_helpers import (
    ALL_COMBINATIONS,
    MODEL_TYPES,
    VALID_COMBINATIONS,
    combination_id,
    cookiecutter_cli,
    describe,
    lines_starting_with,
)


def expected_refusal(combination: dict[str, str]) -> str:
    """What the hook names first for an impossible combination: the backend, else the precision."""
    return "backend=nccl" if combination["backend"] == "nccl" else "precision=fp16"


IMPOSSIBLE_COMBINATIONS = [
    (combination, expected_refusal(combination))
    for combination in ALL_COMBINATIONS
    if combination not in VALID_COMBINATIONS
]

# (extra_context, a substring the hook's one `error:` line must contain)
INVALID_ANSWERS = [
    ({"gpus_per_node": "-1"}, "gpus_per_node='-1'"),
    ({"gpus_per_node": "65"}, "gpus_per_node=65"),
    ({"gpus_per_node": "two"}, "gpus_per_node='two'"),
    ({"gpus_per_node": "1.5"}, "gpus_per_node='1.5'"),
    ({"gpus_per_node": ""}, "gpus_per_node=''"),
    ({"num_nodes": "0"}, "num_nodes=0"),
    ({"num_nodes": "x"}, "num_nodes='x'"),
    ({"num_nodes": "-2"}, "num_nodes='-2'"),
    ({"project_name": "123 project"}, "project_slug='123-project'"),
    ({"project_name": "!!!"}, "project_slug"),  # slugify gives ''
    ({"project_name": "   "}, "project_name"),
    ({"package_name": "json"}, "package_name='json'"),
    ({"package_name": "os"}, "package_name='os'"),
    ({"package_name": "torch"}, "package_name='torch'"),
    ({"package_name": "transformers"}, "package_name='transformers'"),
    # Import names of the dependency closure, not only the direct dependencies; any case.
    ({"package_name": "matplotlib"}, "package_name='matplotlib'"),
    ({"package_name": "setuptools"}, "package_name='setuptools'"),
    ({"package_name": "packaging"}, "package_name='packaging'"),
    ({"package_name": "jinja2"}, "package_name='jinja2'"),
    ({"package_name": "requests"}, "package_name='requests'"),
    ({"package_name": "yaml"}, "package_name='yaml'"),
    ({"package_name": "pil"}, "package_name='pil'"),
    ({"package_name": "wandb", "tracker": "wandb"}, "package_name='wandb'"),
    ({"package_name": "mlflow", "tracker": "none"}, "package_name='mlflow'"),
    # A distribution name of the closure: installing the project would replace that dependency.
    ({"project_name": "PyYAML"}, "project_slug='pyyaml'"),
    ({"project_slug": "typing-extensions", "package_name": "my_types"}, "project_slug='typing-extensions'"),
    # cookiecutter renders answers as Jinja; what survives rendering would run on the next render.
    ({"project_name": "{{ '{{' }} 7 * 7 }}"}, "project_name='{{ 7 * 7 }}'"),
    ({"project_name": "a {{ '{%' }} b"}, "project_name='a {% b'"),
    ({"pretrained_model": "{{ '{#' }} note #}"}, "pretrained_model="),
    ({"package_name": "class"}, "package_name='class'"),
    ({"package_name": "my-package"}, "package_name='my-package'"),
    ({"model_type": "text-classification", "pretrained_model": ""}, "pretrained_model"),
    ({"model_type": "causal-lm", "pretrained_model": ""}, "pretrained_model"),
    ({"model_type": "image-classification", "pretrained_model": ""}, "pretrained_model"),
    ({"model_type": "token-classification", "pretrained_model": ""}, "pretrained_model"),
    ({"model_type": "seq2seq", "pretrained_model": ""}, "pretrained_model"),
    ({"model_type": "text-classification", "pretrained_model": "  "}, "pretrained_model"),
    # The custom example declares no blocks for FSDP2 to shard.
    ({"model_type": "custom", "strategy": "fsdp2"}, "strategy=fsdp2"),
    # LoRA adapters go on a Hugging Face model's linear layers.
    ({"model_type": "custom", "finetune": "lora"}, "finetune=lora"),
    # cookiecutter turns yes/no/true/false into booleans; what else the API or a replay file passes would
    # render as true (cookiecutter hands a number on as a string).
    ({"slurm": 1}, "slurm='1'"),
    ({"slurm": 0}, "slurm='0'"),
    ({"kubernetes": None}, "kubernetes=None"),
    # A Kubernetes job's name must start with a letter; it is the slug, lower-cased.
    ({"project_slug": "_1st-try", "kubernetes": "yes"}, "kubernetes=yes"),
    ({"project_slug": "__", "kubernetes": "yes"}, "kubernetes=yes"),
    # A TrainJob's pods are <name>-node-0-<index>-<5 characters>: 48 characters and index 10 make 64.
    ({"project_slug": "x" * 48, "kubernetes": "yes", "num_nodes": "11"}, "project_slug to at most 47"),
    *IMPOSSIBLE_COMBINATIONS,
    # The project folder is the slug with '/' made '_' (__project_dir): cookiecutter creates it before
    # the hook runs and removes it on a refusal; a path such as a/b would leave a/ behind.
    ({"project_slug": "a/b"}, "project_slug='a/b'"),
]


def case_id(case) -> str:
    answers, _ = case.values if hasattr(case, "values") else case
    if answers in ALL_COMBINATIONS:
        return combination_id(answers)
    return ",".join(f"{key}={value!r}" for key, value in answers.items())


def test_every_model_type_has_both_impossible_kinds():
    # gpus_per_node=0 with nccl, and with gloo + fp16: each model type is refused for both.
    kinds = {(combination["model_type"], message) for combination, message in IMPOSSIBLE_COMBINATIONS}
    expected = {(model, kind) for model in MODEL_TYPES for kind in ("backend=nccl", "precision=fp16")}
    assert kinds == expected


@pytest.mark.parametrize("answers,message", INVALID_ANSWERS, ids=[case_id(c) for c in INVALID_ANSWERS])
def test_invalid_answers_are_refused_before_anything_is_written(bake, tmp_path, capfd, answers, message):
    capfd.readouterr()
    result = bake(**answers)
    stderr = capfd.readouterr().err

    assert result.exit_code != 0
    assert isinstance(result.exception, FailedHookException), repr(result.exception)
    assert result.project_path is None
    # pytest-cookies renders into tmp_path/cookies/bake00; the refusal must leave nothing in it.
    left_behind = [p.relative_to(tmp_path).as_posix() for p in (tmp_path / "cookies").rglob("*")]
    assert left_behind == ["cookies/bake00"]
    errors = lines_starting_with(stderr, "error:")
    assert len(errors) == 1, stderr
    assert message in errors[0]
    assert stderr.startswith("error:"), "the refusal must be the first line printed"


def test_cli_refuses_nccl_without_gpus_with_one_error_line(tmp_path, user_config):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    proc = cookiecutter_cli({"gpus_per_node": "0", "backend": "nccl"}, output_dir, user_config)

    assert proc.returncode != 0, describe(proc)
    errors = lines_starting_with(proc.stderr, "error:")
    assert len(errors) == 1, proc.stderr
    assert "backend=nccl" in errors[0]
    assert "gpus_per_node=0" in errors[0]
    assert "backend=gloo" in errors[0], "the line should name the fix"
    assert list(output_dir.iterdir()) == []


def test_cli_refuses_a_slug_with_a_slash_and_leaves_nothing(tmp_path, user_config):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    proc = cookiecutter_cli({"project_slug": "a/b"}, output_dir, user_config)

    assert proc.returncode != 0, describe(proc)
    assert proc.stderr.startswith("error: project_slug='a/b' is not a usable folder name"), proc.stderr
    assert list(output_dir.iterdir()) == []  # the folder cookiecutter made, a_b, is gone


def test_cli_refuses_fp16_without_gpus_with_one_error_line(tmp_path, user_config):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    answers = {"gpus_per_node": "0", "backend": "gloo", "precision": "fp16"}
    proc = cookiecutter_cli(answers, output_dir, user_config)

    assert proc.returncode != 0, describe(proc)
    errors = lines_starting_with(proc.stderr, "error:")
    assert len(errors) == 1, proc.stderr
    assert "precision=fp16" in errors[0]
    assert list(output_dir.iterdir()) == []


def test_cli_warns_about_gloo_on_gpus_but_renders(tmp_path, user_config):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    proc = cookiecutter_cli({"gpus_per_node": "1", "backend": "gloo"}, output_dir, user_config)

    assert proc.returncode == 0, describe(proc)
    assert lines_starting_with(proc.stderr, "error:") == []
    warnings = lines_starting_with(proc.stderr, "warning:")
    assert len(warnings) == 1, proc.stderr
    assert "backend=gloo" in warnings[0]
    assert (output_dir / "ddp-fine-tuning" / "launch.sh").is_file()


def test_cli_does_not_warn_about_nccl_on_gpus(tmp_path, user_config):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    proc = cookiecutter_cli({"gpus_per_node": "1", "backend": "nccl"}, output_dir, user_config)

    assert proc.returncode == 0, describe(proc)
    assert lines_starting_with(proc.stderr, "warning:") == []
    assert lines_starting_with(proc.stderr, "error:") == []
    assert (output_dir / "ddp-fine-tuning" / "launch.sh").is_file()


def test_cli_refuses_a_cluster_answer_that_is_not_yes_or_no(tmp_path, user_config):
    # cookiecutter itself rejects it, before any hook runs.
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    proc = cookiecutter_cli({"slurm": "maybe"}, output_dir, user_config)

    assert proc.returncode != 0, describe(proc)
    assert "maybe provided for variable slurm could not be converted to a boolean" in proc.stderr
    assert list(output_dir.iterdir()) == []


def notes(stderr: str) -> str:
    """The `note:` paragraph: its first line and the indented lines after it."""
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("note:")), len(lines))
    rest = lines[start + 1 :]
    end = next((i for i, line in enumerate(rest) if not line.startswith("  ")), len(rest))
    return "\n".join(lines[start : start + 1 + end])


def test_cli_explains_multi_node_by_hand_when_no_cluster_file_is_chosen(tmp_path, user_config):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    proc = cookiecutter_cli({"num_nodes": "3"}, output_dir, user_config)

    assert proc.returncode == 0, describe(proc)
    note = notes(proc.stderr)
    assert note.startswith("note: num_nodes=3 without slurm or kubernetes"), proc.stderr
    assert "NNODES=3 NODE_RANK=<0..2> MASTER_ADDR=<first node> MASTER_PORT=29500 RUN_ID=" in note
    assert "./launch.sh [key=value ...]" in note and "slurm=yes" in note and "kubernetes=yes" in note
    assert lines_starting_with(proc.stderr, "warning:") == lines_starting_with(proc.stderr, "error:") == []


@pytest.mark.parametrize(
    "answers", [{"num_nodes": "1"}, {"num_nodes": "3", "slurm": "yes"}, {"num_nodes": "3", "kubernetes": "y"}]
)
def test_cli_prints_no_multi_node_note_when_not_needed(tmp_path, user_config, answers):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    proc = cookiecutter_cli(answers, output_dir, user_config)

    assert proc.returncode == 0, describe(proc)
    assert notes(proc.stderr) == "", proc.stderr
