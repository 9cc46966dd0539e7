"""The data layer: reading JSON Lines, CSV, Parquet and hub datasets, the preprocessing cache, labels,
the resumable ``DistributedSampler``, exact evaluation shards and the batch plan of a run."""
