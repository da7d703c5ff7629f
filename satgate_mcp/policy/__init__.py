"""Who may call how much: rate limits, budgets, the duplicate guard and delegation.

Transports use the ``CallPolicy`` facade (engine.py); the decisions underneath are small pure
functions (limits, budget, duplicates, refunds, settlement, delegation) plus stores behind
protocols (in memory, or Redis in ``redis_stores``). The engine carries decisions out with the
stores; shared_calls.py is the in-process half of the duplicate guard, delegate.py the
``satgate/delegate`` flow.
"""

from satgate_mcp.policy.engine import Admission, CallPolicy
from satgate_mcp.policy.refunds import FailureKind, failure_kind, refundable, upstream_certainly_did_not_run

__all__ = ["Admission", "CallPolicy", "FailureKind", "failure_kind", "refundable", "upstream_certainly_did_not_run"]
