"""The rendered GitHub workflow passes the GitHub Actions linters: zizmor runs as it is (a PyPI wheel,
offline), and the rules of actionlint that concern this workflow are checked here in Python, with
shellcheck on every `run:` script as actionlint runs it. actionlint itself has no wheel: its PyPI
package downloads the binary while it builds, which an offline machine cannot do."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from template_helpers import REPO, SHELLCHECK, VENV_BIN, describe, run

ZIZMOR = str(VENV_BIN / "zizmor")
# The first major version of each action that runs on Node 24: the older ones run on the deprecated Node 20,
# which actionlint reports. Any action not listed here must be pinned to a commit SHA.
NODE24_MAJOR = {"actions/checkout": 5, "actions/setup-python": 6}
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
# GitHub's default shell for `run:` on Linux runners: bash --noprofile --norc -eo pipefail {0}
RUN_PROLOGUE = "#!/usr/bin/env bash\nset -eo pipefail\n"


@pytest.fixture(scope="module")
def project(cookies_session) -> Path:
    result = cookies_session.bake(template=str(REPO))
    assert result.exception is None, result.exception
    return result.project_path


def workflow(project: Path) -> dict:
    return yaml.safe_load((project / ".github" / "workflows" / "tests.yml").read_text(encoding="utf-8"))


def steps(project: Path) -> list[dict]:
    return [step for job in workflow(project)["jobs"].values() for step in job["steps"]]


def test_actions_run_on_a_supported_node_runtime(project: Path):
    references = [step["uses"] for step in steps(project) if "uses" in step]
    assert references
    for reference in references:
        action, ref = reference.split("@")
        if COMMIT_SHA.fullmatch(ref):
            continue
        assert action in NODE24_MAJOR, f"{reference}: pin an action outside actions/* to a commit SHA"
        assert re.fullmatch(r"v\d+", ref), f"{reference}: name the major version (v7), or pin a SHA"
        assert int(ref[1:]) >= NODE24_MAJOR[action], f"{reference} runs on the deprecated Node 20"


def test_the_workflow_reads_the_repository_only_and_keeps_no_credentials(project: Path):
    parsed = workflow(project)
    assert parsed["permissions"] == {"contents": "read"}
    assert all("permissions" not in job for job in parsed["jobs"].values())  # none widens it
    checkouts = [step for step in steps(project) if step.get("uses", "").startswith("actions/checkout@")]
    assert checkouts and all(step["with"]["persist-credentials"] is False for step in checkouts)


def test_the_unpinned_actions_are_the_ones_the_zizmor_policy_allows(project: Path):
    policy = yaml.safe_load((project / ".github" / "zizmor.yml").read_text(encoding="utf-8"))
    assert policy["rules"]["unpinned-uses"]["config"]["policies"] == {"actions/*": "ref-pin", "*": "hash-pin"}
    text = (project / ".github" / "workflows" / "tests.yml").read_text(encoding="utf-8")
    assert "commit SHA" in text.split("\nname:")[0]  # the header says why the tags are not SHAs


def test_run_scripts_pass_shellcheck(project: Path, tmp_path: Path):
    scripts = [step["run"] for step in steps(project) if "run" in step]
    assert scripts
    for number, script in enumerate(scripts):
        path = tmp_path / f"step{number}.sh"
        path.write_text(RUN_PROLOGUE + script, encoding="utf-8")
        proc = run([SHELLCHECK, path.name], cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)


def test_zizmor_finds_nothing(project: Path):
    proc = run([ZIZMOR, "--offline", "--pedantic", "--no-progress", "."], cwd=project)
    assert proc.returncode == 0, describe(proc)
    assert "No findings" in proc.stdout, describe(proc)


def test_zizmor_reports_what_the_workflow_avoids(project: Path, tmp_path: Path):
    """The check can fail: the workflow as it was, with kept credentials and no permissions block, and a
    third-party action named by tag."""
    copy = tmp_path / "project"
    shutil.copytree(project / ".github", copy / ".github")
    path = copy / ".github" / "workflows" / "tests.yml"
    text = path.read_text(encoding="utf-8")
    text = text.replace("        with:\n          persist-credentials: false\n", "")
    text = text.replace("permissions:\n  contents: read\n", "")
    text = text.replace("      - name: Lint\n", "      - uses: astral-sh/setup-uv@v7\n      - name: Lint\n")
    path.write_text(text, encoding="utf-8")
    proc = run([ZIZMOR, "--offline", "--no-progress", "--format", "plain", "."], cwd=copy)
    assert proc.returncode != 0, describe(proc)
    for audit in ("artipacked", "excessive-permissions", "unpinned-uses"):
        assert audit in proc.stdout, describe(proc)
