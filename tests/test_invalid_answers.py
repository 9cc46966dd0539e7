"""Answers that cannot make a working project are refused by the pre-generation hook, before any file is
written: non-zero exit, FailedHookException, one `error:` line on stderr naming the answer, no output left.
"""

from __future__ import annotations

import pytest
from cookiecutter.exceptions import FailedHookException
from template_helpers import cookiecutter_cli, describe, lines_starting_with

# (extra_context, a substring the hook's one `error:` line must contain)
INVALID_ANSWERS = [
    ({"gpus_per_node": "0", "backend": "nccl", "precision": "fp32"}, "backend=nccl"),
    ({"gpus_per_node": "0", "backend": "nccl", "precision": "bf16"}, "backend=nccl"),
    ({"gpus_per_node": "0", "backend": "gloo", "precision": "fp16"}, "precision=fp16"),
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
    ({"package_name": "class"}, "package_name='class'"),
    ({"package_name": "my-package"}, "package_name='my-package'"),
    ({"model_type": "text-classification", "pretrained_model": ""}, "pretrained_model"),
    ({"model_type": "causal-lm", "pretrained_model": ""}, "pretrained_model"),
    ({"model_type": "image-classification", "pretrained_model": ""}, "pretrained_model"),
    ({"model_type": "text-classification", "pretrained_model": "  "}, "pretrained_model"),
]


def case_id(case) -> str:
    answers, _ = case
    return ",".join(f"{key}={value!r}" for key, value in answers.items())


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
