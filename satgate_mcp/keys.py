"""Every typed ``web.AppKey`` in one place, so shared state has one name and one type.

Only state something reads back is stored: the parts themselves are wired by ``create_app``.
"""

from __future__ import annotations

from aiohttp import web

from satgate_mcp.console.parts import Parts
from satgate_mcp.contracts import Pool
from satgate_mcp.inflight import InflightLimiter
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.holds import Holds
from satgate_mcp.policy.policy_file import PolicyFile
from satgate_mcp.sessions import SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.stores import StoreProbe, Stores
from satgate_mcp.stores.audit_file import AuditFile
from satgate_mcp.stores.redis.tombstones import RedisTombstones
from satgate_mcp.upstream.user_grants import UserGrants

SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", SessionRegistry)
POOL = web.AppKey("pool", Pool)
METRICS = web.AppKey("metrics", Metrics)
#: Requests in flight per token id and per process, shared by /mcp and the legacy /message.
INFLIGHT = web.AppKey("inflight", InflightLimiter)
#: True when this process serves unknown-but-valid session ids again (header and OAuth modes).
RESUMES_SESSIONS = web.AppKey("resumes_sessions", bool)
#: Every store of this process (``open_stores``); the app opened them and closes them last.
STORES = web.AppKey("stores", Stores)
#: Each "oauth_user" upstream's users' grants, by upstream: /oauth/callback/<upstream> finishes authorizations there.
USER_GRANTS = web.AppKey("user_grants", dict[str, UserGrants])
#: Present with SATGATE_POLICY_FILE: the file every process re-reads when it changes.
POLICY_FILE = web.AppKey("policy_file", PolicyFile)
#: Approval holds and confirmations: the console's decisions wake the calls this process keeps waiting.
HOLDS = web.AppKey("holds", Holds)


#: Present with SATGATE_CONSOLE=on: what the console reads (tests take a sample now through its sampler).
CONSOLE = web.AppKey("console", Parts)

#: Present when a store is configured: Redis, or the state database (SATGATE_STATE_DIR).
STORE_PROBE = web.AppKey("store_probe", StoreProbe)

#: Present when DELETEs are shared through Redis (tests await its ``following`` and ``applied``).
TOMBSTONES = web.AppKey("tombstones", RedisTombstones)

#: Per-request facts the canonical log line reports.
SESSION_ID = web.RequestKey("session_id", str)
RPC_METHOD = web.RequestKey("rpc_method", str)
TOKEN_ID = web.RequestKey("token_id", str)
#: Set when the answer must close the connection (a body that never arrived: nothing more can be read on it).
CLOSE_CONNECTION = web.RequestKey("close_connection", bool)

#: The ``data.error`` reason of a refusal answer: what the HTTP request's span records as its ``error.type``.
REFUSAL_REASON = web.ResponseKey("refusal_reason", str)
#: The audit trail's writer, when ``SATGATE_AUDIT_FILE`` is set.
AUDIT = web.AppKey("audit", AuditFile)
