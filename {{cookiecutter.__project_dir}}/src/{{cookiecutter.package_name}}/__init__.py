"""Distributed (DDP) fine-tuning: configuration, data, model, training loop and checkpoints."""
