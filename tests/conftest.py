"""Shared test configuration: hypothesis profiles.

- ``ci`` (default): at least 200 examples x 50 steps for the state machines.
- ``long``: the soak profile, 30,000 examples x up to 50 steps. Hypothesis runs fewer than
  ``stateful_step_count`` steps in some examples (about 42 on average for the pool state
  machine), so 30,000 examples give well over 1,000,000 steps:
  ``HYPOTHESIS_PROFILE=long python -m pytest tests/pool/test_pool_state_machine.py``.
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
    max_examples=30_000,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
