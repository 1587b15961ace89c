"""Supervision and the engine's own door, in pure pieces: the per-launch engine key (made,
passed by environment only, redacted, never shown), the port proven free before a launch, and the
`Address already in use` diagnosis."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from appliance.diagnosis.diagnose import FailureFacts, diagnose
from appliance.diagnosis.signatures import DiagnosisCode
from appliance.engine_secret import CONTAINER_KEY_PATH
from appliance.recipe.engine_key import ENGINE_KEY_ENV, recipe_key
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.docker import container_create_kwargs
from controller.runtime.ports import PortInUse, ensure_port_free, port_is_free
from controller.store import REDACTED, redact_spec
from controller.supervisor.engine_key import launch_key, new_engine_key
from controller.supervisor.machine import State
from controller.supervisor.signals import Apply
from tests.unit.spec_helpers import with_runtime
from tests.unit.supervisor_helpers import FakeEngine, make_spec
from tests.unit.test_supervisor_driver import make_rig


def _spec(**extra: object) -> LaunchSpec:
    return make_spec().model_copy(update=extra)


def test_each_launch_key_is_new_and_long() -> None:
    keys = {new_engine_key() for _ in range(50)}
    assert len(keys) == 50 and all(k.startswith("eng_") and len(k) >= 40 for k in keys)


def test_a_fresh_launch_key_is_for_the_runtime_to_deliver_and_not_in_the_spec() -> None:
    spec = _spec(argv=("/usr/bin/python3", "-m", "engine"), env={"A": "1"})
    key, deliver = launch_key(spec)
    assert deliver == key
    assert key not in " ".join(spec.argv) and ENGINE_KEY_ENV not in spec.env  # the spec is untouched


def test_a_recipe_that_brings_its_own_key_keeps_it() -> None:
    assert launch_key(_spec(argv=("vllm", "--api-key", "own"), env={}))[0] == "own"
    assert recipe_key(_spec(argv=("vllm", "--api-key=own2"), env={})) == "own2"
    assert launch_key(_spec(argv=("vllm",), env={ENGINE_KEY_ENV: "own3"})) == ("own3", None)


def test_the_key_is_redacted_from_records() -> None:
    spec = _spec(env={ENGINE_KEY_ENV: "eng_secret"})
    assert redact_spec(spec).env[ENGINE_KEY_ENV] == REDACTED


def test_docker_gives_the_engine_its_key_file_path_and_nothing_of_the_key() -> None:
    """Never the environment (vLLM 0.26.0 hashes VLLM_API_KEY into its compile key); the
    file itself is put into the created container (tests/integration/test_runtime_contract.py)."""
    spec = with_runtime(_spec(env={"A": "1"}), "docker", image="engine:1")
    kwargs = container_create_kwargs(spec, "L1", key_file=True)
    assert kwargs["environment"] == {"A": "1"}
    assert kwargs["command"][-2:] == ["--config", CONTAINER_KEY_PATH]
    assert container_create_kwargs(spec, "L2", key_file=True)["command"] == kwargs["command"]
    assert container_create_kwargs(spec, "L1")["command"] == kwargs["command"][:-2]


def test_a_taken_port_is_refused_with_its_holder() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)
        with pytest.raises(PortInUse, match=rf"127.0.0.1:{port} is already in use by pid \d+"):
            ensure_port_free("127.0.0.1", port)
    assert port_is_free("127.0.0.1", port)


@pytest.mark.parametrize("line", [
    "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): "
    "address already in use",
    "OSError: [Errno 98] Address already in use",
])
def test_address_already_in_use_is_a_diagnosis_with_the_fix(line: str) -> None:
    """The record of a relaunch over an orphan said "no known signature"."""
    diagnosis = diagnose(FailureFacts(exit_code=1, log_tail=("INFO starting", line, "Traceback ...")))
    assert diagnosis.code is DiagnosisCode.PORT_IN_USE
    assert "stop it by PID" in diagnosis.hint and diagnosis.retryable


NO_KEY_ARGV = ("/usr/bin/python3", "-m", "engine")


async def test_the_engine_key_reaches_probe_and_gateway_and_nothing_else(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, _spec(argv=NO_KEY_ARGV))

    def start(engine: FakeEngine) -> None:
        # vLLM 0.26.0's own line, with the key it read from its config file (engine_secret.py).
        key = rig.runtime.keys[engine.handle.launch_id]
        engine.log = ("INFO 11-30 [api_utils.py:273] non-default args: "
                      f"{{'model': '/m', 'api_key': ['{key}']}}\n"
                      "ERROR 11-30 Traceback (most recent call last):\n")
        engine.healthy = True

    rig.runtime.on_start = start
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 100)
    key = rig.runtime.keys["L1"]
    assert key is not None
    run = rig.driver.runs.get("L1")
    assert run is not None
    tail = "\n".join(run.follower.tail_lines())
    assert key not in tail and "'api_key': '<redacted>'" in tail  # what diagnoses and records keep
    assert rig.gateway.keys[-1] == key
    assert rig.driver.prober.keys[-1] == key  # type: ignore[attr-defined]
    record = rig.store.get_launch("L1")
    assert record is not None and key not in record.model_dump_json()
    assert key not in json.dumps(rig.driver.status())
    assert all(key not in e.model_dump_json() for e in rig.store.events())
    # A controller restart: the new driver reads the key back from where the runtime put it.
    (tmp_path / "again").mkdir()
    again = make_rig(tmp_path / "again", _spec(argv=NO_KEY_ARGV))
    again.runtime.engines = rig.runtime.engines
    again.runtime.keys = rig.runtime.keys
    again.driver.spec_for_recipe = lambda name: _spec(argv=NO_KEY_ARGV)
    await again.driver.adopt()
    rig.runtime.current().healthy = True
    await again.run_until(lambda: again.driver.machine.state is State.READY, 100)
    assert again.gateway.keys[-1] == key


async def test_a_taken_port_is_a_retryable_launch_failure_that_names_it(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    def taken(spec: LaunchSpec, launch_id: str, engine_key: object = None) -> object:
        raise PortInUse("127.0.0.1", 18000, "pid 4242 (python -m vllm)")

    rig.runtime.start = taken  # type: ignore[method-assign,assignment]
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    assert rig.driver.machine.state is State.BACKOFF
    failure = rig.driver.machine.last_failure
    assert failure is not None and failure.code == "port_in_use" and failure.retryable
    assert "pid 4242" in failure.summary
