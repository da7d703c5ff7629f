"""``satgate/delegate``: mint a child token whose credits move out of its parent's budget.

What a child may be (narrower, shorter-lived, within depth) is planned purely in delegation.py;
this is the flow around it: plan, mint, verify what was minted, and only then move the credits,
so any failure leaves the parent as it was.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping

import structlog

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.budget import BudgetStore, child_account_ttl, initial_limit, shown_remaining
from satgate_mcp.policy.delegation import DEFAULT_MAX_DEPTH, DelegationRefused, Minter, Verifier, plan_child

DELEGATION_FAILED_CODE = -32000

_log = structlog.get_logger("satgate_mcp.policy")


class Delegator:
    def __init__(
        self,
        *,
        root_key: str | None,
        budgets: BudgetStore,
        operator_budgets: Mapping[str, float],
        publisher: Publisher,
        metrics: Metrics,
        wall_clock: Callable[[], float] = time.time,
        minter: Minter | None = None,
        verifier: Verifier | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        new_id: Callable[[], str] = lambda: secrets.token_hex(12),
    ) -> None:
        self._root_key = root_key
        self._budgets = budgets
        self._operator_budgets = operator_budgets
        self._publisher = publisher
        self._metrics = metrics
        self._wall_clock = wall_clock
        self._minter = minter
        self._verifier = verifier
        self._max_depth = max_depth
        self._new_id = new_id

    async def delegate(self, identity: Identity, params: JsonObj | None) -> JsonObj:
        """The child's token and numbers, or the ``delegation_failed`` GatewayError the client sees."""
        try:
            return await self._delegate(identity, params)
        except DelegationRefused as exc:
            self._metrics.refusals.labels(reason="delegation_failed").inc()
            self._publisher.publish(events.DELEGATION, ok=False, parent_id=identity.token_id,
                                    parent_budget_id=identity.budget_key, reason=exc.reason)
            data: JsonObj = {"error": "delegation_failed", "reason": exc.reason}
            raise GatewayError(f"Delegation failed: {exc.reason}", data, code=DELEGATION_FAILED_CODE) from None

    async def _delegate(self, parent: Identity, params: JsonObj | None) -> JsonObj:
        if self._root_key is None:
            raise DelegationRefused("delegation needs header auth")
        root_key = self._root_key
        now = self._wall_clock()
        plan = plan_child(parent, params, now=now, max_depth=self._max_depth)
        suffix = self._new_id()
        child_id, child_budget_id = f"dlg-{suffix}", f"dlg-budget-{suffix}"
        try:
            token = self._mint()(
                root_key, child_id,
                ttl=plan.ttl, tools=list(plan.tools) if plan.tools is not None else None,
                budget_id=child_budget_id, budget_limit=plan.budget, tenant=parent.tenant,
                parent_id=parent.token_id, depth=plan.depth, now=now,
                ancestors=plan.ancestors, max_depth=plan.max_depth,
                resources=plan.resources, prompts=plan.prompts,
                controls=parent.controls,  # a child keeps every tool control of its parent
            )
        except ValueError as exc:
            raise DelegationRefused(f"could not mint the child token: {exc}") from None
        except Exception:
            _log.exception("delegation_mint_failed", parent_id=parent.token_id)
            raise DelegationRefused("could not mint the child token") from None
        self._check_minted(root_key, token, child_id, child_budget_id)

        moved = await self._budgets.transfer(parent.budget_key, child_budget_id, plan.budget,
                                             parent_limit=initial_limit(parent, self._operator_budgets),
                                             ttl=child_account_ttl(plan.ttl))
        if not moved.allowed:
            if moved.exceeded:
                raise DelegationRefused(
                    f"parent budget holds {shown_remaining(moved.remaining):g} credits, "
                    f"less than the {plan.budget:g} requested")
            raise DelegationRefused("child budget id already exists")
        self._publisher.publish(events.DELEGATION, ok=True, token_id=child_id, budget_id=child_budget_id,
                                parent_id=parent.token_id, parent_budget_id=parent.budget_key,
                                budget=plan.budget, parent_remaining=shown_remaining(moved.remaining),
                                depth=plan.depth, expires_at=plan.expires_at, label=plan.label)
        return {
            "token": token,
            "tokenId": child_id,
            "budgetId": child_budget_id,
            "budget": plan.budget,
            "expiresAt": plan.expires_at,
            "parentId": parent.token_id,
            "depth": plan.depth,
            "tools": list(plan.tools) if plan.tools is not None else None,
            "label": plan.label,
            "parentRemaining": shown_remaining(moved.remaining),
        }

    def _check_minted(self, root_key: str, token: str, child_id: str, child_budget_id: str) -> None:
        """The child must verify as what was meant before any credit moves to it."""
        if self._verifier is None:
            from satgate_mcp.auth.macaroons import verify_signature

            self._verifier = verify_signature
        try:
            child = self._verifier(root_key, token)
        except Exception as exc:
            _log.warning("delegation_child_unverifiable", child_id=child_id, error=str(exc) or repr(exc))
            raise DelegationRefused("the minted child token does not verify") from None
        if (child.token_id, child.budget_id) != (child_id, child_budget_id):
            raise DelegationRefused("the minted child token does not verify")

    def _mint(self) -> Minter:
        if self._minter is None:
            from satgate_mcp.auth.macaroons import mint_token

            self._minter = mint_token
        return self._minter
