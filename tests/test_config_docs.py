"""docs/configuration.md's table is the settings model's: a new setting, a changed default or meaning shows here."""

from __future__ import annotations

from satgate_mcp.settings import ENV_PREFIX, Settings
from scripts import config_docs


def test_every_setting_has_a_meaning_and_every_meaning_a_setting() -> None:
    assert config_docs.problems() == []


def test_the_documented_table_is_the_one_the_model_makes() -> None:
    document = config_docs.DOC.read_text()
    assert config_docs.with_table(document) == document, "run: python scripts/config_docs.py"


def test_the_table_has_one_row_per_setting_in_the_models_order() -> None:
    rows = config_docs.table().splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == [ENV_PREFIX + name.upper() for name in Settings.model_fields]


def test_defaults_read_as_an_operator_writes_them() -> None:
    fields = Settings.model_fields
    assert config_docs.default_text("port", fields["port"]) == "`9100`"
    assert config_docs.default_text("reuse_port", fields["reuse_port"]) == "`true`"
    assert config_docs.default_text("session_idle_ttl", fields["session_idle_ttl"]) == "`1800`"
    assert config_docs.default_text("root_key", fields["root_key"]) == "—"
    assert config_docs.default_text("allowed_hosts", fields["allowed_hosts"]) == "—"
    assert config_docs.default_text("upstreams", fields["upstreams"]) == "`{}`"
    assert config_docs.default_text("log_format", fields["log_format"]) == "console on a TTY, else `json`"
