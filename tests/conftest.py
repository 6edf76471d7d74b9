"""Shared test configuration: hypothesis profiles.

- ``ci`` (default): at least 200 examples x 50 steps for the state machines.
- ``long``: the soak profile, 20,000 examples x 50 steps = 1,000,000 steps:
  ``HYPOTHESIS_PROFILE=long python -m pytest tests/test_pool_state_machine.py``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long",
    max_examples=20_000,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
