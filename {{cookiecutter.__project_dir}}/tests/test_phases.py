"""The start-up and shut-down line: each phase's seconds, grouped around training."""

from __future__ import annotations

import time

import pytest

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.observe import (
    phases as phases_module,
)
from {{ cookiecutter.package_name }}.observe.phases import (
    TRAINING,
    PhaseClock,
    launch_started,
    process_started,
)


def test_the_process_started_before_this_test_and_not_long_before() -> None:
    started = process_started()
    assert started <= time.time()
    assert time.time() - started < 24 * 3600  # the boot-time arithmetic, not a date decades off


def test_each_phase_runs_from_the_end_of_the_one_before(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([11.0, 11.5, 30.0, 30.25, 31.0])
    monkeypatch.setattr(phases_module.time, "time", lambda: next(now))
    clock = PhaseClock(started=10.0, launched=8.5)
    for phase in ("python and imports", "model", TRAINING, "final/", "last checkpoint"):
        clock.mark(phase)
    assert clock.summary() == (
        "wall time: launcher 1.50 s; start-up 1.50 s (python and imports 1.00, model 0.50); "
        "training 18.50 s; end 1.00 s (final/ 0.25, last checkpoint 0.75)"
    )


def test_without_launch_sh_or_training_the_line_says_what_it_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(phases_module.LAUNCH_STARTED_ENV, raising=False)
    assert launch_started() is None
    monkeypatch.setenv(phases_module.LAUNCH_STARTED_ENV, "12,5")  # a locale's decimal comma
    assert launch_started() is None
    monkeypatch.setattr(phases_module.time, "time", lambda: 12.0)
    clock = PhaseClock(started=10.0)
    clock.mark("data")
    assert clock.summary() == "wall time: start-up 2.00 s (data 2.00)"
