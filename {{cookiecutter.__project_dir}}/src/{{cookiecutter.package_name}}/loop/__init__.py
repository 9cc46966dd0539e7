"""The training loop: the Trainer and its set-up phases, the optimizer and schedule, evaluation, generated
samples, the longest-batch check and the non-finite guard."""
