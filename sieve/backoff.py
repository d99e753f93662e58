"""Jittered exponential backoff for reconnecting clients and retried writes."""

from __future__ import annotations

import random


def compute_backoff(attempt: int, *, base_s: float = 0.2, max_s: float = 5.0, jitter: bool = True) -> float:
    """Delay before retry number `attempt` (1-based): base x 2^(attempt-1), capped, with full jitter
    over the upper half so that many clients do not retry in step."""
    # the exponent is capped: 2**64 x any base is past any cap, and a larger power does not fit a float (attempt
    # numbers may be lease numbers, which a reconciled task raises by SIEVE_RECONCILE_FENCE_STEP)
    delay = min(max_s, base_s * (2 ** min(64, max(0, attempt - 1))))
    return random.uniform(delay / 2, delay) if jitter else delay


class Backoff:
    """Counts failures and says how long to wait before the next try; `reset` after a success."""

    def __init__(self, base_s: float = 0.2, max_s: float = 5.0) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self.failures = 0

    def reset(self) -> None:
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return compute_backoff(self.failures, base_s=self.base_s, max_s=self.max_s)
