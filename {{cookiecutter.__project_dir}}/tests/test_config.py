"""Configuration: YAML defaults plus key=value overrides, refused with the key's name when wrong."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ON_THIS_MACHINE, PACKAGE, launch_env

from {{ cookiecutter.package_name }} import config_reference
from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.config import (
    Backend,
    ConfigError,
    Device,
    Precision,
    load_config,
)
from {{ cookiecutter.package_name }}.config.constants import MODEL_TYPE
from {{ cookiecutter.package_name }}.launch.preflight import (
    check_eval,
    require_writable_output_dir,
)

CONTRACT_KEYS = [
    "output_dir",
    "seed",
    "model.pretrained",
    "data.train_file",
    "data.val_file",
    "data.batch_size",
    "train.epochs",
    "train.max_steps",
    "train.lr",
    "train.grad_accum_steps",
    "train.precision",
    "checkpoint.every_steps",
    "distributed.backend",
]


def _get(config: object, dotted: str) -> object:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def test_defaults_load_and_hold_every_contract_key() -> None:
    config = load_config([])
    for key in CONTRACT_KEYS:
        _get(config, key)  # raises AttributeError when a key is missing


def test_overrides_are_typed() -> None:
    config = load_config(["train.lr=1e-4", "data.batch_size=7", "train.precision=fp32", "seed=3"])
    assert config.train.lr == pytest.approx(1e-4)
    assert config.data.batch_size == 7
    assert config.train.precision is Precision.fp32
    assert config.seed == 3
    assert load_config(["distributed.backend=gloo"]).distributed.backend is Backend.gloo


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.epoch=3"], "train.epoch: unknown config key"),
        (["model.name=x"], "model.name: unknown config key"),
        (["data.batch_size=eight"], "data.batch_size:"),
        (["train.precision=fp8"], "train.precision:"),
        (["distributed.backend=mpi"], "distributed.backend:"),
        (["train.lr"], "is not key=value"),
        (["data.batch_size=0"], "data.batch_size: must be >= 1"),
        (["train.grad_accum_steps=0"], "train.grad_accum_steps: must be >= 1"),
        (["train.warmup_ratio=1.5"], "train.warmup_ratio: must be in [0, 1)"),
        (["distributed.backend=nccl", "distributed.device=cpu"], "distributed.backend: nccl needs"),
        (
            ["train.precision=fp16", "distributed.device=cpu", "distributed.backend=gloo"],
            "train.precision: fp16 needs CUDA",
        ),
    ],
)
def test_bad_overrides_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(overrides)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_main_refuses_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.jsonl"
    code = main([f"output_dir={tmp_path / 'out'}", f"data.train_file={missing}", "--check"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.train_file" in err[0] and "does not exist" in err[0]
    assert not (tmp_path / "out").exists()


def test_check_accepts_the_demo(demo: tuple[Path, list[str]], tmp_path: Path) -> None:
    _, overrides = demo
    assert main([*ON_THIS_MACHINE, *overrides, f"output_dir={tmp_path}", "--check"]) == 0


def test_readme_config_reference_is_generated_from_the_schema() -> None:
    rows = list(config_reference.rows())
    keys = [key for key, _, _ in rows]
    assert set(CONTRACT_KEYS) <= set(keys) and len(keys) == len(set(keys))
    assert all(meaning for _, _, meaning in rows), "a config/schema.py field without a comment"
    assert ("train.precision", "`bf16` \\| `fp16` \\| `fp32`") in [(key, kind) for key, kind, _ in rows]
    readme = config_reference.README.read_text(encoding="utf-8")
    assert config_reference.readme_with_reference(readme) == readme, (
        f"README.md's config reference is out of date: python -m {config_reference.__name__} --write"
    )


def test_the_pre_check_imports_no_torch(demo: tuple[Path, list[str]], tmp_path: Path) -> None:
    """launch.sh runs --check before torchrun: importing torch there would add seconds to every launch."""
    arguments = ["--check", *ON_THIS_MACHINE, *demo[1], f"output_dir={tmp_path}"]
    script = (
        "import sys\n"
        f"from {PACKAGE}.__main__ import main\n"
        f"code = main({arguments!r})\n"
        "print(code, sorted(name for name in ('torch', 'transformers', 'numpy') if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=launch_env(1)
    )
    on_gpu = load_config([*ON_THIS_MACHINE, *demo[1]]).distributed.device is Device.cuda
    assert done.stdout.strip() == ("0 ['torch']" if on_gpu else "0 []"), done.stdout + done.stderr


def check_in_a_process(overrides: list[str], cwd: Path | None = None, **env: str):
    """What launch.sh runs before torchrun starts: ``python -m <package> --check``."""
    command = [sys.executable, "-m", PACKAGE, "--check", *ON_THIS_MACHINE, *overrides]
    environment = launch_env(1, **env)
    return subprocess.run(command, env=environment, cwd=cwd, capture_output=True, text=True, timeout=120)


def refusal(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr  # one line: no traceback
    [line] = result.stderr.splitlines()
    return line


# Where data files are JSON Lines, a folder is not one (image classification reads folders).
REFUSALS = ["a YAML typo", "output_dir is a file", "output_dir is below a file", "a mistyped local model"]
if MODEL_TYPE in ("text-classification", "causal-lm"):
    REFUSALS.append("data.train_file is a folder")


@pytest.mark.parametrize("case", REFUSALS)
def test_the_pre_check_refuses_in_one_line(demo, tmp_path: Path, case: str) -> None:
    directory, overrides = demo
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    mistyped_model = "has no model.safetensors" if MODEL_TYPE == "custom" else "does not exist ("
    override, message = {
        "a YAML typo": ("train.lr=[1,", "error: train.lr: '[1,' is not a YAML value ("),
        "output_dir is a file": (f"output_dir={a_file}", "is a file; give a folder"),
        "output_dir is below a file": (f"output_dir={a_file / 'run'}", "is below "),
        "a mistyped local model": (f"model.pretrained={directory.name}/modle", mistyped_model),
        "data.train_file is a folder": (f"data.train_file={directory}", "is a folder; give the data file"),
    }[case]
    started = time.monotonic()
    output_dir = f"output_dir={tmp_path / 'out'}"
    result = check_in_a_process([*overrides, output_dir, override], cwd=directory.parent)
    assert message in refusal(result)
    assert time.monotonic() - started < 30  # no hub retries
    assert not (tmp_path / "out").exists()


def test_an_unwritable_output_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a read-only file system answers
    with pytest.raises(ConfigError, match=r"output_dir='.*' is not writable \(.*\); choose another"):
        require_writable_output_dir(str(tmp_path / "run"))


@pytest.mark.parametrize(
    "override,generating_type", [("eval.generate_samples=2", "causal-lm"), ("eval.num_beams=2", "seq2seq")]
)
def test_generation_settings_are_refused_where_nothing_generates(override: str, generating_type: str) -> None:
    config = load_config([override])
    refusal = rf"^{re.escape(override.partition('=')[0])}: only a {generating_type} project .*; set it to"
    if generating_type == MODEL_TYPE:
        check_eval(config)  # accepted: this project's evaluation generates
    else:
        with pytest.raises(ConfigError, match=refusal):
            check_eval(config)


def resolve_in_a_process(name: str, **env: str) -> subprocess.CompletedProcess:
    """``pretrained.resolve`` as the pre-check runs it, in a process of its own: huggingface_hub reads its
    settings (HF_HUB_OFFLINE, HF_HUB_CACHE, HF_ENDPOINT) when it is imported. Every model type carries
    task/pretrained.py; a project of the custom type needs huggingface_hub installed for these tests."""
    pytest.importorskip("huggingface_hub")
    code = (
        f"import sys\nfrom {PACKAGE}.task.pretrained import PretrainedError, resolve\n"
        f"try:\n    print(resolve({name!r}))\n"
        "except PretrainedError as error:\n    sys.exit('error: ' + str(error))\n"
    )
    command = [sys.executable, "-c", code]
    return subprocess.run(command, env=launch_env(1, **env), capture_output=True, text=True, timeout=120)


def test_an_uncached_hub_model_offline_is_one_line_with_the_fix(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    started = time.monotonic()
    offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    line = refusal(resolve_in_a_process("someone/not-downloaded", **offline))
    assert time.monotonic() - started < 30
    assert line.startswith("error: model.pretrained='someone/not-downloaded' is not a local folder, nor in")
    assert "HF_HUB_OFFLINE" in line and str(cache) in line and "hf download someone/not-downloaded" in line


def test_an_unreachable_hub_is_one_line_within_seconds(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on: the hub's address, unreachable
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    started = time.monotonic()
    hub = {"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0"}
    line = refusal(resolve_in_a_process("someone/not-downloaded", **hub))
    assert time.monotonic() - started < 30
    assert f"and {endpoint} did not answer" in line and "HF_HUB_OFFLINE=1" in line


def test_a_cached_hub_model_passes_offline(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--someone--downloaded" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    result = resolve_in_a_process("someone/downloaded", **offline)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("someone/downloaded in the Hugging Face cache")
