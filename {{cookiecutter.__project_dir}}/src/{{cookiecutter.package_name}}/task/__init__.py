"""What a model type builds on: the ``Task`` protocol the loop calls (spec.py), Hugging Face loading and
saving, LoRA adapters, classification metrics, and finding ``model.pretrained``."""
