"""Every valid combination of GPUs x backend x precision x model type renders the right project, and
so do strategy=fsdp2 and finetune=lora on a CPU and a GPU combination of each model type that takes them.

Each combination is rendered once per module (and xdist worker) and shared, read-only, by the checks.
Within a model type the Python differs by one rendered integer, so linting and type checking run once
per model type, in test_lint_and_types.py.
"""

from __future__ import annotations

import json
import os
import re
import tomllib

import pytest
import yaml
from conftest import require_rendered
from template_helpers import (
    ALL_COMBINATIONS,
    DEFAULT_PRETRAINED,
    FSDP2_COMBINATIONS,
    LORA_COMBINATIONS,
    MODEL_TYPES,
    REPO,
    UNRECORDED_KEYS,
    VALID_COMBINATIONS,
    combination_id,
    expected_files,
    leftover_template_syntax,
    list_files,
)

ASSIGNMENT = r"^\s*(?:readonly\s+|declare\s+-r\s+)?\w*"


@pytest.fixture(
    scope="module", params=VALID_COMBINATIONS + FSDP2_COMBINATIONS + LORA_COMBINATIONS, ids=combination_id
)
def rendered(request, cookies_session):
    answers = request.param
    project = require_rendered(cookies_session.bake(extra_context=answers, template=str(REPO)))
    return answers, project


def test_matrix_holds_every_valid_combination():
    # Per model type: 3 GPU counts x 2 backends x 3 precisions = 18, less 4 that need GPUs with 0 GPUs.
    assert len(ALL_COMBINATIONS) == 18 * len(MODEL_TYPES)
    assert len(VALID_COMBINATIONS) == 14 * len(MODEL_TYPES)
    assert not [c for c in VALID_COMBINATIONS if c["gpus_per_node"] == "0" and c["backend"] == "nccl"]
    assert not [c for c in VALID_COMBINATIONS if c["gpus_per_node"] == "0" and c["precision"] == "fp16"]


def test_renders_exactly_the_files_of_its_model_type(rendered):
    answers, project = rendered
    assert project.path.name == "ddp-fine-tuning"
    actual = list_files(project.path)
    expected = expected_files(answers["model_type"], project.package)
    assert sorted(actual - expected) == [], "unexpected files"
    assert sorted(expected - actual) == [], "missing files"


def test_records_the_answers_in_replay_format(rendered):
    answers, project = rendered
    assert set(project.recorded) == {"cookiecutter"}
    recorded = project.answers
    for key, value in answers.items():
        assert recorded[key] == value, key
    assert recorded["project_name"] == "DDP Fine-tuning"
    assert recorded["project_slug"] == "ddp-fine-tuning"
    assert recorded["package_name"] == "ddp_fine_tuning"
    assert recorded["pretrained_model"] == DEFAULT_PRETRAINED[answers["model_type"]]
    assert recorded["num_nodes"] == "1"
    questions = json.loads((REPO / "cookiecutter.json").read_text(encoding="utf-8"))
    public = {key for key in questions if not key.startswith("_")}
    assert {key for key in recorded if not key.startswith("_")} == public
    assert not UNRECORDED_KEYS & set(recorded), "machine-specific context was recorded"


def test_leaves_no_template_syntax(rendered):
    _, project = rendered
    assert leftover_template_syntax(project.path) == []


def test_launch_sh_is_executable(rendered):
    _, project = rendered
    script = project.path / "launch.sh"
    assert os.access(script, os.X_OK)
    assert script.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")


def test_defaults_yaml_carries_backend_precision_and_device(rendered):
    answers, project = rendered
    defaults = yaml.safe_load((project.package_dir / "config" / "defaults.yaml").read_text(encoding="utf-8"))
    assert defaults["distributed"]["backend"] == answers["backend"]
    assert defaults["distributed"]["strategy"] == answers.get("strategy", "ddp")
    assert defaults["train"]["precision"] == answers["precision"]
    expected_device = "cpu" if answers["gpus_per_node"] == "0" else "cuda"
    assert defaults["distributed"]["device"] == expected_device
    assert defaults["model"]["pretrained"] == DEFAULT_PRETRAINED[answers["model_type"]]


def test_lora_section_and_peft_come_with_finetune_lora_only(rendered):
    """finetune=lora: the lora section with its documented defaults, and peft; full: no lora key at all."""
    answers, project = rendered
    text = (project.package_dir / "config" / "defaults.yaml").read_text(encoding="utf-8")
    defaults = yaml.safe_load(text)
    dependencies = tomllib.loads((project.path / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    needs_peft = [item for item in dependencies["dependencies"] if item.startswith("peft")]
    if answers.get("finetune") == "lora":
        assert defaults["lora"] == {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"}
        assert needs_peft
    else:
        assert "lora" not in text
        assert not needs_peft
    assert defaults["model"]["gradient_checkpointing"] is False


def test_launch_sh_carries_gpus_per_node_and_num_nodes(rendered):
    answers, project = rendered
    text = (project.path / "launch.sh").read_text(encoding="utf-8")
    # A shell assignment of the rendered value, e.g. `readonly RENDERED_GPUS_PER_NODE=8`.
    gpus = re.findall(rf"{ASSIGNMENT}GPUS_PER_NODE\w*=\"?(\d+)\"?$", text, flags=re.MULTILINE)
    nodes = re.findall(rf"{ASSIGNMENT}NUM_NODES\w*=\"?(\d+)\"?$", text, flags=re.MULTILINE)
    assert gpus == [answers["gpus_per_node"]]
    assert nodes == ["1"]
    assert "-m ddp_fine_tuning " in text
