"""Policy rules: a file compiles or says exactly what is wrong and where; the first matching rule decides.

The README's example policy is the one judged here: GitHub calls outside the caller's organisation and
destructive tools without the admin scope are refused, whatever else the call tries.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from satgate_mcp.auth.base import Identity
from satgate_mcp.guards import Asked, ClientFacts
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.conditions import ConditionError, compile_condition
from satgate_mcp.policy.decide import Decider, Decision
from satgate_mcp.policy.rules import Effect, PolicyInvalid, RuleSet, compile_rules, parse_text
from tests.policy.readme_policy import readme_policy

ACME = Identity(token_id="agent-7", tenant="acme", subject="alice", scopes=frozenset({"mcp:use"}),
                claims={"org": "acme", "sub": "alice"})
ADMIN = Identity(token_id="agent-8", scopes=frozenset({"mcp:use", "admin"}), claims={"org": "acme"})
#: Header mode: no claims at all, only caveats.
MACAROON = Identity(token_id="agent-9", caveats=("tools = github_*",))
GITHUB_GET = {"name": "github_get_repo", "inputSchema": {}, "annotations": {"readOnlyHint": True}}
GITHUB_DELETE = {"name": "github_delete_repo", "inputSchema": {}, "annotations": {"destructiveHint": True}}
DROP = {"name": "drop_table", "inputSchema": {}, "annotations": {"destructiveHint": True}}
ECHO = {"name": "echo", "inputSchema": {}}


def rules(document: object, default: Effect = Effect.ALLOW) -> RuleSet:
    return compile_rules(document, default, "policy.yaml")


def readme_rules() -> RuleSet:
    return rules(parse_text(readme_policy(), "README.md"))


def asked(identity: Identity, tool: JsonObj, args: JsonObj | None = None, method: str = "tools/call",
          **extra: Any) -> Asked:
    params: JsonObj = {"name": tool["name"], "arguments": args or {}}
    return Asked(method, identity, "s-1", "tool", str(tool["name"]), params, "github", tool,
                 extra.get("client", ClientFacts("2025-11-25", "claude-code", "2.1")), extra.get("remote_addr"))


def decide(ruleset: RuleSet, question: Asked) -> Decision:
    return Decider(ruleset, clock=lambda: datetime(2026, 7, 28, 12, tzinfo=UTC)).decide(question)


# --- the README's policy ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("identity", "tool", "args", "rule", "effect"), [
    pytest.param(ACME, GITHUB_GET, {"repo": "acme/widgets"}, None, "allow", id="own-org-repo-allowed"),
    pytest.param(ACME, GITHUB_GET, {"repo": "evil/widgets"}, "github-repo-outside-org", "deny", id="other-org"),
    pytest.param(ACME, GITHUB_GET, {"repo": "acme-evil/widgets"}, "github-repo-outside-org", "deny",
                 id="org-name-as-a-prefix-of-another-org"),
    pytest.param(ACME, GITHUB_GET, {"repo": "acme"}, "github-repo-outside-org", "deny", id="org-without-repo"),
    pytest.param(ACME, GITHUB_GET, {}, "github-repo-outside-org", "deny", id="no-repo-argument"),
    pytest.param(ACME, GITHUB_GET, {"repo": ["acme/widgets"]}, "github-repo-outside-org", "deny",
                 id="repo-not-a-string-is-an-error-so-denied"),
    pytest.param(MACAROON, GITHUB_GET, {"repo": "acme/widgets"}, "github-repo-outside-org", "deny",
                 id="no-org-claim-is-an-error-so-denied"),
    pytest.param(ACME, GITHUB_DELETE, {"repo": "acme/widgets"}, "destructive-needs-admin", "deny",
                 id="destructive-without-admin"),
    pytest.param(ADMIN, GITHUB_DELETE, {"repo": "acme/widgets"}, None, "allow", id="destructive-with-admin"),
    pytest.param(ADMIN, GITHUB_DELETE, {"repo": "other/widgets"}, "github-repo-outside-org", "deny",
                 id="admin-still-kept-in-the-org"),
    pytest.param(ACME, DROP, {"table": "users"}, "destructive-needs-admin", "deny", id="non-github-destructive"),
    pytest.param(ACME, ECHO, {"text": "hi"}, None, "allow", id="no-annotations-is-not-destructive"),
])
def test_the_readme_policy(identity: Identity, tool: JsonObj, args: JsonObj, rule: str | None, effect: str) -> None:
    decision = decide(readme_rules(), asked(identity, tool, args))
    assert (decision.rule, decision.effect.value) == (rule, effect)


def test_a_failing_condition_is_a_deny_naming_the_error_never_an_allow() -> None:
    decision = decide(readme_rules(), asked(MACAROON, GITHUB_GET, {"repo": "acme/widgets"}))
    assert decision.denied
    assert decision.error is not None
    assert "org" in decision.error


# --- first match wins, the default decides the rest ------------------------------------------------------------


def test_the_first_matching_rule_wins_and_the_default_decides_the_rest() -> None:
    ordered = rules({"rules": [
        {"name": "allow-echo", "tools": ["echo"], "effect": "allow"},
        {"name": "deny-all", "when": "true", "effect": "deny", "reason": "no"},
    ]}, Effect.DENY)
    assert decide(ordered, asked(ACME, ECHO)).rule == "allow-echo"
    assert decide(ordered, asked(ACME, DROP)).rule == "deny-all"
    only_echo = rules({"rules": [{"name": "allow-echo", "tools": ["echo"], "effect": "allow"}]}, Effect.DENY)
    fallback = decide(only_echo, asked(ACME, DROP))
    assert fallback.denied
    assert fallback.rule is None


@pytest.mark.parametrize(("when", "holds"), [
    pytest.param('token.id == "agent-7" && token.tenant == "acme" && token.subject == "alice"', True, id="token"),
    pytest.param('"mcp:use" in token.scopes && token.caveats == []', True, id="scopes-and-caveats"),
    pytest.param('tool.name == "drop_table" && tool.upstream == "github"', True, id="tool"),
    pytest.param("args.table == 'users'", True, id="args"),
    pytest.param('session.id == "s-1" && session.protocol == "2025-11-25" && session.client.name == "claude-code"'
                 ' && session.client.version == "2.1"', True, id="session"),
    pytest.param('request.method == "tools/call" && request.remote_addr == "192.0.2.7"', True, id="request"),
    pytest.param('now > timestamp("2026-01-01T00:00:00Z") && now.getHours() == 12', True, id="now"),
])
def test_every_variable_reads_what_the_call_says(when: str, holds: bool) -> None:
    ruleset = rules({"rules": [{"name": "r", "when": when, "effect": "deny"}]})
    assert decide(ruleset, asked(ACME, DROP, {"table": "users"}, remote_addr="192.0.2.7")).denied is holds


def test_methods_and_patterns_choose_the_rules_that_apply() -> None:
    ruleset = rules({"rules": [{"name": "prompts", "methods": ["prompts/get"], "tools": ["secret*"],
                                "effect": "deny"}]})
    prompt = Asked("prompts/get", ACME, "s-1", "prompt", "secret_plan", {"name": "secret_plan"})
    assert Decider(ruleset).decide(prompt).rule == "prompts"
    assert Decider(ruleset).decide(asked(ACME, {"name": "secret_tool"})).rule is None  # tools/call: not named


# --- a bad file says what and where ------------------------------------------------------------------------------


@pytest.mark.parametrize(("document", "expected"), [
    pytest.param([], 'expected an object with one key, "rules"', id="not-an-object"),
    pytest.param({"rules": [{"effect": "deny"}]}, 'must be an object with a "name"', id="no-name"),
    pytest.param({"rules": [{"name": "a", "effect": "deny"}, {"name": "a", "effect": "deny"}]},
                 "rule 'a' at rules[1]: duplicate rule name", id="duplicate-name"),
    pytest.param({"rules": [{"name": "a", "effect": "maybe"}]}, '"effect" must be "allow", "deny", "hold" or',
                 id="effect"),
    pytest.param({"rules": [{"name": "a", "effect": "hold", "methods": ["tools/list"]}]}, "applies to tool calls only",
                 id="hold-on-a-list"),
    pytest.param({"rules": [{"name": "a", "effect": "deny", "wait": 5}]}, '"wait" goes with "effect": "hold" only',
                 id="wait-without-hold"),
    pytest.param({"rules": [{"name": "a", "effect": "hold", "wait": 51}]}, '"wait" must be whole seconds from 1 to 50',
                 id="wait-too-long"),
    pytest.param({"rules": [{"name": "a", "effect": "hold", "wait": True}]}, '"wait" must be whole seconds',
                 id="wait-not-a-number"),
    pytest.param({"rules": [{"name": "a", "effect": "deny", "tools": ["git*hub"]}]}, "invalid tool pattern",
                 id="pattern-outside-the-grammar"),
    pytest.param({"rules": [{"name": "a", "effect": "deny", "methods": ["tools/delete"]}]}, "unknown method",
                 id="unknown-method"),
    pytest.param({"rules": [{"name": "a", "effect": "deny", "whn": "true"}]}, "unknown field 'whn'", id="typo"),
    pytest.param({"rules": [{"name": "bad-cel", "effect": "deny", "when": "args.repo ==="}]},
                 "rule 'bad-cel' at rules[0].when, line 1, column", id="cel-syntax-error-with-position"),
    pytest.param({"rules": [{"name": "a", "effect": "deny", "when": ""}]}, "non-empty CEL expression", id="empty"),
])
def test_a_bad_policy_names_the_rule_and_the_position(document: object, expected: str) -> None:
    with pytest.raises(PolicyInvalid) as caught:
        rules(document)
    assert expected in str(caught.value)
    assert str(caught.value).startswith("policy file policy.yaml")


def test_every_problem_is_listed_not_only_the_first() -> None:
    with pytest.raises(PolicyInvalid) as caught:
        rules({"rules": [{"name": "a", "effect": "x"}, {"name": "b", "effect": "deny", "when": "(("}]})
    assert [p.rule for p in caught.value.problems] == ["a", "b"]


def test_yaml_that_does_not_parse_gives_its_line_and_column() -> None:
    with pytest.raises(PolicyInvalid) as caught:
        parse_text('rules:\n  - name: "a\n', "policy.yaml")
    assert "line" in caught.value.problems[0].position


def test_json_is_a_policy_file_too() -> None:
    text = json.dumps({"rules": [{"name": "a", "tools": ["echo"], "effect": "deny", "reason": "r"}]})
    assert rules(parse_text(text, "policy.json")).rules[0].reason == "r"


# --- what a condition reads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "cached"), [
    pytest.param('"admin" in token.scopes', True, id="token-only"),
    pytest.param("tool.annotations.destructiveHint == true", True, id="tool-only"),
    pytest.param('args.repo == "x"', False, id="args"),
    pytest.param('args["repo"] == "x"', False, id="args-by-index"),
    pytest.param("[1, 2].exists(x, x == size(args))", False, id="args-inside-a-macro"),
    pytest.param('session.client.name == "x"', False, id="session"),
    pytest.param("now > timestamp('2026-01-01T00:00:00Z')", False, id="now"),
    pytest.param("'args' == 'x'", True, id="the-word-args-in-a-string-is-no-read"),
])
def test_which_conditions_are_decided_per_token_and_tool(source: str, cached: bool) -> None:
    assert compile_condition(source).per_token_and_tool is cached


@pytest.mark.parametrize("source", [
    pytest.param("1 / 0 == 1", id="division-by-zero"),
    pytest.param("args.missing == 1", id="missing-key"),
    pytest.param('args.n + "x" == "1x"', id="type-error"),
    pytest.param("args.n", id="not-a-boolean"),
    pytest.param("nosuchfunction(args)", id="unknown-function"),
])
def test_a_condition_that_throws_is_a_condition_error(source: str) -> None:
    with pytest.raises(ConditionError):
        compile_condition(source).evaluate({"args": {"n": 1}})


# --- lists: hidden only when denied whatever the arguments ------------------------------------------------------


@pytest.mark.parametrize(("identity", "tool", "hidden"), [
    pytest.param(ACME, DROP, True, id="destructive-without-admin-hidden"),
    pytest.param(ADMIN, DROP, False, id="destructive-with-admin-shown"),
    pytest.param(ACME, GITHUB_GET, False, id="depends-on-args-shown"),
    pytest.param(ACME, GITHUB_DELETE, True, id="every-outcome-a-deny-hidden"),
    pytest.param(ACME, ECHO, False, id="no-rule-shown"),
])
def test_the_readme_policy_hides_only_what_it_always_denies(identity: Identity, tool: JsonObj, hidden: bool) -> None:
    assert Decider(readme_rules()).hidden(identity, "tools", tool, "github") is hidden


def test_an_allow_that_reads_args_before_a_deny_keeps_the_tool_listed() -> None:
    ruleset = rules({"rules": [{"name": "maybe", "when": "args.ok == true", "effect": "allow"},
                               {"name": "no", "effect": "deny"}]})
    assert not Decider(ruleset).hidden(ACME, "tools", ECHO, None)
    assert Decider(ruleset).decide(asked(ACME, ECHO, {"ok": True})).effect is Effect.ALLOW


def test_a_list_rule_hides_from_its_list_only() -> None:
    ruleset = rules({"rules": [{"name": "unlisted", "methods": ["tools/list"], "tools": ["echo"], "effect": "deny"}]})
    decider = Decider(ruleset)
    assert decider.hidden(ACME, "tools", ECHO, None)
    assert decider.decide(asked(ACME, ECHO)).effect is Effect.ALLOW


def test_a_default_deny_hides_what_no_rule_allows() -> None:
    ruleset = rules({"rules": [{"name": "echo-ok", "tools": ["echo"], "effect": "allow"}]}, Effect.DENY)
    decider = Decider(ruleset)
    assert not decider.hidden(ACME, "tools", ECHO, None)
    assert decider.hidden(ACME, "tools", DROP, None)
    assert decider.hidden(ACME, "prompts", {"name": "anything"}, None)


# --- the plan cache never serves another caller's or another definition's answer -------------------------------


def test_a_plan_is_made_once_per_token_and_tool() -> None:
    decider = Decider(readme_rules())
    first = decider.plan(ACME, "tools/call", "drop_table", "github", DROP)
    assert decider.plan(ACME, "tools/call", "drop_table", "github", DROP) is first


def test_claims_that_differ_are_never_served_from_the_cache() -> None:
    """Identity equality ignores claims (sessions compare identities): the plan must not."""
    decider = Decider(readme_rules())
    same_but_other_org = Identity(token_id="agent-7", tenant="acme", subject="alice", scopes=frozenset({"mcp:use"}),
                                  claims={"org": "evil"})
    assert same_but_other_org == ACME
    assert not decide(readme_rules(), asked(ACME, GITHUB_GET, {"repo": "acme/x"})).denied
    assert not decider.decide(asked(ACME, GITHUB_GET, {"repo": "acme/x"})).denied
    assert decider.decide(asked(same_but_other_org, GITHUB_GET, {"repo": "acme/x"})).denied


def test_a_changed_definition_is_judged_afresh() -> None:
    """An upstream that turns a tool destructive after the first call gets the new definition judged."""
    decider = Decider(readme_rules())
    harmless = {"name": "drop_table", "inputSchema": {}, "annotations": {"destructiveHint": False}}
    assert not decider.decide(asked(ACME, harmless)).denied
    assert decider.decide(asked(ACME, DROP)).denied


def test_arguments_too_large_to_judge_are_refused_not_converted() -> None:
    """A body of 100 000 small values would take a quarter of a second to convert, for every such call."""
    ruleset = rules({"rules": [{"name": "r", "tools": ["echo"], "when": 'args.text == "no"', "effect": "deny"}]})
    flood = {f"k{i}": i for i in range(100_000)}
    decision = decide(ruleset, asked(ACME, ECHO, flood))
    assert decision.denied
    assert decision.error is not None
    assert "more than 10000 values" in decision.error
    assert not decide(ruleset, asked(ACME, ECHO, {"text": "yes", "list": list(range(100))})).denied
