"""OpInfo conformance sweep of the spyre device (eager, compiled, standalone) -- issue #7.

``python -m vspyre.conformance`` (``make conformance``) runs the sweep and writes
``docs/op-coverage.md``; see ``sweep.py`` for verdicts and tolerances, ``xfails.toml`` for the
expected failures and their reasons.
"""

from .sweep import (MODES, VERDICTS, family, load_expectations, op_key, rates, read_results,  # noqa: F401
                    run_op, tolerances, unexpected)
