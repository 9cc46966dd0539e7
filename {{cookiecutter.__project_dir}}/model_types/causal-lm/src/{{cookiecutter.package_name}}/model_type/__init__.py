"""This project's model type: causal language modelling. ``task.TASK`` is what the shared loop calls."""
