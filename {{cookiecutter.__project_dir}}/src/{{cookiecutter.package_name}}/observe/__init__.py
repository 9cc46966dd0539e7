"""What a run shows: the logger, metrics.jsonl and the console, the trackers, throughput and memory.
Imports config/ and parallel/ (rank 0 writes; collectives agree on what to show)."""
