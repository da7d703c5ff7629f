"""What each setting means, for docs/configuration.md (scripts/config_docs.py renders the table from the settings
model: names and defaults from ``Settings``, meanings from here). Kept beside the model, not in it, so the model stays
readable; a test fails when a setting has no meaning here or a meaning names no setting."""

from __future__ import annotations

#: Setting (field name) -> what it does, in the operator's words (Markdown).
MEANINGS: dict[str, str] = {
    "host": (
        "Address to listen on (the Docker image sets `0.0.0.0`)."
    ),
    "port": (
        "Port to listen on."
    ),
    "auth_mode": (
        "`none` (no auth; keep it on loopback), `config` (one shared token), `header` (macaroon tokens, "
        "resumable sessions), `oauth` (JWT access tokens from your authorization server, resumable sessions)."
    ),
    "root_key": (
        "Header mode: the secret that signs tokens; at least 32 characters."
    ),
    "static_token": (
        "Config mode: the one bearer token clients must send."
    ),
    "upstreams": (
        "JSON object, upstream name → spec (below)."
    ),
    "session_cap": (
        "Most sessions held by one process (and most tombstones)."
    ),
    "session_idle_ttl": (
        "Seconds a session may stay idle before it is swept; also how long a DELETE's tombstone lasts."
    ),
    "sweep_interval": (
        "Seconds between sweeps of idle sessions."
    ),
    "sessions_per_token": (
        "Live sessions, and DELETE tombstones, one token (with its delegated children) may hold; past it its "
        "least recently used idle session is evicted, with one `session_quota_evicting` warning per token id (see "
        "[security.md](security.md#per-token-and-per-process-quotas)). `header` and `oauth` modes only: in `none` "
        "and `config` every client is one identity, so only `SATGATE_SESSION_CAP` applies."
    ),
    "max_inflight_per_token": (
        "Requests in flight at once per token; past it JSON-RPC -32004, never a queue. `header` and `oauth` "
        "modes only (in `none` and `config`, `SATGATE_MAX_INFLIGHT` alone bounds them)."
    ),
    "max_inflight": (
        "Requests in flight at once in one process."
    ),
    "max_body_bytes": (
        "Largest request body; larger ones get 413."
    ),
    "allowed_origins": (
        "Comma list of browser origins allowed besides loopback ones (others get 403)."
    ),
    "allowed_hosts": (
        "Comma list of `Host` values allowed besides loopback ones (DNS-rebinding guard; others get 421). "
        "When unset and the daemon listens on a non-loopback address, any Host is accepted."
    ),
    "revocation_file": (
        "File of revoked token ids, one per line (`#` comments). Re-read within a second of a change; an id "
        "once read stays revoked until restart, even if the file is deleted, renamed, unreadable or rewritten "
        "without it."
    ),
    "metrics_token": (
        "When set, `/metrics` requires `Authorization: Bearer <it>`."
    ),
    "allow_unauthenticated": (
        "Needed for `none` on a non-loopback address; without it `serve` refuses to start with one line "
        "saying how to set up header mode."
    ),
    "oauth_resource_metadata_url": (
        "Absolute `https://` URL (`http://` on loopback) of the RFC 9728 metadata document; 401s then carry "
        "`WWW-Authenticate: Bearer resource_metadata=\"...\"` and the gateway serves the document."
    ),
    "oauth_authorization_servers": (
        "Comma list of authorization server issuer URLs for that document."
    ),
    "oauth_issuer": (
        "`oauth` mode, required: the issuer whose tokens are accepted (`iss`, compared exactly); `https://`, "
        "or `http://` on a loopback address."
    ),
    "oauth_jwks_url": (
        "`oauth` mode: the issuer's key set; unset, it is found in the issuer's RFC 8414 metadata, else its "
        "OpenID configuration."
    ),
    "oauth_audience": (
        "`oauth` mode, required: this resource, the public URL of `/mcp` (RFC 8707), or a comma list; a token "
        "must name one in `aud`."
    ),
    "oauth_tool_scopes": (
        "`oauth` mode: JSON, tool name or `prefix*` or `*` → the scope it requires (most specific pattern "
        "wins); a tool no pattern matches needs no scope."
    ),
    "oauth_id_claim": (
        "`oauth` mode: the claim that is the token id for limits, budgets, quotas and revocation."
    ),
    "oauth_budget_claim": (
        "`oauth` mode: a claim naming the budget id (for `SATGATE_BUDGETS`); without it each token id spends "
        "from its own."
    ),
    "rate_limit": (
        "Per-token rate (a token and its delegated children share it) for every request forwarded upstream "
        "and `satgate/*`, e.g. `10/s`, `600/m`, `5000/h`."
    ),
    "rate_burst": (
        "Bucket size."
    ),
    "enforcement": (
        "`observe` (charge and log, never refuse) or `control` (refuse when a budget is exhausted). `shadow`, "
        "`hard`, `soft` are accepted as older names. Set to `observe` explicitly, it also makes a token's tool "
        "controls log and count instead of refusing; left unset, tool controls are enforced."
    ),
    "tool_rate_limits": (
        "JSON, tool pattern (name, `prefix*` or `*`) → rate, applied per token on top of the overall rate; a "
        "key outside the tool pattern grammar stops start-up."
    ),
    "tool_costs": (
        "JSON, tool name / `prefix*` / `*` → cost in credits."
    ),
    "default_cost": (
        "Cost of a tool that no entry matches."
    ),
    "budgets": (
        "JSON, budget id (or token id) → credits; takes precedence over a token's `budget_limit`."
    ),
    "events_file": (
        "Also append every event as a JSON line to this file."
    ),
    "reuse_port": (
        "Bind with `SO_REUSEPORT` so a new process can take over the port before the old one leaves."
    ),
    "handover": (
        "This start may take over a port another process already listens on (also `serve --handover`); "
        "without it such a start is refused rather than sharing the port."
    ),
    "drain_seconds": (
        "On SIGTERM, how long requests in flight may take to finish."
    ),
    "sse_poll_seconds": (
        "A 2025-11-25 answer stream quiet this long is closed mid-call (SEP-1699 polling); the client resumes "
        "it with `Last-Event-ID`, so a long call holds no connection. Off: long calls get keep-alive "
        "comments."
    ),
    "redis_url": (
        "Shared store for rate limits, budgets, duplicate records, revocations and DELETE tombstones across "
        "machines. Two deployments may share one Redis server on two databases (`redis://host:6379/3`): keys "
        "live in the URL's database and the pub/sub channels are named for it (`satgate:revoked:events@db3`; "
        "database 0 keeps the plain names), so neither hears the other's revocations or DELETEs."
    ),
    "max_connections": (
        "Client connections one process keeps open at most. The first request on a connection past it is "
        "answered 503 `too_many_connections` with `Retry-After: 1` and the connection is closed; connections "
        "already open are not disturbed. A connection that never sends a request is closed after "
        "`SATGATE_READ_TIMEOUT`."
    ),
    "read_timeout": (
        "Seconds a client may take to send a request's body (a body trickled slower is answered 408 "
        "`read_timeout` and the connection closed), and how long a connection may stay open without sending a "
        "request, its first included (headers never finished are cut after this long). Idle keep-alive "
        "connections close after it too; clients reconnect."
    ),
    "redis_max_connections": (
        "Connections each Redis client of a process keeps open at most (the stores' and the DELETE "
        "tombstones'; the revocation mirror, which asks Redis only until it has synced, keeps the default). "
        "Under load a slow Redis no longer makes the gateway open connections without bound: a command waits "
        "for a free connection instead, and that wait counts against `SATGATE_REDIS_TIMEOUT` like the command "
        "itself."
    ),
    "redis_timeout": (
        "Seconds one Redis command (or connect) may take, and the store time of a whole call: its rate "
        "bucket, duplicate record, charge and settlement share this one allowance, so a slow or paused store "
        "costs a call at most this long (then the store counts as down instead of hanging the request). It "
        "bounds a call's wait on the state database (`SATGATE_STATE_DIR`) the same way. While the store is "
        "down every metered call tries it again, so it is back in use with the first call after it returns."
    ),
    "store_fail_mode": (
        "When a store cannot answer (Redis down, or paused past `SATGATE_REDIS_TIMEOUT`; the state database "
        "unusable). `closed`: a verified token whose revocation check fails, and every metered call (rate "
        "limit, budget, duplicate record), get 503 with `Retry-After: 1` and a JSON-RPC body with "
        "`data.error: \"store_unavailable\"` (never a 401/403, which would make OAuth clients drop a good "
        "token, never -32603); what needs no store (`tools/list`, `ping`, unmetered methods) keeps working, "
        "and `/readyz` answers 503 so a balancer drains the machine. `open`: tokens pass the revocation check "
        "and calls are admitted unmetered, each counted in `satgate_fail_open_admissions_total` and published "
        "as a `fail_open_admission` event. A forged token is refused either way; store failures are counted "
        "in `satgate_store_errors_total{op}`. Recovery needs no restart: the next call uses the store again. "
        "A refund or record that cannot be written after a call ran is logged as `settlement_not_recorded` "
        "(for reconciliation) and the client still gets its answer."
    ),
    "state_key": (
        "Seals 2026-07-28 multi round-trip state when there is no root key (header mode uses "
        "`SATGATE_ROOT_KEY`); comma separated, the first seals and every one opens, so keys rotate without "
        "breaking flows."
    ),
    "state_dir": (
        "Without `SATGATE_REDIS_URL`: folder of the SQLite (WAL) database holding limited budgets, duplicate "
        "records of metered calls, DELETE tombstones and revocations, so a restart, a deploy or a SIGKILL "
        "hands no token a fresh budget. Several processes may share one folder. A database that cannot answer "
        "within `SATGATE_REDIS_TIMEOUT` (its write lock held elsewhere, unwritable, damaged) is a store fault "
        "like Redis down (`SATGATE_STORE_FAIL_MODE`; `/readyz` reports it as `store`), and a charge whose "
        "call was refused is never made later. `memory` keeps everything in the process. Ignored when Redis "
        "is set."
    ),
    "log_format": (
        "`json` or `console`."
    ),
    "log_level": (
        "`DEBUG`, `INFO`, `WARNING`, `ERROR`."
    ),
    "access_log_health": (
        "`false` leaves `/healthz` and `/readyz` out of the `http_request` access log (their metric still "
        "counts)."
    ),
    "tracing": (
        "OpenTelemetry traces: `off`, `otlp` (to the collector the standard `OTEL_EXPORTER_OTLP_*` variables name; "
        "`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER` and `OTEL_RESOURCE_ATTRIBUTES` apply too) or `console` (spans "
        "as JSON on stderr). See [operations.md](operations.md#tracing)."
    ),
    "policy_file": (
        "Policy rules: a YAML or JSON file `{\"rules\": [...]}` of ordered rules with CEL conditions over the token, "
        "the tool, its arguments, the session and the request; first match wins. Re-read within 1 s of a change "
        "(a bad file is refused and the last good policy kept); a bad file at start stops `serve`. Check one with "
        "`satgate-mcp policy check FILE`. See [governance.md](governance.md#policy-rules)."
    ),
    "policy_default": (
        "`allow` or `deny`: what a call that no policy rule matches gets (only with `SATGATE_POLICY_FILE`)."
    ),
    "tool_pinning": (
        "Pinned tool definitions (rug-pull protection): each upstream tool's definition is fingerprinted (SHA-256 "
        "of its RFC 8785 canonical JSON) and pinned in the state store on first sight. `warn` serves a changed "
        "definition and reports it once (event `tool_definition_changed`, "
        "`satgate_tool_definition_changes_total`); `enforce` also hides it from `tools/list` and refuses its "
        "calls (-32001, `data.error: \"tool_definition_changed\"`), and holds tools that appear after their "
        "upstream was first pinned, until `satgate-mcp tools approve`; `off` pins nothing. See "
        "[governance.md](governance.md#pinned-tool-definitions)."
    ),
    "console": (
        "`on` or `off`: the operator console at `/console` (and its JSON API under `/console/api/`) on the daemon's "
        "own port. Only an admin credential opens it (`SATGATE_CONSOLE_SCOPE`, `SATGATE_CONSOLE_TOKEN`, `token mint "
        "--admin`). See [console.md](console.md)."
    ),
    "console_scope": (
        "`oauth` mode: the scope an access token needs to open the operator console."
    ),
    "console_token": (
        "`none` and `config` modes: the secret an operator pastes to log in to the console (at least 32 "
        "characters). Unset: no login in `config` mode; in `none` mode on loopback the console opens without one "
        "(the same trust as `/mcp` there) and says so on every page."
    ),
    "audit_file": (
        "The audit trail: one JSON line per call (`tools/call`, `resources/read`, `prompts/get`), relayed request "
        "and refusal, each chained to the one before by SHA-256 (`satgate-mcp audit verify FILE...`); `-` writes "
        "them to stdout marked `\"log\": \"audit\"`. The chain continues across restarts and rotation. See "
        "[governance.md](governance.md#audit-trail)."
    ),
    "audit_args": (
        "What an audit line keeps of a call's arguments: `digest` (their SHA-256, `args_sha256`), `full`, or `none`."
    ),
    "approval_ttl": (
        "Seconds a call held for an operator's approval (tool controls' `approvals`, a policy rule's `hold`) waits "
        "for a decision; after it the identical call gets `approval_expired`. See "
        "[README](../README.md#tool-controls)."
    ),
    "approvals_per_token": (
        "Pending approvals one token, with the tokens delegated from it, may have at once; one more call to hold "
        "gets `approval_queue_full`."
    ),
    "approval_webhook": (
        "An `http(s)` URL that receives each approval request (and decision) as JSON, signed under "
        "`SATGATE_APPROVAL_WEBHOOK_SECRET`; retried with backoff, never blocking the call."
    ),
    "approval_webhook_secret": (
        "The key of the webhook's `X-Satgate-Signature: sha256=HMAC-SHA256(key, timestamp + \".\" + body)`."
    ),
    "audit_fail_mode": (
        "A call the audit trail cannot record (its queue is full, its disk fails): `closed` refuses it with 503 + "
        "`Retry-After`; `open` serves it and counts the line in `satgate_audit_dropped_total`."
    ),
}

#: Where "unset" means more than nothing: the default column says what happens instead.
DEFAULTS_SHOWN: dict[str, str] = {
    "oauth_resource_metadata_url": "— (`oauth` mode: derived from the audience)",
    "oauth_authorization_servers": "— (`oauth` mode: the issuer)",
    "oauth_jwks_url": "discovered",
    "rate_limit": "off",
    "rate_burst": "one second's worth (at least 1)",
    "sse_poll_seconds": "`0` (off)",
    "state_key": "— (per process)",
    "state_dir": "`$STATE_DIRECTORY` under systemd, else `./satgate-state`",
    "log_format": "console on a TTY, else `json`",

}
