"""The parallel layer: the process group and its collectives, DDP and FSDP2 behind one strategy, mixed
precision, the training state and both checkpoint formats (one file by rank 0, or sharded through
``torch.distributed.checkpoint``). Imports config/ only."""
