"""The quickstart a new user follows: the README's commands and the "Next steps" the hook prints agree,
install torch's CPU build in a CPU project, start the right number of processes, line up their comments,
and (slow) run as printed on this CPU machine for the default answers, which describe one GPU."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from template_helpers import VENV_BIN, cookiecutter_cli, describe, run, write_user_config

CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
PROJECT_INSTALL = "pip install -e '.[test]'"
DEMO_LAUNCH = "./launch.sh $(cat demo/overrides.txt)"
# gpus_per_node -> the answers that go with it
GPU_ANSWERS = {
    "0": {"gpus_per_node": "0", "backend": "gloo", "precision": "fp32"},
    "1": {},  # the defaults: one GPU, nccl, bf16
    "8": {"gpus_per_node": "8", "num_nodes": "2", "slurm": "yes", "kubernetes": "yes"},
}


def render(tmp_path: Path, answers: dict[str, str]) -> tuple[Path, str]:
    """The rendered project and what cookiecutter printed (the hook's next steps)."""
    output = tmp_path / "out"
    output.mkdir()
    config = write_user_config(tmp_path / "user")
    answers = {"project_slug": "quick", "package_name": "a_long_package_name_for_alignment", **answers}
    proc = cookiecutter_cli(answers, output, config)
    assert proc.returncode == 0, describe(proc)
    return output / "quick", proc.stdout


def readme_quickstart(project: Path) -> list[str]:
    readme = (project / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Quickstart") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    return block[1].splitlines()


def next_steps(printed: str) -> list[str]:
    steps = printed[printed.index("Next steps:") :].splitlines()[1:]
    return [line[2:] for line in steps if line.startswith("  ")]


def commands(lines: list[str]) -> list[str]:
    return [line.split("  #")[0].rstrip() for line in lines]


def comment_columns(lines: list[str]) -> set[int]:
    return {line.index("  #") for line in lines if "  #" in line}


@pytest.mark.parametrize("gpus", GPU_ANSWERS)
def test_quickstart_and_next_steps_run_on_the_machine_the_answers_describe(tmp_path: Path, gpus: str):
    project, printed = render(tmp_path, GPU_ANSWERS[gpus])
    readme, steps = readme_quickstart(project), next_steps(printed)
    for lines in (readme, steps):
        listed = commands(lines)
        assert (CPU_TORCH in listed) == (gpus == "0"), lines
        if gpus == "0":  # first, so that installing the project keeps it
            assert listed.index(CPU_TORCH) < listed.index(PROJECT_INSTALL)
        launches = [command for command in listed if command.endswith(DEMO_LAUNCH)]
        assert launches == [f"NPROC_PER_NODE={int(gpus) or 2} {DEMO_LAUNCH}"]  # 2 on CPU, else a GPU each
        assert len(comment_columns(lines)) == 1, "\n".join(lines)  # the comments line up
    assert [command for command in commands(steps) if command in commands(readme)] == commands(readme)


def test_workflow_and_dockerfile_of_a_cpu_project_install_the_cpu_torch(tmp_path: Path):
    project, _ = render(tmp_path, {**GPU_ANSWERS["0"], "kubernetes": "yes"})
    workflow = (project / ".github" / "workflows" / "tests.yml").read_text(encoding="utf-8")
    assert workflow.index(CPU_TORCH) < workflow.index(PROJECT_INSTALL)
    dockerfile = (project / "Dockerfile").read_text(encoding="utf-8")
    assert "FROM python:3.11-slim" in dockerfile and CPU_TORCH in dockerfile


@pytest.mark.slow
def test_default_answers_quickstart_runs_as_printed_on_a_cpu_machine(tmp_path: Path):
    """The default answers (1 GPU, nccl, bf16) on this machine, which has no CUDA: the demo's overrides
    move training to the CPU and the printed launch line fine-tunes the demo."""
    project, _ = render(tmp_path, {})
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "CUDA_"))}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env['PATH']}", PYTHONPATH=str(project / "src"))
    for command in commands(readme_quickstart(project)):
        if command.startswith("pip install"):  # this environment has the project's dependencies
            continue
        command = command.replace("python -m", f"{sys.executable} -m", 1)
        proc = run(["bash", "-c", command], cwd=project, env=env, timeout=900)
        assert proc.returncode == 0, describe(proc)
    overrides = (project / "demo" / "overrides.txt").read_text(encoding="utf-8").split()
    assert overrides[:2] == ["distributed.device=cpu", "distributed.backend=gloo"]
    assert (project / "outputs" / "demo" / "final" / "model.safetensors").is_file()
