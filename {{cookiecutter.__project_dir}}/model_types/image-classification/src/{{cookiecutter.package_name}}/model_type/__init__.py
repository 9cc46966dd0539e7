"""This project's model type: image classification. ``task.TASK`` is what the shared loop calls."""
