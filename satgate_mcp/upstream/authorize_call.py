"""A call to an ``oauth_user`` upstream by a caller with no grant yet: the user is asked to authorize, by URL.

The 2025-11-25 URL-mode elicitation is the mechanism: ``elicitation/create`` with ``mode: "url"`` on the call's own
stream (through its relay, like any question put to a client; a 2026-07-28 client gets it as an
``input_required`` entry, which its relay does by itself). Once the client says it opened the URL, the call
waits (bounded) for the grant the callback stores, tells the client the elicitation is complete, and goes on.
A client that declared no URL elicitation, or whose user has not finished in time, gets the -32042
``URLElicitationRequiredError`` with the URL in ``data.elicitations``: it retries once the user is done. A user
who declines gets ``upstream_authorization_declined``. The decisions are the pure functions at the top.
"""

from __future__ import annotations

from typing import Literal

from satgate_mcp import jsonrpc
from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.base import is_relay
from satgate_mcp.upstream.credential import CallerCredential
from satgate_mcp.upstream.user_grants import Started, UserGrants

#: How long the client has to answer the elicitation itself (open the URL, or not).
ASK_SECONDS = 120.0
#: How long a call waits, once the URL was opened, for the user to finish at the authorization server.
AUTHORIZE_WAIT_SECONDS = 300.0

Action = Literal["accept", "decline", "cancel", "unavailable"]


def elicitation_params(upstream: str, started: Started) -> JsonObj:
    return {"mode": "url", "url": started.url, "elicitationId": started.elicitation_id,
            "message": f"Authorize the gateway to reach {upstream!r} on your behalf. Open the link, sign in and "
                       "approve; the call goes on once you are done."}


def action_of(answer: JsonObj) -> Action:
    """What the client's answer says: only an explicit ``accept`` means the user went to the URL."""
    error = answer.get("error")
    if isinstance(error, dict):
        data = error.get("data")
        return "unavailable" if isinstance(data, dict) and data.get("cannot_ask") is True else "cancel"
    result = answer.get("result")
    action = result.get("action") if isinstance(result, dict) else None
    return action if action in ("accept", "decline") else "cancel"


def authorization_required(upstream: str, params: JsonObj, why: str) -> GatewayError:
    """-32042 with the elicitation in ``data`` (the spec's shape), and the gateway's own fields beside it."""
    return GatewayError(f"upstream {upstream!r} needs your authorization first: {why}; open the URL, then retry",
                        {"elicitations": [params], "error": "upstream_authorization_required", "upstream": upstream},
                        code=jsonrpc.URL_ELICITATION_REQUIRED)


def declined(upstream: str) -> GatewayError:
    return GatewayError(f"upstream {upstream!r}: the user did not authorize the gateway to act for them there",
                        {"error": "upstream_authorization_declined", "upstream": upstream},
                        code=jsonrpc.TOOL_NOT_ALLOWED)


async def authorize(grants: UserGrants, caller: CallerCredential, relay: object, base: str) -> None:
    """Return once the caller has a grant; otherwise raise what the client should see."""
    started = await grants.begin(caller, base)
    params = elicitation_params(grants.name, started)
    if not is_relay(relay) or relay.lacks("elicitation/create", params) is not None:
        raise authorization_required(grants.name, params, "this client cannot be asked by URL")
    action = action_of(await relay.ask("elicitation/create", params, ASK_SECONDS))
    if action == "unavailable":
        raise authorization_required(grants.name, params, "this client cannot be asked by URL")
    if action != "accept":
        raise declined(grants.name)
    if not await grants.wait(caller, AUTHORIZE_WAIT_SECONDS):
        raise authorization_required(grants.name, params, "the authorization was not completed in time")
    await relay.notify("notifications/elicitation/complete", {"elicitationId": started.elicitation_id})
