"""Offline demo builders, one per model type: a tiny local checkpoint plus data in the contract format."""
