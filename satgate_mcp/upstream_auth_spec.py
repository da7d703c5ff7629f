"""An HTTP upstream's ``"auth"``: how the gateway, as an OAuth client, gets the credential it sends upstream.

A union on ``"type"`` so each mode is its own model: ``token_exchange`` (RFC 8693: the caller's own access
token exchanged for one addressed to the upstream), ``client_credentials`` (RFC 6749 section 4.4: the
gateway's own token, the caller optionally named in a signed JWT beside it) and ``oauth_user`` (the end user's
own grant, asked for once through a URL-mode elicitation: authorization code with PKCE, kept as an encrypted
refresh token).

Secrets are never written in ``SATGATE_UPSTREAMS`` (it is logged, shown in ``ps`` and copied around): the spec
names the environment variable that holds them, and start-up refuses a spec whose variable is unset.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from satgate_mcp.addresses import secure_url_problem

ClientAuth = Literal["client_secret_basic", "private_key_jwt"]

#: Fields that would put a secret inline; each names where the secret goes instead.
INLINE_SECRETS = {
    "client_secret": "client_secret_env",
    "secret": "client_secret_env",
    "private_key": "private_key_env",
    "client_assertion": "private_key_env",
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: RFC 6749 scope: space separated scope tokens (printable ASCII except space, '"' and '\\').
_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+( [\x21\x23-\x5b\x5d-\x7e]+)*")


def inline_secret_problem(value: Any) -> str | None:
    """Why a spec may not be used as written: it holds a secret itself instead of naming its variable."""
    if not isinstance(value, Mapping):
        return None
    for field, instead in INLINE_SECRETS.items():
        if field in value:
            return (f'"{field}" may not be written in SATGATE_UPSTREAMS: put the secret in an environment variable '
                    f'and name that variable in "{instead}"')
    return None


def _checked_endpoint(value: str, why: str) -> str:
    """The URL as used, or ValueError: absolute http(s), and https unless on loopback (``why`` says what travels)."""
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s#]*)?", value.strip()):
        raise ValueError("must be an absolute http(s) URL")
    problem = secure_url_problem(value)
    if problem:
        raise ValueError(f"{problem}: {why}")
    return value.strip()


class _ClientSpec(BaseModel):
    """Who the gateway is at an authorization server: its client id and how it proves it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str = Field(min_length=1, max_length=512)
    #: How the gateway proves it is ``client_id``: a shared secret (HTTP Basic) or a JWT signed with its key.
    client_auth: ClientAuth = "client_secret_basic"
    #: The environment variable holding the client secret (``client_secret_basic``).
    client_secret_env: str | None = None
    #: The environment variable holding the PEM private key, inline or as a path (``private_key_jwt``).
    private_key_env: str | None = None
    #: The ``kid`` put on client assertions, when the authorization server wants one.
    key_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_inline_secret(cls, value: Any) -> Any:
        problem = inline_secret_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("client_secret_env", "private_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(f"must name an environment variable (letters, digits, '_'), got {value[:60]!r}")
        if value is not None and value.upper().startswith("SATGATE_"):
            raise ValueError(f"names {value}, but SATGATE_* names are the gateway's settings (an unknown one stops "
                             "serve): use another name, e.g. FILES_CLIENT_SECRET")
        return value

    @model_validator(mode="after")
    def _credential_variable(self) -> _ClientSpec:
        """The variable the chosen client authentication reads must be named and set now, not at the first call."""
        needed = "client_secret_env" if self.client_auth == "client_secret_basic" else "private_key_env"
        variable = getattr(self, needed)
        if variable is None:
            raise ValueError(f'"client_auth": "{self.client_auth}" needs "{needed}" (the environment variable '
                             "holding the secret)")
        if not os.environ.get(variable, "").strip():
            raise ValueError(f'"{needed}" names {variable}, which is not set in the environment')
        return self

    def secret_variable(self) -> str:
        """The environment variable holding this client's secret or private key."""
        found = self.client_secret_env if self.client_auth == "client_secret_basic" else self.private_key_env
        assert found is not None  # checked at validation
        return found


def _scope_problem(value: str | None) -> str | None:
    if value is not None and not _SCOPE.fullmatch(value):
        raise ValueError("must be RFC 6749 scope tokens separated by single spaces")
    return value


class _GrantSpec(_ClientSpec):
    """What every grant at a token endpoint needs: where, who the gateway is there, what the token is for."""

    token_endpoint: str
    #: RFC 8693 ``audience`` and RFC 8707 ``resource`` of the token asked for: the upstream.
    audience: str | None = None
    resource: str | None = None
    scope: str | None = None

    @field_validator("token_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return _checked_endpoint(value, "the client's secret travels to it")

    @field_validator("scope")
    @classmethod
    def _scope(cls, value: str | None) -> str | None:
        return _scope_problem(value)


class TokenExchangeSpec(_GrantSpec):
    """RFC 8693: the caller's verified access token becomes the ``subject_token`` (oauth mode only)."""

    type: Literal["token_exchange"]


class ClientCredentialsSpec(_GrantSpec):
    """RFC 6749 section 4.4: the gateway's own token; ``forward_identity`` adds a signed JWT naming the caller."""

    type: Literal["client_credentials"]
    forward_identity: bool = False


class OAuthUserSpec(_ClientSpec):
    """The end user's own grant (authorization code with PKCE and RFC 8707 ``resource``), asked for once per caller.

    The authorization server's endpoints are found from the upstream's RFC 9728 resource metadata when nothing
    is configured, from ``authorization_server``'s RFC 8414 metadata when only that is, or used as written. The
    gateway's own requests (tool listings) use the client credentials grant at the same token endpoint.
    """

    type: Literal["oauth_user"]
    #: The issuer whose metadata names the endpoints (instead of the upstream's resource metadata).
    authorization_server: str | None = None
    authorization_endpoint: str | None = None
    token_endpoint: str | None = None
    #: RFC 8707 resource indicator: default the resource metadata's ``resource``, else the upstream's URL.
    resource: str | None = None
    scope: str | None = None
    #: Whose grant the gateway's own requests (tool listings) use, for a server with no client credentials grant
    #: (a code host's has none): a token id (header mode) or OAuth subject, authorized once with
    #: ``satgate-mcp credentials authorize``. Unset: the client credentials grant at the same server.
    catalogue_subject: str | None = None

    @field_validator("catalogue_subject")
    @classmethod
    def _subject(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or len(value) > 256 or not value.isprintable()):
            raise ValueError('"catalogue_subject" is a token id or subject: 1 to 256 printable characters')
        return value

    @field_validator("authorization_server", "authorization_endpoint", "token_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return None if value is None else _checked_endpoint(value, "the user's grant travels through it")

    @field_validator("scope")
    @classmethod
    def _scope(cls, value: str | None) -> str | None:
        return _scope_problem(value)

    @model_validator(mode="after")
    def _endpoints_together(self) -> OAuthUserSpec:
        if (self.authorization_endpoint is None) != (self.token_endpoint is None):
            raise ValueError('"authorization_endpoint" and "token_endpoint" go together (or set neither, and they '
                             'are found from "authorization_server" or the upstream\'s resource metadata)')
        return self


AuthSpec = TokenExchangeSpec | ClientCredentialsSpec | OAuthUserSpec
UpstreamAuthSpec = Annotated[AuthSpec, Field(discriminator="type")]


def per_caller(auth: AuthSpec | None) -> bool:
    """Whether what goes upstream differs per caller: then no upstream session is shared between identities."""
    if isinstance(auth, TokenExchangeSpec | OAuthUserSpec):
        return True
    return isinstance(auth, ClientCredentialsSpec) and auth.forward_identity


def oauth_user_problem(name: str, auth_mode: str, credential_key_set: bool, public_url_known: bool) -> str | None:
    """Why an ``oauth_user`` upstream cannot be served: a caller must be known, grants kept encrypted, and the
    authorization server must be able to send the user's browser back to the gateway."""
    head = f'SATGATE_UPSTREAMS upstream "{name}": "auth": {{"type": "oauth_user"}} needs'
    if auth_mode not in ("header", "oauth"):
        return (f"{head} SATGATE_AUTH_MODE=header or oauth (each caller's grant is kept under its token id or "
                f"subject, and in {auth_mode} mode every caller is the same one)")
    if not credential_key_set:
        return (f"{head} SATGATE_CREDENTIAL_KEY (32 random bytes as 64 hex characters: the users' refresh tokens "
                "are stored encrypted with it)")
    if not public_url_known:
        return (f"{head} SATGATE_PUBLIC_URL (the address browsers reach this gateway at: the authorization server "
                "sends the user back to /oauth/callback/<upstream> under it)")
    return None


def upstream_auth_problem(auth_mode: str, identity_key_set: bool, auths: Mapping[str, AuthSpec | None], *,
                          credential_key_set: bool = False, public_url_known: bool = True) -> str | None:
    """The first upstream whose ``"auth"`` this configuration cannot serve, as one line starting with the variable."""
    for name, auth in auths.items():
        if isinstance(auth, OAuthUserSpec) and (
                problem := oauth_user_problem(name, auth_mode, credential_key_set, public_url_known)):
            return problem
        if isinstance(auth, TokenExchangeSpec) and auth_mode != "oauth":
            return (f'SATGATE_UPSTREAMS upstream "{name}": "auth": {{"type": "token_exchange"}} needs '
                    f"SATGATE_AUTH_MODE=oauth (it exchanges the caller's OAuth access token, and in "
                    f"{auth_mode} mode there is none); use \"client_credentials\" instead")
        if isinstance(auth, ClientCredentialsSpec) and auth.forward_identity and not identity_key_set:
            return (f'SATGATE_UPSTREAMS upstream "{name}": "forward_identity": true needs SATGATE_IDENTITY_KEY '
                    "(the PEM private key, Ed25519 or RSA, the caller's identity is signed with)")
    return None
