"""Plot a run: ``python -m <package>.plot [output_dir]`` turns ``metrics.jsonl`` into ``metrics.png``.

Panels against step: training loss with eval_loss on the same axes, the learning rate, then one panel
per other metric found: the evaluation metrics (eval_accuracy or eval_perplexity), then the rest
(samples_per_s, ...). Training records come every ``train.log_every_steps`` steps, so the learning rate
is drawn as the samples it is (a point per record): a warmup that ends between two records shows its
peak at neither.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .config.cli import command_parser

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DESCRIPTION = """Reads OUTPUT_DIR/metrics.jsonl (default OUTPUT_DIR: outputs/run), writes
OUTPUT_DIR/metrics.png and prints its path. Works on a run in progress, or one that was killed."""

# The x axis and its companion, not metrics. FIXED_PANELS come first; any other number gets its own panel.
NOT_PLOTTED = {"step", "epoch", "time"}
LR_TITLE = "learning rate, at the logged steps only (train.log_every_steps)"
FIXED_PANELS = [("loss", ["loss", "eval_loss"]), (LR_TITLE, ["lr"])]
# Drawn as points: evaluations are few (and a lone point draws no line), and lr is a sample per record.
MARKED = ("eval_", "lr")
PANEL_SIZE = (7.0, 2.2)  # inches; with DPI, keeps the PNG small enough to commit
DPI = 90

Series = dict[str, tuple[list[float], list[float]]]


class PlotError(Exception):
    """Input that cannot be plotted; the message names the problem and the fix."""


def read_records(output_dir: Path) -> list[dict]:
    if not output_dir.is_dir():
        raise PlotError(f"{output_dir} is not a directory; pass the output_dir of a training run")
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        raise PlotError(f"{path} does not exist; train first, or pass the output_dir of a training run")
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the last line of a run killed mid-write
            continue
        if isinstance(record, dict) and _is_number(record.get("step")):
            records.append(record)
    if not records:
        raise PlotError(f"{path} holds no records yet; plot again after train.log_every_steps steps")
    return records


def _is_number(value: object) -> bool:
    # bool is an int; NaN/inf (a diverged loss) would break the axis limits.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def collect_series(records: list[dict]) -> Series:
    """metric -> (steps, values), in file order."""
    series: Series = {}
    for record in records:
        for key, value in record.items():
            if key not in NOT_PLOTTED and _is_number(value):
                steps, values = series.setdefault(key, ([], []))
                steps.append(record["step"])
                values.append(value)
    return series


def panels(series: Series) -> list[tuple[str, list[str]]]:
    """(title, metrics) of each panel that has data."""
    fixed = [key for _, keys in FIXED_PANELS for key in keys]
    others = sorted((key for key in series if key not in fixed), key=lambda key: not key.startswith("eval_"))
    layout = FIXED_PANELS + [(key, [key]) for key in others]
    return [(title, [key for key in keys if key in series]) for title, keys in layout if series.keys() & keys]


def draw(series: Series, title: str) -> Figure:
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, no display
    except ImportError as error:
        raise PlotError(f"{error}; install it with: pip install matplotlib") from None
    layout = panels(series)
    figure = Figure(figsize=(PANEL_SIZE[0], PANEL_SIZE[1] * len(layout)), layout="constrained")
    axes = figure.subplots(len(layout), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (panel_title, keys) in zip(axes, layout, strict=True):
        for key in keys:
            steps, values = series[key]
            marker = "o" if key.startswith(MARKED) or len(steps) == 1 else None
            ax.plot(steps, values, marker=marker, markersize=3, label=key)
        ax.set_title(panel_title, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        if len(keys) > 1:
            ax.legend(fontsize=8)
    axes[-1].set_xlabel("step", fontsize=9)
    figure.suptitle(title, fontsize=10)
    return figure


def plot(output_dir: Path) -> Path:
    series = collect_series(read_records(output_dir))
    path = output_dir / "metrics.png"
    draw(series, str(output_dir)).savefig(path, dpi=DPI)  # the format (PNG, Agg) follows from the suffix
    return path


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("plot", DESCRIPTION)
    parser.add_argument("output_dir", nargs="?", default="outputs/run", type=Path, help="the run to plot")
    output_dir: Path = parser.parse_args(argv).output_dir
    try:
        path = plot(output_dir)
    except PlotError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
