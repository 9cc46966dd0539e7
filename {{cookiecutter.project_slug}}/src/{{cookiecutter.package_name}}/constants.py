"""The template answers that the code branches on, rendered once into typed constants."""

from typing import Final

MODEL_TYPE: Final[str] = "{{ cookiecutter.model_type }}"
