"""This project's model type: sequence to sequence. ``task.TASK`` is what the shared loop calls."""
