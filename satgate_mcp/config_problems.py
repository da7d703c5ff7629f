"""What is wrong with the configuration, in an operator's words: one line per problem.

pydantic says ``Unable to extract tag using discriminator 'transport'`` or ``Input should be a valid list``; a
newcomer needs the variable (or flag) to fix, what it expects and a value that works. Each pydantic error becomes
``invalid <VARIABLE>[ (<where>)]: <problem>; e.g. <example>``. A ``SATGATE_*`` name nothing reads stops ``serve``
too (``SATGATE_AUTH_MOD=header`` would otherwise start the gateway with auth off), named in one line with the
setting it most likely meant, unless ``SATGATE_ALLOW_UNKNOWN_VARIABLES=true``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

from annotated_types import Ge, Gt, Le, Lt
from dotenv import dotenv_values
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, PydanticUndefined
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from satgate_mcp.settings import (
    ENV_PREFIX,
    HttpUpstreamSpec,
    Settings,
    StdioUpstreamSpec,
    load_settings,
    unknown_variables,
)

#: The setting that keeps today's behaviour for unknown names: a warning in the log, and the start goes on.
OPT_OUT = "SATGATE_ALLOW_UNKNOWN_VARIABLES"

_SECRET_ONE_LINER = "\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')\""
_STDIO_SPEC = '{"transport": "stdio", "command": ["node", "server.js", "stdio"]}'
_HTTP_SPEC = '{"transport": "http", "url": "http://127.0.0.1:3001/mcp"}'

#: A working value for each setting whose default shows none (unset, empty, a secret, a structure), shell-quoted.
SETTING_EXAMPLES: dict[str, str] = {
    "auth_mode": "header",
    "root_key": _SECRET_ONE_LINER,
    "static_token": _SECRET_ONE_LINER,
    "metrics_token": _SECRET_ONE_LINER,
    "state_key": _SECRET_ONE_LINER,
    "console_token": _SECRET_ONE_LINER,
    "upstreams": f"'{{\"files\": {_STDIO_SPEC}}}'",
    "allowed_origins": "https://app.example.com,https://admin.example.com",
    "allowed_hosts": "gw.example.com,gw.example.com:9100",
    "revocation_file": "/var/lib/satgate-mcp/revoked.txt",
    "oauth_resource_metadata_url": "https://gw.example.com/.well-known/oauth-protected-resource/mcp",
    "oauth_authorization_servers": "https://idp.example.com",
    "oauth_issuer": "https://idp.example.com",
    "oauth_jwks_url": "https://idp.example.com/.well-known/jwks.json",
    "oauth_audience": "https://gw.example.com/mcp",
    "oauth_tool_scopes": '\'{"db_*": "db:write", "*": "mcp:use"}\'',
    "oauth_budget_claim": "team",
    "rate_limit": "10/s",
    "rate_burst": "20",
    "tool_rate_limits": '\'{"search": "5/s", "db_*": "600/m"}\'',
    "tool_costs": '\'{"search": 1, "db_*": 5}\'',
    "budgets": '\'{"team-a": 1000}\'',
    "events_file": "/var/log/satgate-mcp/events.jsonl",
    "policy_file": "/etc/satgate-mcp/policy.yaml",
    "audit_file": "/var/lib/satgate-mcp/audit.jsonl",
    "approval_webhook": "https://hooks.example.com/satgate-approvals",
    "approval_webhook_secret": _SECRET_ONE_LINER,
    "redis_url": "redis://127.0.0.1:6379/0",
    "state_dir": "/var/lib/satgate-mcp",
    "log_format": "json",
    "identity_key": "/etc/satgate-mcp/identity-ed25519.pem",
    "public_url": "https://gateway.example.com",
    "credential_key": "<64 hex characters: python3 -c 'import secrets; print(secrets.token_hex(32))'>",
}

#: Per upstream spec field: what it must be, and a working ``"field": value`` pair.
SPEC_FIELDS: dict[str, tuple[str, str]] = {
    "transport": ('"stdio" or "http"', '"transport": "stdio"'),
    "command": ("a JSON list of strings (the program, then its arguments)",
                '"command": ["node", "server.js", "stdio"]'),
    "env": ("a JSON object of strings (variables added to the child's environment)", '"env": {"LOG_LEVEL": "debug"}'),
    "cwd": ("a folder path", '"cwd": "/srv/mcp"'),
    "timeout": ("a number of seconds greater than 0", '"timeout": 30'),
    "tool_prefix": ("a string put in front of each tool name", '"tool_prefix": "db_"'),
    "protocol": ('"auto", "2025" or "2026"', '"protocol": "auto"'),
    "isolation": ('"shared", "token" or "session"', '"isolation": "shared"'),
    "max_instances": ("a whole number of at least 1", '"max_instances": 100'),
    "url": ("an http:// or https:// URL", '"url": "http://127.0.0.1:3001/mcp"'),
    "headers": ("a JSON object of strings (HTTP headers sent upstream)", '"headers": {"Authorization": "Bearer ..."}'),
    "breaker": ('a JSON object with "failures", "backoff", "max_backoff", "jitter"',
                '"breaker": {"failures": 5, "backoff": 1, "max_backoff": 60}'),
    "auth": ('a JSON object with "type": "token_exchange", "client_credentials" or "oauth_user"',
             '"auth": {"type": "client_credentials", "token_endpoint": "https://idp.example.com/token", '
             '"client_id": "gateway", "client_secret_env": "GATEWAY_CLIENT_SECRET"}'),
}

_SPEC_MODELS: dict[str, type[BaseModel]] = {"stdio": StdioUpstreamSpec, "http": HttpUpstreamSpec}
#: Upstream spec fields whose values may be credentials: never echoed.
_SECRET_SPEC_FIELDS = frozenset({"env", "headers", "auth"})
#: Settings whose values may carry credentials without being ``SecretStr`` (``redis://:password@host``).
_SECRET_SETTINGS = frozenset({"redis_url"})
_ECHO_LIMIT = 60
_NOT_AN_OBJECT = frozenset({"model_attributes_type", "model_type", "dict_type"})


def variable_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _plain(value: object) -> str:
    """``1800.0`` -> ``1800``, ``True`` -> ``true``: numbers and booleans as an operator writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def setting_example(field: str) -> str | None:
    """A value that works for the setting: from the table, else its default when that is a plain value."""
    if field in SETTING_EXAMPLES:
        return SETTING_EXAMPLES[field]
    info = Settings.model_fields.get(field)
    if info is None or info.default is PydanticUndefined or info.default is None:
        return None
    if isinstance(info.default, str | int | float | bool) and info.default != "":
        return _plain(info.default)
    return None


def _is_secret(field: str) -> bool:
    info = Settings.model_fields.get(field)
    return field in _SECRET_SETTINGS or (info is not None and "SecretStr" in str(info.annotation))


def _got(value: object, *, echo: bool, as_json: bool) -> str:
    """What was given: the value itself when it is short and not a secret, else only its kind."""
    if echo and isinstance(value, str | int | float | bool | list | dict):
        text = json.dumps(value) if as_json else repr(value) if isinstance(value, str) else _plain(value)
        return text if len(text) <= _ECHO_LIMIT else text[:_ECHO_LIMIT] + "..."
    kinds = {dict: "a JSON object", list: "a JSON list", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


def _bounds(metadata: Sequence[Any], ctx: Mapping[str, Any]) -> str:
    """`` from 0 to 65535``, `` greater than 0``...: the field's whole range, else the bound the error names."""
    found: dict[str, Any] = dict(ctx)
    for item in metadata:
        for kind, attr in ((Ge, "ge"), (Gt, "gt"), (Le, "le"), (Lt, "lt")):
            if isinstance(item, kind):
                found[attr] = getattr(item, attr)
    low = f"{_plain(found['ge'])}" if "ge" in found else None
    high = f"{_plain(found['le'])}" if "le" in found else None
    if low is not None and high is not None:
        return f" from {low} to {high}"
    parts = [text for text in (
        f"of at least {low}" if low is not None else None,
        f"greater than {_plain(found['gt'])}" if "gt" in found else None,
        f"of at most {high}" if high is not None else None,
        f"less than {_plain(found['lt'])}" if "lt" in found else None,
    ) if text]
    return " " + " and ".join(parts) if parts else ""


_BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def _whole_number(field: str) -> bool:
    """Whether the setting holds an ``int`` (``port``, ``rate_burst: int | None``), so a bound reads "whole"."""
    info = Settings.model_fields.get(field)
    return info is not None and (info.annotation is int or int in get_args(info.annotation))


def _expected(err: ErrorDetails, metadata: Sequence[Any] = (), *, whole: bool = False) -> str | None:
    """What a value of this kind must be, from the pydantic error type; None when pydantic's words must do."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind.startswith("int_") or (kind in _BOUND_ERRORS and whole):
        return "a whole number" + _bounds(metadata, ctx)
    if kind.startswith("float_") or kind in _BOUND_ERRORS:
        return "a number" + _bounds(metadata, ctx)
    if kind.startswith("bool_"):
        return "true or false"
    if kind == "literal_error":
        return str(ctx.get("expected", "")).replace("'", "") or None
    if kind in {"string_type", "string_too_short"}:
        return "a string"
    if kind in _NOT_AN_OBJECT:
        return "a JSON object"
    if kind == "list_type":
        return "a list"
    return None


def _message(err: ErrorDetails) -> str:
    return str(err["msg"]).removeprefix("Value error, ")


def _did_you_mean(name: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def _spec_example(name: str, http: bool) -> str:
    return f'"{name}": {_HTTP_SPEC if http else _STDIO_SPEC}'


def _whole_spec_problem(err: ErrorDetails, name: str) -> tuple[str, str]:
    """``(problem, example)`` for a spec that is no spec: no or a wrong ``transport``, not a JSON object."""
    spec, kind = err["input"], err["type"]
    example = _spec_example(name, http=isinstance(spec, dict) and "url" in spec and "command" not in spec)
    if kind == "union_tag_not_found":
        return 'missing "transport": expected "stdio" (run a command) or "http" (call a URL)', example
    if kind == "union_tag_invalid":
        tag = (err.get("ctx") or {}).get("tag", "")
        return f'"transport" must be "stdio" or "http", got {json.dumps(tag)}', example
    if kind in _NOT_AN_OBJECT:
        return f"each upstream must be a JSON object, got {_got(spec, echo=True, as_json=True)}", example
    return _message(err), example


def _unknown_field_problem(name: str, transport: str, field: str) -> tuple[str, str]:
    """A misspelled field gets its likely name; the other transport's field says which transport takes it."""
    model = _SPEC_MODELS.get(transport)
    accepted = list(model.model_fields) if model is not None else []
    guess = _did_you_mean(field, accepted)
    elsewhere = [tag for tag, other in _SPEC_MODELS.items() if tag != transport and field in other.model_fields]
    hint = (f' (did you mean "{guess}"?)' if guess else
            f' (it belongs to "transport": "{elsewhere[0]}")' if elsewhere else "")
    problem = f'unknown field "{field}"{hint}; "transport": "{transport}" takes {", ".join(accepted)}'
    if guess in SPEC_FIELDS:
        return problem, f'"{name}": {{..., {SPEC_FIELDS[guess][1]}}}'
    return problem, _spec_example(name, http=transport == "http")


def _spec_problem(err: ErrorDetails, loc: Sequence[str]) -> tuple[str, str]:
    """``(problem, example)`` for an error in one upstream's spec; ``loc``: name[, transport, field[, entry]]."""
    if len(loc) < 3:
        return _whole_spec_problem(err, loc[0])
    name, transport, field = loc[:3]
    kind = err["type"]
    if kind == "extra_forbidden":
        return _unknown_field_problem(name, transport, field)
    what, pair = SPEC_FIELDS.get(field, ("", ""))
    field_example = f'"{name}": {{..., {pair}}}' if pair else _spec_example(name, http=transport == "http")
    echo = field not in _SECRET_SPEC_FIELDS
    if kind == "missing":
        return f'missing "{field}"' + (f": expected {what}" if what else ""), _spec_example(name, transport == "http")
    if kind == "value_error":
        message = _message(err)
        label = f"{field}.{loc[4]}" if field == "auth" and len(loc) > 4 else field  # "auth": the field inside it
        return (message if message.startswith(f'"{field}"') else f'"{label}": {message}'), field_example
    if len(loc) > 3:  # one entry of a list or object field: ``command`` entry 1, ``env`` entry "A"
        entry = f'"{field}" entry {json.dumps(loc[3]) if field in _SECRET_SPEC_FIELDS else loc[3]}'
        must = _expected(err) or "valid"
        return f"{entry} must be {must}, got {_got(err['input'], echo=echo, as_json=True)}", field_example
    if what:
        return f'"{field}" must be {what}, got {_got(err["input"], echo=echo, as_json=True)}', field_example
    return f'"{field}": {_message(err)}', field_example


def _model_line(err: ErrorDetails) -> str:
    """An error the whole model raised (``loc`` is empty): its message names the variable first."""
    message = _message(err)
    m = re.match(r"(SATGATE_[A-Z0-9_]+) (?:is )?(.*)", message)
    if not m:
        return f"invalid configuration: {message}"
    var, rest = m.groups()
    # One upstream's problem says what to change in it; the variable's generic example would be another spec.
    example = None if rest.startswith("upstream ") else setting_example(var.removeprefix(ENV_PREFIX).lower())
    return f"invalid {var}: {rest}" + (f"; e.g. {var}={example}" if example else "")


def describe_error(err: ErrorDetails, flags: Mapping[str, str] | None = None) -> str:
    """One pydantic error as one line: the variable (or the flag that set it), the problem, a working example.

    ``flags`` maps a field to the command-line flag that set it (``{"port": "--port"}``): the flag is what to fix.
    """
    loc = [str(part) for part in err["loc"]]
    if not loc:
        return _model_line(err)
    field, rest = loc[0], loc[1:]
    flag = (flags or {}).get(field)
    var = flag or variable_name(field)
    example = setting_example(field)
    shown = f"{flag} {example}" if flag and example else f"{var}={example}" if example else None
    if field == "upstreams" and rest:
        problem, spec_example = _spec_problem(err, rest)
        return f'invalid {var} (upstream "{rest[0]}"): {problem}; e.g. {spec_example}'
    where = f" ({json.dumps(rest[0])})" if rest else ""  # the key of an object-valued setting
    info = Settings.model_fields.get(field)
    metadata = info.metadata if info is not None and not rest else []
    expected = None if err["type"] == "value_error" else _expected(err, metadata, whole=_whole_number(field))
    if expected is None:
        problem = _message(err)
    else:
        problem = f"expected {expected}, got {_got(err['input'], echo=not _is_secret(field), as_json=bool(rest))}"
    return f"invalid {var}{where}: {problem}" + (f"; e.g. {shown}" if shown else "")


def format_errors(exc: ValidationError, flags: Mapping[str, str] | None = None) -> str:
    """One line per problem: the environment variable (or flag) to fix, what it expects, a value that works."""
    return "\n".join(describe_error(err, flags) for err in exc.errors())


def format_settings_error(exc: SettingsError) -> str:
    """pydantic-settings fails before validation when a JSON-valued variable is not JSON; name the variable."""
    m = re.search(r'field "(\w+)"', str(exc))
    field = m.group(1) if m else None
    var = variable_name(field) if field else "configuration"
    cause = exc.__cause__
    detail = f" ({cause.msg} at position {cause.pos})" if isinstance(cause, json.JSONDecodeError) else ""
    example = setting_example(field) if field else None
    return f"invalid {var}: must be valid JSON{detail}" + (f"; e.g. {var}={example}" if example else "")


def unknown_variables_line(unknown: Mapping[str, str | None]) -> str:
    """The one line that stops ``serve`` on names nothing reads, each with the setting it most likely meant."""
    names = ", ".join(f"{name} (did you mean {guess}?)" if guess else name for name, guess in sorted(unknown.items()))
    plural = len(unknown) > 1
    return (f"unknown variable{'s' if plural else ''} {names}: nothing reads {'them' if plural else 'it'}; "
            f"fix the name, or set {OPT_OUT}=true to start anyway")


class _OptOut(BaseSettings):
    """The opt-out alone, read the way ``Settings`` reads it, for when the other settings do not validate."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", env_file_encoding="utf-8",
                                      env_ignore_empty=True)

    allow_unknown_variables: bool = False


def unknown_names_allowed(config_file: Path | None) -> bool:
    try:
        opt_out = _OptOut(_env_file=config_file) if config_file is not None else _OptOut()  # type: ignore[call-arg]
    except ValidationError:
        return False  # its own bad value is already one of the problems listed
    return opt_out.allow_unknown_variables


def variable_names(environ: Mapping[str, str], config_file: Path | None) -> list[str]:
    """Every name ``serve`` may read settings from: the environment's and the config file's."""
    names = list(environ)
    if config_file is not None:
        names += [name for name in dotenv_values(config_file) if name]
    return names


def load_checked(config_file: Path | None, overrides: Mapping[str, Any],
                 flags: Mapping[str, str] | None = None) -> Settings | list[str]:
    """The settings to serve with, or every problem, one line each.

    Unknown names are checked even when a value is bad: ``SATGATE_ROOTKEY`` is why ``SATGATE_ROOT_KEY`` is
    missing, so the typo's line comes first and the validation lines follow.
    """
    unknown = unknown_variables(variable_names(os.environ, config_file))
    problems: list[str] = []
    settings: Settings | None = None
    try:
        settings = load_settings(config_file, **overrides)
    except ValidationError as exc:
        problems = format_errors(exc, flags).splitlines()
    except SettingsError as exc:
        problems = [format_settings_error(exc)]
    allowed = settings.allow_unknown_variables if settings is not None else unknown_names_allowed(config_file)
    if unknown and not allowed:
        problems.insert(0, unknown_variables_line(unknown))
    if problems or settings is None:
        return problems
    return settings

