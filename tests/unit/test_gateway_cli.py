"""`appliance keys` and `appliance gateway` argument handling (the CLI works on the key file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from controller.cli import gateway_cmd, keys_cmd
from controller.gateway.keystore import KeyStore, hash_key


def app() -> typer.Typer:
    a = typer.Typer()
    keys_cmd.register(a)
    gateway_cmd.register(a)
    return a


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    db = tmp_path / "keys.db"
    runner = CliRunner()
    r = runner.invoke(app(), ["keys", "create", "--name", "svc", "--rpm", "30", "--keys", str(db)])
    assert r.exit_code == 0, r.output
    key = r.stdout.strip().splitlines()[0]
    assert key.startswith("sk-app-")
    _, stored = KeyStore(db).snapshot()
    (entry,) = stored.values()
    assert entry.digest.hex() == hash_key(key) and entry.record.rpm_limit == 30
    listed = runner.invoke(app(), ["keys", "list", "--keys", str(db), "--json"])
    rows = json.loads(listed.stdout)
    assert [row["name"] for row in rows] == ["svc"]
    assert key not in listed.stdout  # printed once, at creation, never again
    r = runner.invoke(app(), ["keys", "revoke", rows[0]["id"], "--keys", str(db)])
    assert r.exit_code == 0
    assert json.loads(runner.invoke(app(), ["keys", "list", "--keys", str(db), "--json"]).stdout) == []
    assert (
        len(json.loads(runner.invoke(app(), ["keys", "list", "--all", "--keys", str(db), "--json"]).stdout))
        == 1
    )
    r = runner.invoke(app(), ["keys", "revoke", "0123456789ab", "--keys", str(db)])
    assert r.exit_code == 2  # an unknown id, as everywhere (issue 36 item 8)


def test_keys_api_mode_needs_the_admin_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    r = CliRunner().invoke(app(), ["keys", "list", "--api", "http://127.0.0.1:9"])
    assert r.exit_code != 0 and "APPLIANCE_ADMIN_TOKEN" in r.output


def test_keys_list_escapes_a_stored_name_with_control_characters(tmp_path: Path) -> None:
    # The store refuses such names now; one written before that rule must still not reach the terminal raw.
    import sqlite3

    db = tmp_path / "keys.db"
    KeyStore(db).create("svc")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE keys SET name = ?", ("evil\x1b[2J\x07",))
    listed = CliRunner().invoke(app(), ["keys", "list", "--keys", str(db)])
    assert listed.exit_code == 0, listed.output
    assert "\x1b" not in listed.stdout and "\x07" not in listed.stdout
    assert "evil\\x1b[2J\\x07" in listed.stdout
    # --json keeps the data exact (JSON escapes it itself).
    rows = json.loads(CliRunner().invoke(app(), ["keys", "list", "--keys", str(db), "--json"]).stdout)
    assert rows[0]["name"] == "evil\x1b[2J\x07"


@pytest.mark.parametrize(
    ("listen", "expected"),
    [("127.0.0.1:8080", ("127.0.0.1", 8080)), (":9000", ("0.0.0.0", 9000)), ("[::1]:81", ("::1", 81))],
)
def test_listen_parsing(listen: str, expected: tuple[str, int]) -> None:
    assert gateway_cmd._split_listen(listen) == expected


def test_listen_rejects_garbage() -> None:
    with pytest.raises(typer.BadParameter):
        gateway_cmd._split_listen("localhost")


@pytest.mark.parametrize(
    ("given", "client_port", "expected"),
    [
        (None, 8080, ("127.0.0.1", 8081)),  # default: loopback, the client port + 1
        (None, 0, ("127.0.0.1", 0)),  # a free client port: a free control port too
        ("127.0.0.1:9001", 8080, ("127.0.0.1", 9001)),
        ("[::1]:9001", 8080, ("::1", 9001)),
        ("off", 8080, None),
        ("OFF", 8080, None),
    ],
)
def test_control_listen_parsing(
    given: str | None, client_port: int, expected: tuple[str, int] | None
) -> None:
    assert gateway_cmd.control_address(given, client_port) == expected


def test_control_listen_rejects_garbage() -> None:
    with pytest.raises(typer.BadParameter):
        gateway_cmd.control_address("localhost", 8080)
