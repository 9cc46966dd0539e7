"""The data-scale bench's targets, checked on results whose verdicts are known (its runs take an hour)."""

from __future__ import annotations

import sys

from template_helpers import REPO

sys.path.insert(0, str(REPO / "bench"))

import data_scale_report  # noqa: E402


def launch(lines: int, first_step: float, rerun_step: float, rss: list[float]) -> dict:
    def run(step: float) -> dict:
        return {"first_step_s": step, "rss_mb": rss, "wall_s": step + 10, "load": "1.00 1.00 1.00"}

    runs = {"first": run(first_step), "rerun": run(rerun_step)}
    return {"lines": lines, "implementation": "datasets", **runs, "cache_mb": 1.0}


def preprocess(lines: int, implementation: str, processes: int, lines_per_s: float) -> dict:
    run = {"lines": lines, "implementation": implementation, "processes": processes}
    return run | {"lines_per_s": lines_per_s, "seconds": lines / lines_per_s, "cpu_s": 1.0, "load": "1"}


def results_of_one_bench() -> dict:
    return {
        "template_commit": "1a2b3c4",
        "baseline": "259071a",
        "load_before": "1.00 1.00 1.00",
        "load_after": "1.00 1.00 1.00",
        "launch": [launch(4000, 20.0, 18.0, [1800, 1790]), launch(1_000_000, 90.0, 21.0, [1900, 1960])],
        "preprocess": [
            preprocess(100_000, "today", 1, 5000.0),
            preprocess(100_000, "datasets", 2, 8100.0),
            preprocess(1_000_000, "today", 1, 5000.0),
            preprocess(1_000_000, "datasets", 1, 5500.0),
            preprocess(1_000_000, "datasets", 2, 7500.0),
        ],
    }


def test_targets_pass_and_miss_where_the_numbers_say() -> None:
    lines = data_scale_report.targets(results_of_one_bench())
    assert lines[0].startswith("- PASS preprocessing at 100,000 lines: 1.62x")
    assert lines[1].startswith("- MISS preprocessing at 1,000,000 lines: 1.50x")  # the best of 1 and 2
    assert lines[2].startswith("- MISS peak RSS") and "rank 0 +100 MiB, rank 1 +170 MiB" in lines[2]
    assert lines[4].startswith("- PASS cached rerun") and "1.17x" in lines[4]  # 21 / 18
    assert lines[5].startswith("- PASS cached rerun") and "1.05x" in lines[5]  # 21 / 20


def test_the_table_names_its_commit_and_labels_every_column(tmp_path) -> None:
    import provenance

    table = data_scale_report.write(results_of_one_bench(), tmp_path, "2026-01-01")
    text = table.read_text(encoding="utf-8")
    assert table.name.startswith(data_scale_report.PREFIX)
    assert provenance.named_commit(text) == ("1a2b3c4", False)
    rows = [line for line in text.splitlines() if line.startswith("|")]
    header_cells = 0
    for row in rows:
        cells = row.count("|")
        if not row.startswith("|--") and "lines |" in row:
            header_cells = cells
        assert cells == header_cells, f"a row with other columns than its header: {row}"
