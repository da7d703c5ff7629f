"""Who may call how much: rate limits, budgets, the duplicate guard and delegation.

Transports use the ``CallPolicy`` facade (engine.py); the decisions underneath are small pure
functions (limits, budget, duplicates, refunds, settlement, delegation), and the stores that keep
their state are ``satgate_mcp.stores``'s, behind the protocols defined here. The engine carries
decisions out with the stores; shared_calls.py is the in-process half of the duplicate guard,
delegate.py the ``satgate/delegate`` flow. Nothing is imported here, so a store can import a decision
module without importing the engine that uses the store.
"""
