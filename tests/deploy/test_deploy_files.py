"""The deploy files keep their promises: every variable documented, stop timeouts longer than the drain,
no secret in fly.toml, the hardening the issue lists. hadolint and systemd-analyze run in
scripts/check-deploy.sh; these checks are what those linters cannot know."""

from __future__ import annotations

import configparser
import re
import tomllib
from pathlib import Path, PurePosixPath

import pytest

from satgate_mcp.daemon.sockets import unauthenticated_exposure
from satgate_mcp.settings import ENV_PREFIX, Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = REPO / "config" / "satgate-mcp.env.example"
DEFAULT_DRAIN = Settings.model_fields["drain_seconds"].default
SECRETS = ("SATGATE_ROOT_KEY", "SATGATE_STATIC_TOKEN", "SATGATE_REDIS_URL")


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(REPO / "config" / name)
    return parser


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec)?", value.strip())
    assert match, f"not a plain number of seconds: {value!r}"
    return float(match.group(1))


def example_lines() -> list[str]:
    return ENV_EXAMPLE.read_text().splitlines()


@pytest.mark.parametrize("var", [ENV_PREFIX + name.upper() for name in Settings.model_fields])
def test_env_example_documents_every_variable_with_a_comment(var: str) -> None:
    lines = example_lines()
    at = [i for i, line in enumerate(lines) if re.match(rf"#?\s*{var}=", line)]
    assert at, f"{var} missing from {ENV_EXAMPLE.name}"
    assert lines[at[0] - 1].startswith("# "), f"{var} needs a one-line comment above it"


def test_env_example_loads_as_it_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(ENV_PREFIX + name.upper(), raising=False)
    assert load_settings(ENV_EXAMPLE) == Settings()


def test_env_example_sets_no_secret() -> None:
    assert not [line for line in example_lines() if line.startswith(SECRETS) and line.split("=", 1)[1].strip()]


def test_fly_config_drains_before_the_kill_and_keeps_secrets_out() -> None:
    fly = tomllib.loads((REPO / "fly.toml").read_text())
    drain = float(fly["env"].get("SATGATE_DRAIN_SECONDS", DEFAULT_DRAIN))
    assert fly["kill_signal"] == "SIGTERM"
    assert seconds(str(fly["kill_timeout"])) > drain
    assert fly["deploy"]["strategy"] == "rolling"
    service = fly["http_service"]
    assert (service["internal_port"], service["min_machines_running"]) == (9100, 2)
    assert [check["path"] for check in service["checks"]] == ["/readyz"]
    assert not set(fly["env"]) & set(SECRETS)
    assert "fly secrets set SATGATE_ROOT_KEY" in (REPO / "fly.toml").read_text()
    # Fly's proxy reaches the machine on 0.0.0.0: the config must not rely on unauthenticated mode.
    assert unauthenticated_exposure(fly["env"].get("SATGATE_AUTH_MODE", "none"),
                                    fly["env"].get("SATGATE_ALLOW_UNAUTHENTICATED", "false") == "true",
                                    [fly["env"]["SATGATE_HOST"]]) is None


def test_systemd_service_drains_before_the_kill_and_is_hardened() -> None:
    service = unit("satgate-mcp.service")["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "process", "children must not get SIGTERM while calls drain, nor die in a crash"
    assert int(service["FileDescriptorStoreMax"]) >= 5, "the children's pipes and state are kept in the fd store"
    assert seconds(service["TimeoutStopSec"]) > DEFAULT_DRAIN
    assert service["EnvironmentFile"] == "/etc/satgate-mcp/satgate-mcp.env"
    assert service["Restart"] == "on-failure"
    for key, value in {"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                       "ProtectHome": "yes", "PrivateTmp": "yes", "ProtectKernelTunables": "yes",
                       "ProtectControlGroups": "yes", "LockPersonality": "yes", "SystemCallArchitectures": "native",
                       "CapabilityBoundingSet": "", "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6"}.items():
        assert service[key] == value, key
    assert service["StateDirectory"]


DOCUMENTED_REVOCATION_FILE = "/var/lib/satgate-mcp/revoked.txt"


@pytest.mark.parametrize("doc", [pytest.param("README.md", id="readme"), pytest.param("docs/tokens.md", id="tokens"),
                                 pytest.param("docs/operations.md", id="operations")])
def test_the_revocation_file_path_is_the_same_in_the_example_the_docs_and_the_unit(doc: str) -> None:
    """Issue 23: the example said .../revoked and the docs .../revoked.txt, so the daemon and ``token revoke``
    copied from different places watched different files."""
    [line] = [line for line in example_lines() if re.match(r"#?\s*SATGATE_REVOCATION_FILE=", line)]
    example = line.split("=", 1)[1].strip()
    assert example == DOCUMENTED_REVOCATION_FILE
    paths = set(re.findall(r"SATGATE_REVOCATION_FILE=(\S+?)[`\s]", (REPO / doc).read_text()))
    assert paths == {example}, paths
    # The unit's StateDirectory= is the folder that path needs: systemd makes it, writable by the DynamicUser.
    service = unit("satgate-mcp.service")["Service"]
    assert PurePosixPath(example).parent == PurePosixPath("/var/lib") / service["StateDirectory"]
    assert service["WorkingDirectory"] == str(PurePosixPath(example).parent)


def test_systemd_socket_listens_on_loopback_and_hands_one_listening_socket() -> None:
    sock = unit("satgate-mcp.socket")["Socket"]
    assert (sock["ListenStream"], sock["Accept"]) == ("127.0.0.1:9100", "no")
    assert unit("satgate-mcp.service")["Unit"]["Requires"] == "satgate-mcp.socket"


def test_dockerfile_runs_unprivileged_and_stops_with_sigterm() -> None:
    text = (REPO / "Dockerfile").read_text()
    final = text.split("\nFROM ")[-1]
    assert len(re.findall(r"^FROM ", text, re.M)) == 2, "multi-stage"
    assert re.search(r"^USER (?!root|0\b)\S+", final, re.M)
    for line in ("STOPSIGNAL SIGTERM", "EXPOSE 9100", 'CMD ["satgate-mcp", "serve"]', "SATGATE_HOST=0.0.0.0"):
        assert line in final, line
    assert re.search(r"HEALTHCHECK .*CMD \[\"python\".*/healthz", final, re.S)
    assert not re.search(r"apt-get|gcc|build-essential", final), "no build tools in the final stage"


def docker_env_file(lines: list[str]) -> dict[str, str]:
    """What `docker run --env-file` passes: the text after the first '=', literally (quotes kept)."""
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_env_example_means_the_same_to_docker_systemd_and_dotenv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker keeps quotes and backslashes that systemd and dotenv strip: bare values read alike in all three."""
    lines = example_lines()
    assignments = [line.removeprefix("# ") for line in lines if re.match(r"#? ?SATGATE_[A-Z_]+=", line)]
    for line in assignments:
        value = line.split("=", 1)[1]
        assert not value.startswith(("'", '"')), line
        assert "\\" not in value, line
    for name in Settings.model_fields:
        monkeypatch.delenv(ENV_PREFIX + name.upper(), raising=False)
    for name, value in docker_env_file(lines).items():
        monkeypatch.setenv(name, value)
    assert Settings() == load_settings(ENV_EXAMPLE)
    examples = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in assignments if "={" in line}
    for name, value in examples.items():
        monkeypatch.setenv(name, value)
    assert Settings().upstreams, "the commented upstream example loads as Docker would pass it"


def test_dockerfile_builds_from_a_digest_and_the_lock() -> None:
    """Two builds of the image get the same base and the same Python packages: a digest, and only locked pips."""
    text = (REPO / "Dockerfile").read_text()
    image = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert image is not None
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", image.group(1))
    assert set(re.findall(r"^FROM (\S+)", text, re.M)) == {"${PYTHON_IMAGE}"}
    installs = re.findall(r"pip install ([^\n&]+)", text)
    assert installs == ["--no-cache-dir --require-hashes -r requirements/runtime.txt",
                        "--no-cache-dir --no-deps --no-build-isolation ."]
    assert "!requirements/runtime.txt" in (REPO / ".dockerignore").read_text().splitlines()


def test_locks_pin_every_package_with_hashes() -> None:
    """pip's hash-checking mode refuses a lock with any unpinned or unhashed line, so check both here too."""
    for name in ("runtime.txt", "test.txt"):
        text = (REPO / "requirements" / name).read_text()
        entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2].strip())
        assert len(entries) > 10, name
        for entry in entries:
            assert re.match(r"[A-Za-z0-9._-]+==\S+", entry), entry[:80]
            assert "--hash=sha256:" in entry, entry[:80]
    runtime = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", (REPO / "requirements/runtime.txt").read_text(), re.M))
    test = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", (REPO / "requirements/test.txt").read_text(), re.M))
    assert {k: test.get(k) for k in runtime} == runtime, "the tests run the versions users install"
