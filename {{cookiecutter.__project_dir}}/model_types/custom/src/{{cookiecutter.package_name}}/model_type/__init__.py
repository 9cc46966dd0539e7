"""This project's model type: your own model, loss and data. ``task.TASK`` is what the shared loop calls."""
