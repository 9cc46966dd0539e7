"""The template answers that the code branches on, rendered once into typed constants."""

from typing import Final

PACKAGE: Final[str] = "{{ cookiecutter.package_name }}"
MODEL_TYPE: Final[str] = "{{ cookiecutter.model_type }}"
# launch.sh starts this many processes per node unless NPROC_PER_NODE or CUDA_VISIBLE_DEVICES says
# otherwise; 0 is a CPU-only project, which starts one. The doctor checks it against the visible GPUs.
GPUS_PER_NODE: Final[int] = {{ cookiecutter.gpus_per_node | int }}
