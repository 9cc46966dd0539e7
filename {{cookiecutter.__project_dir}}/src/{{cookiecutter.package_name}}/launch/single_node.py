"""What torchrun pays for many nodes that a job on one node need not.

Before a node's first rendezvous, torchrun sleeps a random 0 to 0.3 s, so that many nodes starting at once
do not all reach the rendezvous store in the same instant. A single node has no one to be spread from, and
the sleep (0.15 s on average, 0.26 s in the profile that found it) sits between launch and the first step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def skip_the_first_rendezvous_jitter() -> None:
    """Patch torchrun's rendezvous in this process (the launcher's) to skip the jitter; call once torch is
    imported, and only for a single-node job. Its other, fixed pauses (a retry's second) stay."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    delay = getattr(dynamic_rendezvous, "_delay", None)
    if delay is not None:  # a torch that spreads nodes otherwise keeps its own way
        dynamic_rendezvous._delay = _without_jitter(delay)


def _without_jitter(delay: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(delay)
    def fixed_pauses_only(seconds: float | tuple[float, float]) -> None:
        if isinstance(seconds, tuple):  # (low, high): the random spread between nodes
            return
        delay(seconds)

    return fixed_pauses_only
