"""``python -m <package>.plot``: metrics.jsonl -> metrics.png, and one-line errors on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import METRIC, PACKAGE, PROJECT

from {{ cookiecutter.package_name }}.plot import (
    DPI,
    LR_TITLE,
    PANEL_SIZE,
    collect_series,
    draw,
    main,
    panels,
    read_records,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(output_dir: Path) -> Path:
    """A metrics.jsonl as a killed run leaves it: both record kinds, and torn lines."""
    output_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for step in range(1, 21):
        record = {"step": step, "epoch": step / 10, "loss": 2.0 / step, "lr": 1e-3 * (1 - step / 21)}
        records.append(json.dumps({**record, "samples_per_s": 100.0 + step}))
        if step % 10 == 0:
            records.append(json.dumps({"step": step, "epoch": step / 10, "eval_loss": 1.5, METRIC: 0.5}))
    lines = [*records[:5], '{"step": 6, "epoch": 0.6, "lo', *records[5:], '{"step": 21, "ep']
    (output_dir / "metrics.jsonl").write_text("\n".join(lines), encoding="utf-8")
    return output_dir


def test_torn_lines_are_skipped_and_both_kinds_are_read(tmp_path: Path) -> None:
    records = read_records(write_run(tmp_path))
    assert len(records) == 22  # 20 training, 2 evaluation
    series = collect_series(records)
    assert series["eval_loss"] == ([10, 20], [1.5, 1.5])
    assert len(series["loss"][0]) == 20
    assert "epoch" not in series and "step" not in series


def test_panels_put_eval_loss_with_loss_then_lr_then_eval_metrics_then_the_rest(tmp_path: Path) -> None:
    layout = panels(collect_series(read_records(write_run(tmp_path))))
    assert layout == [
        ("loss", ["loss", "eval_loss"]),
        (LR_TITLE, ["lr"]),
        (METRIC, [METRIC]),
        ("samples_per_s", ["samples_per_s"]),
    ]


def test_the_learning_rate_is_drawn_as_the_samples_it_is(tmp_path: Path) -> None:
    figure = draw(collect_series(read_records(write_run(tmp_path))), "run")
    lr_panel = next(ax for ax in figure.axes if ax.get_title(loc="left") == LR_TITLE)
    assert "logged steps" in LR_TITLE and "train.log_every_steps" in LR_TITLE
    assert [line.get_marker() for line in lr_panel.get_lines()] == ["o"]  # a point per record


def test_writes_a_real_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from matplotlib.image import imread

    assert main([str(write_run(tmp_path))]) == 0
    png = tmp_path / "metrics.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert 10_000 < png.stat().st_size < 300_000
    pixels = imread(png)
    height, width = pixels.shape[:2]
    assert (width, height) == (round(PANEL_SIZE[0] * DPI), round(PANEL_SIZE[1] * 4 * DPI))  # 4 panels
    assert len({tuple(pixel) for pixel in pixels.reshape(-1, pixels.shape[2])[::97]}) > 2  # not blank


def run_plot(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{PROJECT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", f"{PACKAGE}.plot", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def test_command_line(tmp_path: Path) -> None:
    shown = run_plot("--help")
    assert shown.returncode == 0 and "metrics.png" in shown.stdout
    misused = run_plot(str(tmp_path), "extra")
    assert misused.returncode == 2 and misused.stdout == ""
    assert misused.stderr == f"error: unrecognized arguments: extra; see python -m {PACKAGE}.plot --help\n"
    result = run_plot(str(write_run(tmp_path / "run")))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == tmp_path / "run" / "metrics.png"
    assert (tmp_path / "run" / "metrics.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing directory", "is not a directory"),
        ("no metrics.jsonl", "metrics.jsonl does not exist"),
        ("no records", "holds no records"),
    ],
)
def test_bad_input_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    output_dir = tmp_path / "run"
    args = [str(output_dir)]
    if case != "missing directory":
        output_dir.mkdir()
    if case == "no records":
        (output_dir / "metrics.jsonl").write_text('\n{"step": 1, "lo', encoding="utf-8")
    assert main(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not (output_dir / "metrics.png").exists()
