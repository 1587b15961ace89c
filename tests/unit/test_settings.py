"""appliance/settings.py: every APPLIANCE_* variable is one field of Settings."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from appliance.settings import DEFAULT_TORCH_INDEX_URL, Settings, SettingsError, current

REPO = Path(__file__).resolve().parents[2]
CODE = ("appliance", "host_setup", "controller", "bench", "scripts")
NAME = re.compile(r"\bAPPLIANCE_[A-Z][A-Z0-9_]*\b")
READ = re.compile(r"(?:environ\.get|getenv|environ\[|environ\.setdefault|environ\.pop)\(?"
                  r"\s*([A-Za-z_\"'][^,)\]]*)")


def _sources() -> list[Path]:
    return [p for d in CODE for p in sorted((REPO / d).rglob("*.py"))]


def test_every_appliance_variable_named_in_the_code_is_a_settings_field() -> None:
    fields = set(Settings.variables())
    named = {(m, p.relative_to(REPO).as_posix()) for p in _sources() for m in NAME.findall(p.read_text())}
    assert {(m, where) for m, where in named if m not in fields} == set()
    assert len(fields) == 13


def test_only_appliance_settings_reads_appliance_variables_from_the_environment() -> None:
    offenders = []
    for path in _sources():
        if path == REPO / "appliance" / "settings.py":
            continue
        text = path.read_text()
        constants = {m.group(1) for m in re.finditer(r"^(\w+) *= *[\"']APPLIANCE_", text, re.M)}
        for arg in READ.findall(text):
            arg = arg.strip()
            if arg.strip("\"'").startswith("APPLIANCE_") or arg in constants:
                offenders.append(f"{path.relative_to(REPO)}: {arg}")
    assert offenders == []


def test_defaults() -> None:
    s = Settings.from_environ({})
    assert (s.home, s.recipes, s.admin_token_sha256, s.admin_token, s.admin_hosts, s.api) == (
        None, None, None, None, (), None)
    assert (s.check_grants, s.host_cgroup, s.k8s_namespace, s.k8s_unschedulable_grace_s) == (
        False, Path("/sys/fs/cgroup"), None, 300.0)
    assert s.torch_index_url == DEFAULT_TORCH_INDEX_URL


def test_values_are_parsed_and_empty_is_unset() -> None:
    s = Settings.from_environ({
        "APPLIANCE_HOME": "/srv/a", "APPLIANCE_RECIPES": "", "APPLIANCE_ADMIN_TOKEN_SHA256": " ABC ",
        "APPLIANCE_ADMIN_HOSTS": "a.lan, b.lan,,", "APPLIANCE_CHECK_GRANTS": "1",
        "APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S": "0", "APPLIANCE_TORCH_INDEX_URL": "", "OTHER": "x",
    })
    assert s.appliance_home() == Path("/srv/a") and s.recipes is None
    assert s.admin_token_sha256 == "abc" and s.admin_hosts == ("a.lan", "b.lan")
    assert s.check_grants and s.k8s_unschedulable_grace_s == 0.0
    assert s.torch_index_url == DEFAULT_TORCH_INDEX_URL
    assert not Settings.from_environ({"APPLIANCE_CHECK_GRANTS": "true"}).check_grants


def test_home_rule_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPLIANCE_HOME", raising=False)
    home = current().appliance_home()
    assert home == (Path("/var/lib/appliance") if os.geteuid() == 0
                    else Path.home() / ".local" / "share" / "appliance")


@pytest.mark.parametrize("bad", ["five minutes", "-1", "inf", "nan"])
def test_a_bad_value_names_its_variable(bad: str) -> None:
    with pytest.raises(SettingsError, match=rf"^APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S={bad!r} is not a number"):
        Settings.from_environ({"APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S": bad})
