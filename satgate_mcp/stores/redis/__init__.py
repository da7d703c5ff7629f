"""The shared store: every gateway process on one Redis sees the same budgets, records, revocations, DELETEs.

``client`` makes connections that fail fast (no retries: the caller bounds its wait), ``channel``
follows a pub/sub channel across reconnects; the rest are the stores built on them.
"""
