"""Who may call how much: rate limits, budgets, the duplicate guard and delegation.

Transports use the ``CallPolicy`` facade; the pieces underneath are small pure functions plus
stores behind protocols (in memory here, Redis in ``redis_stores``).
"""

from satgate_mcp.policy.engine import Admission, CallPolicy
from satgate_mcp.policy.refunds import FailureKind, failure_kind, refundable, upstream_certainly_did_not_run

__all__ = ["Admission", "CallPolicy", "FailureKind", "failure_kind", "refundable", "upstream_certainly_did_not_run"]
