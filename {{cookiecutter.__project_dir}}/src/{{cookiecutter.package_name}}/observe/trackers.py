"""Experiment trackers (TensorBoard, Weights & Biases, MLflow), fed by global rank 0 only.

A tracker receives exactly the records ``metrics.jsonl`` gets, named ``train/<key>`` and ``eval/<key>``.
A resumed run continues the tracker run it started: its id is kept in ``output_dir/tracker.json``.
Each tracker's package is imported only when that tracker is chosen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from omegaconf import OmegaConf

from ..config import Config, ConfigError, TrackerName
from ..parallel.process_group import DistEnv, broadcast_object

RUN_FILE = "tracker.json"

MLFLOW_STATUS = {"finished": "FINISHED", "preempted": "KILLED", "failed": "FAILED"}


class Tracker(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def close(self, outcome: str) -> None:
        """``outcome``: finished, preempted (to be resumed) or failed."""


class NoTracker:
    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self, outcome: str) -> None:
        pass


def open_tracker(config: Config, env: DistEnv, resumed_step: int | None) -> Tracker:
    """The tracker of this run on rank 0; every other rank gets one that does nothing.

    A collective: when rank 0 cannot open its tracker (wandb not logged in, say), every rank raises the
    same error, so the job ends with that one line instead of the other ranks' lost-connection traces.
    """
    tracker: Tracker = NoTracker()
    problem = None
    if env.is_main and config.tracker.name is not TrackerName.none:
        try:
            tracker = _open_on_rank_0(config, resumed_step)
        except ConfigError as error:
            problem = str(error)
    problem = broadcast_object(problem, env)
    if problem:
        raise ConfigError(problem)
    return tracker


def _open_on_rank_0(config: Config, resumed_step: int | None) -> Tracker:
    name = config.tracker.name
    output_dir = Path(config.output_dir)
    if name is TrackerName.tensorboard:
        return TensorBoardTracker(output_dir, resumed_step)
    run_file = output_dir / RUN_FILE
    run_id = _previous_run_id(run_file, name) if resumed_step is not None else None
    run_name = config.tracker.run_name or output_dir.resolve().name
    settings = OmegaConf.to_container(OmegaConf.structured(config), enum_to_str=True)
    tracker: WandbTracker | MlflowTracker
    if name is TrackerName.wandb:
        tracker = WandbTracker(config.tracker.project, run_name, run_id, output_dir, settings)
    else:
        tracker = MlflowTracker(config.tracker.project, run_name, run_id, settings)
    run_file.write_text(json.dumps({"tracker": name.value, "run_id": tracker.run_id}) + "\n")
    return tracker


def _previous_run_id(run_file: Path, name: TrackerName) -> str | None:
    try:
        saved = json.loads(run_file.read_text())
    except (OSError, ValueError):
        return None
    return saved.get("run_id") if saved.get("tracker") == name.value else None


def is_evaluation(record: dict[str, Any]) -> bool:
    return any(key.startswith("eval_") for key in record)


def tracked_values(record: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """The step and the numbers of a metrics record, named train/<key> or eval/<key>.

    The record's wall-clock ``time`` stays out: every tracker stamps its points itself.
    """
    values = {}
    evaluation = is_evaluation(record)
    for key, value in record.items():
        if key in ("step", "time") or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        values[f"eval/{key.removeprefix('eval_')}" if evaluation else f"train/{key}"] = float(value)
    return int(record["step"]), values


class TensorBoardTracker:
    def __init__(self, output_dir: Path, resumed_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides what a killed run logged after its checkpoint, as metrics.jsonl drops it.
        purge_step = None if resumed_step is None else resumed_step + 1
        self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"), purge_step=purge_step)

    def log(self, record: dict[str, Any]) -> None:
        step, values = tracked_values(record)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a record every few steps: cheap, and a killed run loses nothing logged

    def close(self, outcome: str) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(
        self, project: str, run_name: str, run_id: str | None, output_dir: Path, settings: Any
    ) -> None:
        import wandb

        # WANDB_MODE=offline (or a WANDB_API_KEY) decides where it goes; wandb reads its own env.
        try:
            self.run = wandb.init(
                project=project or None,
                name=run_name,
                id=run_id,
                resume="allow",
                dir=str(output_dir),
                config=settings,
            )
        except wandb.errors.UsageError as error:  # not logged in: say how, in one line
            raise ConfigError(
                f"tracker.name=wandb: {str(error).rstrip('.')}; or set WANDB_API_KEY, or WANDB_MODE=offline"
            ) from None
        self.run_id = self.run.id

    def log(self, record: dict[str, Any]) -> None:
        step, values = tracked_values(record)
        self.run.log(values, step=step)

    def close(self, outcome: str) -> None:
        if outcome == "preempted":
            self.run.mark_preempting()
        self.run.finish(exit_code=0 if outcome == "finished" else 1)


class MlflowTracker:
    def __init__(self, project: str, run_name: str, run_id: str | None, settings: Any) -> None:
        import mlflow

        # MLFLOW_TRACKING_URI picks the server; without it MLflow keeps runs in ./mlflow.db.
        self.mlflow = mlflow
        if project:
            mlflow.set_experiment(project)
        run = mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name)
        self.run_id = run.info.run_id
        if run_id is None:
            mlflow.log_params(_flatten(settings))

    def log(self, record: dict[str, Any]) -> None:
        step, values = tracked_values(record)
        self.mlflow.log_metrics(values, step=step)

    def close(self, outcome: str) -> None:
        self.mlflow.end_run(status=MLFLOW_STATUS[outcome])


def _flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
