"""Test-runner configuration: hypothesis profiles for the property-based tests.

* ``ci`` (default): derandomized (the same examples on every run and machine), a small
  fixed example budget, no deadline (the first example of a shape pays for XLA
  compilation) and no example database.
* ``dev``: many more random examples, with the local example database
  (``.hypothesis/``) replaying earlier failures first.

Select with ``HYPOTHESIS_PROFILE=dev pytest tests/test_properties.py`` (or hypothesis'
own ``--hypothesis-profile=dev``). This is test-runner configuration, not library
configuration: fp4jax itself reads no environment variables.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=6,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
