"""Every typed ``web.AppKey`` in one place, so shared state has one name and one type."""

from __future__ import annotations

from aiohttp import web

from satgate_mcp.auth.base import Authenticator
from satgate_mcp.dispatch import Dispatcher, Policy, Pool
from satgate_mcp.events import Publisher
from satgate_mcp.inflight import InflightLimiter
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import SessionRegistry
from satgate_mcp.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", SessionRegistry)
AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
POOL = web.AppKey("pool", Pool)
POLICY = web.AppKey("policy", Policy)
PUBLISHER = web.AppKey("publisher", Publisher)
METRICS = web.AppKey("metrics", Metrics)
DISPATCHER = web.AppKey("dispatcher", Dispatcher)
#: Requests in flight per token id and per process, shared by /mcp and the legacy /message.
INFLIGHT = web.AppKey("inflight", InflightLimiter)
#: True when this process serves unknown-but-valid session ids again (header auth mode only).
RESUMES_SESSIONS = web.AppKey("resumes_sessions", bool)

#: Per-request facts the canonical log line reports.
SESSION_ID = web.RequestKey("session_id", str)
RPC_METHOD = web.RequestKey("rpc_method", str)
