"""Validate the answers before anything is written.

Every answer is rendered once, as JSON, and checked in plain Python. A refusal prints one line on stderr
naming the answer and the fix, and exits 1; cookiecutter then removes the half-made output directory.
Warnings and notes are printed only once every answer is accepted, so a refusal is the first line printed.
"""

import json
import keyword
import re
import sys

ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")

# The values of every choice answer, equal to the lists in cookiecutter.json (a template test holds them
# equal). cookiecutter checks a choice given on the command line, but takes a replay file's as written.
CHOICES = {
    "model_type": (
        "text-classification",
        "causal-lm",
        "image-classification",
        "custom",
        "token-classification",
        "seq2seq",
    ),
    "finetune": ("full", "lora"),
    "backend": ("nccl", "gloo"),
    "precision": ("bf16", "fp16", "fp32"),
    "tracker": ("none", "tensorboard", "wandb", "mlflow"),
    "strategy": ("ddp", "fsdp2"),
}
TEXT_ANSWERS = ("project_name", "project_slug", "package_name", "pretrained_model", "__kubernetes_name")
# cookiecutter renders answers as Jinja; these in a value that rendering left behind are code that the
# next render (a replay, a cruft update) would run. Spelled in parts: this file is a Jinja template.
JINJA_MARKERS = tuple("{" + second for second in ("{", "%", "#"))
MODEL_TYPES_NEEDING_CHECKPOINT = {
    "text-classification",
    "causal-lm",
    "image-classification",
    "token-classification",
    "seq2seq",
}
MAX_GPUS_PER_NODE = 64
# Import and distribution names of everything a generated project installs, for every model type and
# tracker, with its test extra; lower case, runs of '-', '_', '.' as '_'. A package or project of one of
# these names would shadow, or be replaced by, a dependency. tests/test_hook_tables.py checks that
# this covers the dependency closure installed in the test environment.
DEPENDENCY_NAMES = frozenset(
    """
    _cffi_backend _distutils_hack _multiprocess _pytest _xxhash _yaml absl absl_py accelerate alembic
    annotated_doc annotated_types anyio ast_serialize cachetools certifi cffi charset_normalizer click
    cloudpickle colorama contourpy coreweave_evaluations cryptography cwevals cycler databricks
    databricks_sdk datasets dateutil defusedxml dill distro dotenv fastapi filelock fonttools fsspec
    functorch git gitdb gitpython google google_auth googleapis_common_protos grpc grpcio h11 hf_xet
    httpcore httpcore2 httpx httpx2 huggingface_hub idna importlib_metadata iniconfig isympy jinja2 joblib
    kiwisolver lazy_importer librt lxml mako markdown markdown_it markdown_it_py markupsafe matplotlib mdurl
    mlflow mlflow_skinny mpl_toolkits mpmath multipart multiprocess mypy mypy_extensions mypyc narwhals
    networkx nltk numpy omegaconf opentelemetry opentelemetry_api opentelemetry_exporter_http_transport
    opentelemetry_exporter_otlp_common opentelemetry_exporter_otlp_proto_common
    opentelemetry_exporter_otlp_proto_http opentelemetry_proto opentelemetry_sdk
    opentelemetry_semantic_conventions packaging pandas pathspec peft pil pillow platformdirs pluggy
    portalocker protobuf psutil py pyarrow pyasn1 pyasn1_modules pycparser pydantic pydantic_core pygments
    pylab pyparsing pytest python_dateutil python_dotenv python_multipart pyyaml regex requests rich
    rouge_score ruff sacrebleu safetensors scikit_learn scipy seqeval setuptools shellingham six sklearn
    smmap sniffio sqlalchemy sqlparse starlette sympy tabulate tensorboard tensorboard_data_server
    threadpoolctl tokenizers torch torchgen tqdm transformers truststore typer typing_extensions
    typing_inspection tzdata urllib3 uvicorn wandb werkzeug xxhash yaml zipp
    """.split()  # noqa: SIM905 (a block of words reads better than quoted strings)
)
# The jobs' name (__kubernetes_name: the slug in lower case, '-' for '_', cut to 48 characters) must be a
# DNS-1035 label: the v1 operator names pods and services <name>-worker-<index>, at most 63 long.
KUBERNETES_NAME = re.compile(r"[a-z]([-a-z0-9]{0,46}[a-z0-9])?")
# JobSet, under a Trainer v2 TrainJob, refuses a job whose longest pod name,
# <name>-node-0-<last node index>-<5 random characters>, is over 63 characters.
TRAINJOB_POD_NAME = "{name}-node-0-{last}-abcde"


class Refusal(Exception):
    """An answer set that cannot produce a working project."""


def check_text(name, value):
    """Refuse Jinja left in any answer, and a text answer that is not a UTF-8 string (a replay file can
    hold any JSON)."""
    if isinstance(value, str) and any(marker in value for marker in JINJA_MARKERS):
        raise Refusal(
            f"{name}={value!r} holds Jinja after rendering, which would run as code when the project is "
            "rendered again; cookiecutter renders answers as Jinja, so write the text without "
            + ", ".join(repr(marker) for marker in JINJA_MARKERS)
        )
    if name not in TEXT_ANSWERS:
        return
    if not isinstance(value, str):
        raise Refusal(f"{name}={value!r} is not text; give it as a quoted string in a replay file")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a name read from bytes that were not UTF-8 (a command line, a file)
        raise Refusal(f"{name}={value!r} holds characters that are not UTF-8 text; retype it") from None


def check_choice(name):
    value, choices = ANSWERS[name], CHOICES[name]
    if value not in choices:
        raise Refusal(
            f"{name}={value!r} is not a choice of this template; answer one of {', '.join(choices)}"
        )


def parse_count(name, minimum, maximum=None):
    raw = str(ANSWERS[name]).strip()
    if not re.fullmatch(r"\d+", raw):
        raise Refusal(f"{name}={raw!r} is not a whole number; answer an integer >= {minimum}")
    value = int(raw)
    if value < minimum or (maximum is not None and value > maximum):
        upper = f"..{maximum}" if maximum is not None else " or more"
        raise Refusal(f"{name}={value} is out of range; answer {minimum}{upper}")
    return value


def parse_flag(name):
    """A yes/no answer. cookiecutter turns yes/no/true/false into a boolean; anything else (a string in a
    hand-written replay file, a number through the API) would render as true in the templates."""
    value = ANSWERS[name]
    if not isinstance(value, bool):
        fix = f"answer {name}=yes or {name}=no (true or false, unquoted, in a replay file)"
        raise Refusal(f"{name}={value!r} is not a boolean; {fix}")
    return value


def dependency_name(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def check_names():
    slug = ANSWERS["project_slug"]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", slug):
        raise Refusal(
            f"project_slug={slug!r} is not a usable folder name; give project_name some letters, "
            "or set project_slug to letters, digits, '-' and '_', starting with a letter"
        )
    if dependency_name(slug) in DEPENDENCY_NAMES:
        raise Refusal(
            f"project_slug={slug!r} is the distribution name of a dependency, which installing the "
            "project would replace; choose a different project_name or set project_slug explicitly"
        )
    package = ANSWERS["package_name"]
    fix = "choose a different project_name or set package_name explicitly"
    if not package.isidentifier() or keyword.iskeyword(package) or not package.isascii():
        raise Refusal(f"package_name={package!r} is not a valid Python identifier; {fix}")
    if package in sys.stdlib_module_names or dependency_name(package) in DEPENDENCY_NAMES:
        raise Refusal(f"package_name={package!r} would shadow the module {package!r}; {fix}")


def validate():
    """Refuse the first answer that cannot work; return the warnings and notes of an accepted set."""
    for name, value in ANSWERS.items():
        if not name.startswith("_") or name.startswith("__"):  # `_x` entries are cookiecutter's own
            check_text(name, value)
    for name in CHOICES:
        check_choice(name)
    if not ANSWERS["project_name"].strip():
        raise Refusal("project_name is empty; give the project a name")
    check_names()

    gpus = parse_count("gpus_per_node", 0, MAX_GPUS_PER_NODE)
    nodes = parse_count("num_nodes", 1)
    slurm, kubernetes = parse_flag("slurm"), parse_flag("kubernetes")
    name, slug = ANSWERS["__kubernetes_name"], ANSWERS["project_slug"]
    if kubernetes and not KUBERNETES_NAME.fullmatch(name):
        raise Refusal(
            f"kubernetes=yes names the job {name!r} after project_slug={slug!r}, which is not a valid "
            "Kubernetes name; set project_slug to start with a letter"
        )
    pod_name = TRAINJOB_POD_NAME.format(name=name, last=nodes - 1)
    if kubernetes and len(pod_name) > 63:
        raise Refusal(
            f"kubernetes=yes with num_nodes={nodes} names the TrainJob's last pod {pod_name!r}, "
            f"{len(pod_name)} characters, over Kubernetes' 63; shorten project_slug to at most "
            f"{len(name) - (len(pod_name) - 63)} characters"
        )
    backend, precision = ANSWERS["backend"], ANSWERS["precision"]
    if gpus == 0 and backend == "nccl":
        raise Refusal("backend=nccl needs GPUs but gpus_per_node=0; choose backend=gloo for CPU training")
    if gpus == 0 and precision == "fp16":
        raise Refusal("precision=fp16 needs GPUs but gpus_per_node=0; choose bf16 or fp32 for CPU training")
    model_type = ANSWERS["model_type"]
    if model_type == "custom" and ANSWERS["strategy"] == "fsdp2":
        raise Refusal(
            "strategy=fsdp2 needs a sharding plan, which model_type=custom's example model lacks; render "
            "with strategy=ddp, then give your model's block class as distributed.fsdp_wrap=<class name> "
            "(or _no_split_modules) and run with distributed.strategy=fsdp2"
        )
    if model_type == "custom" and ANSWERS["finetune"] == "lora":
        raise Refusal(
            "finetune=lora puts peft's LoRA adapters on a Hugging Face model's linear layers, and "
            "model_type=custom trains your own module; render with finetune=full, or pick a Hugging Face "
            "model_type"
        )
    if model_type in MODEL_TYPES_NEEDING_CHECKPOINT and not ANSWERS["pretrained_model"].strip():
        raise Refusal(
            f"pretrained_model is empty but model_type={model_type} fine-tunes a checkpoint; "
            "give a Hugging Face hub id or a local directory"
        )

    advice = []
    if gpus > 0 and backend == "gloo":
        advice.append(
            f"warning: backend=gloo with gpus_per_node={gpus} works but is much slower than nccl "
            "on GPUs; override later with distributed.backend=nccl"
        )
    if nodes > 1 and not (slurm or kubernetes):
        advice.append(multi_node_note(nodes))
    return advice


def multi_node_note(nodes):
    return (
        f"note: num_nodes={nodes} without slurm or kubernetes, so no cluster file is rendered. Run\n"
        "  multi-node by hand: start launch.sh once on every node, each with its own NODE_RANK and the\n"
        "  same first-node address, port and run id:\n"
        f"    NNODES={nodes} NODE_RANK=<0..{nodes - 1}> MASTER_ADDR=<first node> MASTER_PORT=29500 "
        "RUN_ID=<job id> ./launch.sh [key=value ...]\n"
        "  or render again with slurm=yes (an sbatch script) or kubernetes=yes (a Kubeflow TrainJob)."
    )


if __name__ == "__main__":
    try:
        for line in validate():
            print(line, file=sys.stderr)
    except Refusal as refusal:
        print(f"error: {refusal}", file=sys.stderr)
        sys.exit(1)
