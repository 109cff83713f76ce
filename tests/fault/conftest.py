"""Fault tests run real daemons and containers: the e2e session leak check applies."""

from tests.e2e.conftest import nothing_leaked

__all__ = ["nothing_leaked"]
