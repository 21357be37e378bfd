"""How hard the fuzz tests push: modest in CI, more with REFGPT_FUZZ=long (see the README)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG = os.environ.get("REFGPT_FUZZ", "") == "long"


def fuzz_settings(ci_examples: int, long_examples: int | None = None):
    """hypothesis settings: ``ci_examples`` cases by default, ``long_examples`` (20×) with REFGPT_FUZZ=long."""
    return settings(
        max_examples=(long_examples or 20 * ci_examples) if LONG else ci_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                               HealthCheck.data_too_large],
        derandomize=not LONG,  # CI runs the same cases every time; the long mode explores
    )
