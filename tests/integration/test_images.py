"""The appliance's images build here (no registry, TLS proxy CA, local torch wheel) with one
idempotent command, and are what the Dockerfiles promise: no build tools or CA bundle left in the
appliance image, the gateway's account non-root, the engine image importing vllm with its torch."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import docker
import docker.errors
import pytest

from tests.integration.images import (
    APPLIANCE_IMAGE,
    BUILD_TIMEOUT_S,
    CPU_VLLM_IMAGE,
    PROMETHEUS_IMAGE,
    build_appliance_images,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    try:
        c = docker.from_env()
        c.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(f"no Docker daemon ({exc}): start one with `bash scripts/start-dockerd.sh`")
    return c


def _sh(image: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "bash", image,
                           "-c", script], capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.timeout(BUILD_TIMEOUT_S + 300)
def test_images_build_and_a_rebuild_is_a_no_op(client: docker.DockerClient) -> None:
    first, out = build_appliance_images()
    print(f"\nfirst build (or cache check) of all images: {first:.1f} s\n{out}")
    again, out2 = build_appliance_images()
    print(f"no-op rebuild: {again:.1f} s\n{out2}")
    for tag in (APPLIANCE_IMAGE, CPU_VLLM_IMAGE, PROMETHEUS_IMAGE):
        assert f"{tag} up to date" in out2, out2
        labels = client.images.get(tag).labels
        assert len(labels.get("appliance.inputs", "")) == 16


def test_appliance_image_has_no_build_tools_no_ca_secret_and_a_non_root_account() -> None:
    ca_sha = hashlib.sha256(HOST_CA.read_bytes()).hexdigest() if HOST_CA.exists() else "-"
    res = _sh(APPLIANCE_IMAGE, f"""
        for t in gcc cc g++ make pip pip3 apt-get-never; do command -v $t && echo "TOOL $t"; done
        test -e /run/secrets/ca && echo SECRET-LEFT
        find / -xdev -type f -size +100k -name '*.crt' -exec sha256sum {{}} + 2>/dev/null | grep -q {ca_sha} \
          && echo HOST-CA-LEFT
        id -u appliance; appliance --help >/dev/null && echo CLI-OK
        /opt/appliance/bin/python -c 'import kubernetes' 2>/dev/null && echo KUBERNETES-CLIENT
        appliance recipes render cpu-smollm2-docker --format k8s >/dev/null && echo K8S-RENDER-OK
    """)
    out = res.stdout
    assert "TOOL" not in out and "SECRET-LEFT" not in out and "HOST-CA-LEFT" not in out, out + res.stderr
    assert "10001" in out and "CLI-OK" in out, out + res.stderr
    # The Kubernetes client is an extra (126 MB installed): not in the default image, whose render of
    # manifests needs nothing of it (appliance/runtimes/ is pure).
    assert "KUBERNETES-CLIENT" not in out and "K8S-RENDER-OK" in out, out + res.stderr


def test_engine_image_imports_vllm_with_its_cpu_torch_and_carries_the_model_source() -> None:
    res = _sh(CPU_VLLM_IMAGE, """
        python -c 'import torch, vllm; print("torch", torch.__version__)'
        python -c 'import torchvision' 2>/dev/null && echo TORCHVISION-PRESENT
        test -s "$MODEL_GGUF" && echo GGUF-OK; test -e /run/secrets/ca && echo SECRET-LEFT
    """)
    assert "+cpu" in res.stdout and "GGUF-OK" in res.stdout, res.stdout + res.stderr
    assert "TORCHVISION-PRESENT" not in res.stdout and "SECRET-LEFT" not in res.stdout


def test_host_plan_from_the_image_against_a_bind_mounted_host_root(tmp_path: Path) -> None:
    """README "Run it as containers": host setup stays a host action, run from the image with the
    host's root bind-mounted and `--host-root`; here on a fixture tree (the reference GPU host)."""
    from tests.fixtures.host_setup.tree import make_host

    host = make_host(tmp_path)
    res = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{host.root.base}:/host:ro",
         APPLIANCE_IMAGE, "host", "plan", "gfx906-c-tp4-graph-piecewise", "--host-root", "/host"],
        capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "swap.swapfile" in res.stdout and "vm.swappiness = 60" in res.stdout, res.stdout
