"""Issue 23 item 6: a recipe's own secrets (env `*_KEY`/`*_TOKEN`/…, `--api-key` in extra_args) never
appear where a recipe is shown: `GET /recipes/{name}` (unauthenticated), the console's recipe pages
and diff, `appliance recipes show` and `diff`. One redaction: appliance/engine_secret.py."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from appliance.engine_secret import REDACTED, redact_recipe_data
from controller import admin_token
from controller.cli import recipes_cmd
from tests.unit.test_api import REPO, TOKEN, Rig
from tests.unit.test_console import login

KEY = "sk-recipe-own-key-0123456789"
TOKEN_VALUE = "hf_token_value_abcdefghij"
PASSWORD = "pw-hunter2-hunter2"
SECRET_RECIPE = f"""
name: cpu-smollm2-keyed
extends: cpu-smollm2
description: the CPU recipe with its own engine key
engine:
  extra_args: ["--api-key", "{KEY}", "--uvicorn-log-level=warning", "--x-secret={PASSWORD}"]
env:
  vars:
    VLLM_API_KEY: "{KEY}"
    HF_TOKEN: "{TOKEN_VALUE}"
"""
SECRETS = (KEY, TOKEN_VALUE, PASSWORD)


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    d = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", d)
    (d / "cpu-smollm2-keyed.yaml").write_text(SECRET_RECIPE)
    return d


@pytest.fixture
async def client(tmp_path: Path, recipes: Path,
                 monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    monkeypatch.setenv("APPLIANCE_HOME", str(home))
    admin_token.write_hash(home, TOKEN)
    rig = Rig(home, recipes_dir=recipes)
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c


def test_redact_recipe_data_hides_secret_vars_and_flags_only() -> None:
    variables = {"VLLM_API_KEY": {"value": KEY, "why": "w"}, "TOKENIZERS_PARALLELISM": {"value": "false"}}
    data: dict[str, Any] = {
        "env": {"vars": variables},
        "engine": {"extra_args": ["--api-key", KEY, "--x-token=abc", "--max-num-seqs", "4"]}}
    shown = redact_recipe_data(data)
    assert shown["env"]["vars"] == {"VLLM_API_KEY": {"value": REDACTED, "why": "w"},
                                    "TOKENIZERS_PARALLELISM": {"value": "false"}}
    assert shown["engine"]["extra_args"] == ["--api-key", REDACTED, f"--x-token={REDACTED}",
                                             "--max-num-seqs", "4"]
    assert variables["VLLM_API_KEY"]["value"] == KEY  # the input is not changed


async def test_unauthenticated_recipe_endpoint_shows_no_secret(client: httpx.AsyncClient) -> None:
    r = await client.get("/recipes/cpu-smollm2-keyed")
    assert r.status_code == 200
    assert not any(s in r.text for s in SECRETS), r.text
    body = r.json()
    assert body["recipe"]["env"]["vars"]["VLLM_API_KEY"]["value"] == REDACTED
    assert body["recipe"]["engine"]["extra_args"][:2] == ["--api-key", REDACTED]
    assert body["recipe"]["engine"]["extra_args"][2] == "--uvicorn-log-level=warning"


async def test_console_recipe_pages_and_diff_show_no_secret(client: httpx.AsyncClient) -> None:
    await login(client)
    for path, params in (("/console/recipes", {"a": "cpu-smollm2", "b": "cpu-smollm2-keyed"}),
                         ("/console/recipes/cpu-smollm2-keyed", {}),
                         ("/console/recipes/cpu-smollm2-keyed/apply", {})):
        r = await client.get(path, params=params)
        assert r.status_code == 200, path
        assert not any(s in r.text for s in SECRETS), path
    diff = await client.get("/console/recipes", params={"a": "cpu-smollm2", "b": "cpu-smollm2-keyed"})
    assert "env.vars.VLLM_API_KEY.value" in diff.text and "&lt;redacted&gt;" in diff.text
    assert "(cache keys  / )" not in diff.text  # `diff.keys` was the dict method in Jinja: keys were blank


@pytest.mark.parametrize("args", [["show", "cpu-smollm2-keyed"], ["show", "cpu-smollm2-keyed", "--json"],
                                  ["diff", "cpu-smollm2", "cpu-smollm2-keyed"],
                                  ["diff", "cpu-smollm2", "cpu-smollm2-keyed", "--json"]])
def test_cli_show_and_diff_show_no_secret(recipes: Path, monkeypatch: pytest.MonkeyPatch,
                                          args: list[str]) -> None:
    monkeypatch.setenv("APPLIANCE_RECIPES", str(recipes))
    monkeypatch.setenv("APPLIANCE_HOME", "/var/lib/appliance")
    app = typer.Typer()
    recipes_cmd.register(app)
    result = CliRunner().invoke(app, ["recipes", *args])
    assert result.exit_code == 0, result.output
    assert not any(s in result.stdout for s in SECRETS), result.stdout
    assert REDACTED in result.stdout
