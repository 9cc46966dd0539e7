"""This project's model type: token classification (NER-style tagging). ``task.TASK`` is what the shared
loop calls."""
