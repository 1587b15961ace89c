"""The compile-key guard with the CPU engine's own vLLM: two launches of every shipped recipe, as the
runtimes start them, must give vLLM the same compile-key inputs — its own `compile_factors()` hash of
the environment and the EngineArgs its own parser makes of the argv (the config hash is built from
them) — and the key must still reach vLLM (through `--config`). The converse shows vLLM's own hash
moving for a compile-relevant variable and flag, and not for VLLM_API_KEY: this vLLM (0.32) ignores
it, which is why tests/unit/test_compile_key_guard.py also holds 0.26.0's and gfx906's rules.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.unit.engine_invocations import Invocation, invocation, specs

ENGINE_PYTHON = Path("/var/lib/appliance/engine/venv/bin/python")
PROBE = Path(__file__).with_name("vllm_compile_probe.py")

pytestmark = pytest.mark.skipif(
    not ENGINE_PYTHON.exists(), reason=f"no CPU engine ({ENGINE_PYTHON}): `appliance engine setup`")


def probe(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run([str(ENGINE_PYTHON), str(PROBE)], input=json.dumps(items), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: list[dict[str, Any]] = json.loads(done.stdout)
    return result


def item(inv: Invocation, **env: str) -> dict[str, Any]:
    return {"env": {**inv.env, **env}, "argv": list(inv.argv), "key": inv.key}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    runs = tmp_path_factory.mktemp("runs")
    invs = {name: (invocation(spec, "20261201T100000-a", runs), invocation(spec, "20261201T100500-b", runs))
            for name, spec in specs().items()}
    answers = probe([item(i) for pair in invs.values() for i in pair])
    return {name: (answers[2 * n], answers[2 * n + 1]) for n, name in enumerate(invs)}


def test_every_shipped_recipe_gives_this_vllm_the_same_compile_inputs_on_every_launch(
    pairs: dict[str, tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    parsed = 0
    for name, (a, b) in pairs.items():
        assert a["env_hash"] == b["env_hash"], f"{name}: vLLM's compile_factors() hash differs"
        if "parse_error" in a:  # a flag this vLLM does not know (a gfx906 build's): argv is compared
            continue             # word for word by the unit guard instead
        parsed += 1
        assert a["engine_args"] == b["engine_args"], f"{name}: the EngineArgs differ between launches"
    assert parsed >= 3  # at least the CPU recipes parse with the CPU engine's vLLM


def test_the_key_reaches_vllm_through_its_config_file(
    pairs: dict[str, tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    cpu = pairs["cpu-smollm2"][0]
    assert "parse_error" not in cpu and cpu["api_key_given"] is True


def test_vllms_own_hash_moves_for_a_compile_input_and_not_for_the_key(tmp_path: Path) -> None:
    spec = specs()["cpu-smollm2"]
    base = invocation(spec, "L1", tmp_path)
    flag = Invocation(base.recipe, base.kind, "L2", base.key, base.env,
                      tuple(a if a != str(spec.argv[spec.argv.index("--max-model-len") + 1]) else "1024"
                            for a in base.argv))
    aot = "0" if base.env.get("VLLM_USE_AOT_COMPILE") == "1" else "1"
    plain, compile_var, old_key_1, old_key_2, other_flag = probe([
        item(base), item(base, VLLM_USE_AOT_COMPILE=aot),
        item(base, VLLM_API_KEY="eng_one"), item(base, VLLM_API_KEY="eng_two"), item(flag),
    ])
    assert compile_var["env_hash"] != plain["env_hash"]
    assert other_flag["engine_args"] != plain["engine_args"]
    # vLLM 0.32 ignores VLLM_API_KEY (0.26.0 does not: the unit guard's data rule covers it).
    assert old_key_1["env_hash"] == old_key_2["env_hash"]
    assert "VLLM_API_KEY" not in plain["hashed"]
