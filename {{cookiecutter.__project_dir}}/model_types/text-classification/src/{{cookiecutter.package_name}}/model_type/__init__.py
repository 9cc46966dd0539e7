"""This project's model type: text classification. ``task.TASK`` is what the shared loop calls."""
