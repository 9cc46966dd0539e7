"""A replay file is taken as written: cookiecutter neither checks its choices and types nor renders its
Jinja, so the pre-generation hook does. A refusal is one `error:` line, printed first (before cookiecutter's
own traceback), and leaves the output folder empty.
"""

from __future__ import annotations

import json
import sys

import pytest
from cookiecutter.generate import generate_context
from cookiecutter.prompt import prompt_for_config
from template_helpers import REPO, describe, lines_starting_with, run

# Valid answers that make the hook print a warning (gloo on GPUs) and a note (several nodes by hand):
# a refusal must still come first.
BASE = {"gpus_per_node": "1", "backend": "gloo", "num_nodes": "3", "model_type": "custom"}

# (answers written over the base, a substring of the hook's one `error:` line)
REFUSED = [
    ({"tracker": "neptune"}, "tracker='neptune'"),
    ({"backend": "mpi"}, "backend='mpi'"),
    ({"precision": "fp8"}, "precision='fp8'"),
    ({"model_type": "object-detection"}, "model_type='object-detection'"),
    ({"tracker": None}, "tracker=None"),
    ({"project_name": "{{ 7 * 7 }}"}, "project_name='{{ 7 * 7 }}'"),
    ({"pretrained_model": "{% if true %}x{% endif %}"}, "pretrained_model="),
    ({"__kubernetes_name": "{# x #}"}, "__kubernetes_name="),
    ({"project_slug": 123}, "project_slug=123"),
    ({"package_name": None}, "package_name=None"),
    ({"project_name": ["a"]}, "project_name=['a']"),
    ({"slurm": "yes"}, "slurm='yes'"),
]


def replay_answers(**overrides) -> dict:
    """Every answer as cookiecutter records it for the base answers, then `overrides` as written."""
    context = generate_context(context_file=str(REPO / "cookiecutter.json"), extra_context=BASE)
    answers = dict(prompt_for_config(context, no_input=True))
    answers.update(overrides)
    return answers


def render_replay(answers: dict, tmp_path, user_config):
    replay = tmp_path / "answers.json"
    replay.write_text(json.dumps({"cookiecutter": answers}), encoding="utf-8")
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    cmd = [sys.executable, "-m", "cookiecutter", "--config-file", str(user_config)]
    cmd += ["--replay-file", str(replay), str(REPO), "-o", str(output_dir)]
    return run(cmd, cwd=tmp_path), output_dir


def test_the_base_answers_render_with_a_warning_and_a_note(tmp_path, user_config):
    proc, output_dir = render_replay(replay_answers(), tmp_path, user_config)

    assert proc.returncode == 0, describe(proc)
    assert proc.stderr.startswith("warning: backend=gloo"), proc.stderr
    assert "note: num_nodes=3" in proc.stderr
    assert [path.name for path in output_dir.iterdir()] == ["ddp-fine-tuning"]


@pytest.mark.parametrize("overrides,message", REFUSED, ids=[repr(o) for o, _ in REFUSED])
def test_replayed_answer_is_refused_first_in_one_line(tmp_path, user_config, overrides, message):
    proc, output_dir = render_replay(replay_answers(**overrides), tmp_path, user_config)

    assert proc.returncode != 0, describe(proc)
    errors = lines_starting_with(proc.stderr, "error:")
    assert len(errors) == 1, proc.stderr
    assert message in errors[0]
    assert proc.stderr.startswith("error:"), proc.stderr
    assert list(output_dir.iterdir()) == []


def test_a_name_that_is_not_utf8_is_refused(tmp_path, user_config):
    # A command line in bytes that are not UTF-8 reaches Python as lone surrogates, which no file takes.
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    cmd = [sys.executable, "-m", "cookiecutter", "--no-input", "--config-file", str(user_config)]
    cmd += [str(REPO), b"project_name=caf\xe9", "-o", str(output_dir)]
    proc = run(cmd, cwd=tmp_path)

    assert proc.returncode != 0, describe(proc)
    assert proc.stderr.startswith("error: project_name='caf\\udce9'"), proc.stderr
    assert list(output_dir.iterdir()) == []
