"""What the console reads and acts on, handed in by the app: the gateway's own parts, nothing of its own
on a call's path. One record so the page, the login and the API share one set of parts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from satgate_mcp.console.cluster import Sampler
from satgate_mcp.console.features import Features
from satgate_mcp.console.gatekeeper import Gatekeeper
from satgate_mcp.contracts import Pool
from satgate_mcp.events import Publisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.pins import PinStore
from satgate_mcp.policy.policy_file import PolicyFile
from satgate_mcp.sessions import Session, SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.stores import Stores


@dataclass(slots=True)
class Parts:
    settings: Settings
    gatekeeper: Gatekeeper
    registry: SessionRegistry
    pool: Pool
    metrics: Metrics
    stores: Stores
    publisher: Publisher
    sampler: Sampler
    #: Ends a session as its owner's DELETE does (tombstoned for every process with Redis).
    end_session: Callable[[Session], Awaitable[None]]
    #: The registry's clock (ages of sessions are measured on it).
    clock: Callable[[], float]
    policy_file: PolicyFile | None = None
    #: Pinned definitions, when ``SATGATE_TOOL_PINNING`` is not ``off``.
    pins: PinStore | None = None
    features: Features = field(default_factory=Features)
