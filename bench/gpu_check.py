"""The generated project on one GPU, about 6 minutes: nccl with world size 1, bf16 autocast, fp16 with
its gradient scaler, bf16 with torch.compile, and FSDP2 in bf16 (its MixedPrecisionPolicy, sharded
checkpoints, final/ gathered), on one GPU and, where the node has more, on all of them; on a
GPT-2-small-sized local checkpoint. Prints samples/s, tokens/s and mfu of each (from the project's own
metrics.jsonl; per GPU for the multi-GPU run) and writes them, with the GPU's name, to bench/results/
(and to $OUT when that is set, as on the device machine).

    bench/gpu_check.sh [--project DIR] [--cpu] [--skip-compile]

--project takes a GPU project rendered elsewhere (rendering needs cookiecutter); --cpu runs the same
plumbing on CPU with gloo and a tiny model (fp16 left out), to check the script without a GPU;
--skip-compile leaves the torch.compile run out (it compiles for minutes on a CPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import assets
import provenance

REPO = Path(__file__).resolve().parents[1]
# (name, overrides): each a run of the same steps.
CONFIGURATIONS = [
    ("bf16", ["train.precision=bf16"]),
    ("fp16 + GradScaler", ["train.precision=fp16"]),
    ("bf16 + torch.compile", ["train.precision=bf16", "train.compile=true"]),
    # Its runs checkpoint halfway, in the background: the sharded checkpoint is part of the check.
    ("fsdp2 bf16", ["train.precision=bf16", "distributed.strategy=fsdp2", "checkpoint.async=true"]),
]
FSDP2_ALL_GPUS = "fsdp2 bf16, all GPUs"
GPU_SIZE = {"hidden": 768, "layers": 12, "context": 512, "batch": 16, "steps": 300, "documents": 60000}
CPU_SIZE = {"hidden": 64, "layers": 2, "context": 64, "batch": 8, "steps": 12, "documents": 2000}


def render(work: Path, cpu: bool) -> Path:
    from cookiecutter.main import cookiecutter

    answers = {"project_name": "gpu-check", "project_slug": "gpu-check", "model_type": "causal-lm"}
    answers |= {"gpus_per_node": "0" if cpu else "1", "backend": "gloo" if cpu else "nccl"}
    answers["precision"] = "bf16"
    return Path(
        cookiecutter(
            str(REPO), no_input=True, extra_context=answers, output_dir=str(work), overwrite_if_exists=True
        )
    )


def build_inputs(work: Path, size: dict, project: Path) -> dict[str, str]:
    """A GPT-2 of ``size`` and documents of the causal demo's grammar, by the project's own demo."""
    work.mkdir(parents=True, exist_ok=True)
    assets.quiet()
    return assets.build_causal(work, assets.demo_module(project), size, size["documents"], 200, seed=0)


def run(
    project: Path, inputs: dict, size: dict, extra: list[str], output: Path, cpu: bool, processes: int = 1
) -> dict:
    shutil.rmtree(output, ignore_errors=True)
    overrides = [
        f"model.pretrained={inputs['model']}",
        f"data.train_file={inputs['train_file']}",
        f"data.val_file={inputs['val_file']}",
        f"data.max_length={size['context']}",
        f"data.batch_size={size['batch']}",
        f"train.max_steps={size['steps']}",
        f"train.log_every_steps={max(1, size['steps'] // 10)}",
        f"checkpoint.every_steps={size['steps'] // 2 if 'distributed.strategy=fsdp2' in extra else 0}",
        f"output_dir={output}",
        *(["distributed.device=cpu", "distributed.backend=gloo"] if cpu else []),
        *extra,
    ]
    env = {**os.environ, "NPROC_PER_NODE": str(processes), "PYTHONPATH": str(project / "src")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run([str(project / "launch.sh"), *overrides], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in records if "loss" in r][2:]  # past the first step and compilation
    # Per process: the records count the whole job's samples.
    rates = ("samples_per_s", "tokens_per_s")
    values = {key: statistics.median(r[key] for r in steady) / processes for key in rates}
    values["mfu"] = statistics.median(r["mfu"] for r in steady) if all("mfu" in r for r in steady) else None
    values["eval_loss"] = [r for r in records if "eval_loss" in r][-1]["eval_loss"]
    values["warnings"] = [
        line for line in done.stderr.splitlines() if "falls back" in line or "instead" in line
    ]
    return values


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def device_name(cpu: bool) -> str:
    if cpu:
        return "CPU (plumbing check, --cpu)"
    import torch

    return torch.cuda.get_device_name(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, help="a rendered GPU causal-lm project")
    parser.add_argument("--cpu", action="store_true", help="check the script's plumbing on CPU")
    parser.add_argument("--skip-compile", action="store_true", help="leave the torch.compile run out")
    parser.add_argument("--work-dir", type=Path, default=REPO / "build" / "gpu-check")
    args = parser.parse_args(argv)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print(
                f"gpu_check: {sys.executable} sees no CUDA GPU; run on a GPU machine, or --cpu",
                file=sys.stderr,
            )
            return 1
    size = CPU_SIZE if args.cpu else GPU_SIZE
    project = args.project or render(args.work_dir, args.cpu)
    inputs = build_inputs(args.work_dir / "inputs", size, project)
    configurations = [
        (label, extra, 1)
        for label, extra in CONFIGURATIONS
        if not (args.cpu and "fp16" in label) and not (args.skip_compile and "compile" in label)
    ]
    gpus = 0 if args.cpu else gpu_count()
    if gpus > 1:
        configurations.append((f"{FSDP2_ALL_GPUS} ({gpus})", CONFIGURATIONS[-1][1], gpus))
    name = device_name(args.cpu)
    lines = [
        f"# GPU check, {datetime.date.today().isoformat()}: {name}",
        "",
        f"GPT-2 shape: {size['hidden']} hidden, {size['layers']} layers, blocks of {size['context']} tokens, "
        f"batch {size['batch']}, {size['steps']} steps, world size 1 ({'gloo' if args.cpu else 'nccl'}). "
        f"Template commit {provenance.current_commit('gpu-check-')}.",
        "",
        "| configuration | samples/s per GPU | tokens/s per GPU | mfu | eval_loss | notes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    failed = False
    for label, extra, processes in configurations:
        output = args.work_dir / "runs" / re.sub(r"\W+", "-", label)
        result = run(project, inputs, size, extra, output, args.cpu, processes)
        if "error" in result:
            failed = True
            lines.append(f"| {label} | failed | | | | {result['error'].splitlines()[-1][:120]} |")
            print(result["error"], file=sys.stderr)
            continue
        mfu = "-" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"
        lines.append(
            f"| {label} | {result['samples_per_s']:.1f} | {result['tokens_per_s']:.0f} | {mfu} "
            f"| {result['eval_loss']:.3f} | {'; '.join(result['warnings'])[:120]} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    for folder in [args.work_dir if args.cpu else REPO / "bench" / "results", os.environ.get("OUT")]:
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / f"gpu-check-{slug}.md").write_text(text, encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
