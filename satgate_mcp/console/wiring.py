"""The console on the app: its routes, its gatekeeper and its sampler (one cleanup context), from the parts
``create_app`` already built. ``SATGATE_CONSOLE=off`` adds nothing at all."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from satgate_mcp.auth.base import Authenticator
from satgate_mcp.console.access import Rules
from satgate_mcp.console.api import Api
from satgate_mcp.console.cluster import Board, LocalBoard, Sampler, sampling
from satgate_mcp.console.cookies import cookie_keys
from satgate_mcp.console.features import Features
from satgate_mcp.console.gatekeeper import Gatekeeper
from satgate_mcp.console.pages import Pages
from satgate_mcp.console.parts import Parts
from satgate_mcp.contracts import Pool
from satgate_mcp.events import Publisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.pins import PinStore
from satgate_mcp.policy.policy_file import PolicyFile
from satgate_mcp.sessions import Session, SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.stores import Stores


@dataclass(slots=True)
class Gateway:
    """The parts of the gateway the console reads and acts through (what ``create_app`` has at hand)."""

    settings: Settings
    authenticator: Authenticator
    registry: SessionRegistry
    pool: Pool
    metrics: Metrics
    stores: Stores
    publisher: Publisher
    end_session: Callable[[Session], Awaitable[None]]
    clock: Callable[[], float]
    policy_file: PolicyFile | None = None
    pins: PinStore | None = None


def rules_of(settings: Settings) -> Rules:
    secret = settings.console_token.get_secret_value() if settings.console_token is not None else None
    return Rules(settings.auth_mode, settings.console_scope, secret, settings.host)


def add_console(app: web.Application, gateway: Gateway, features: Features | None = None) -> Parts | None:
    """Serve ``/console`` and ``/console/api/`` (None and nothing added when ``SATGATE_CONSOLE=off``)."""
    settings = gateway.settings
    if settings.console != "on":
        return None
    shared = [*settings.state_keys]
    if settings.console_token is not None:
        shared.append(settings.console_token.get_secret_value())
    gatekeeper = Gatekeeper(rules_of(settings), gateway.authenticator, cookie_keys(shared))
    board: Board = gateway.stores.board if gateway.stores.board is not None else LocalBoard()
    sampler = Sampler(gateway.metrics, gateway.registry, gateway.pool, board, store_up=gateway.stores.probe)
    parts = Parts(settings, gatekeeper, gateway.registry, gateway.pool, gateway.metrics, gateway.stores,
                  gateway.publisher, sampler, gateway.end_session, gateway.clock, gateway.policy_file,
                  gateway.pins, features or Features())
    Pages(parts).add_routes(app)
    Api(parts).add_routes(app)
    app.cleanup_ctx.append(sampling(sampler))
    return parts
