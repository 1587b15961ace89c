"""Start-up grant checks of a containerised controller: each missing grant is one sentence naming
what is blind (controller/watch/grants.py), checked against fixture trees."""

from __future__ import annotations

from pathlib import Path

from controller.watch.grants import GrantPaths, check_grants, grant_paths_from_env


def host_tree(root: Path, *, kmsg: bool = True, cgroup: bool = True) -> GrantPaths:
    proc = root / "proc"
    (proc / "pressure").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 24 kB\nMemAvailable: 20 kB\n")
    (proc / "swaps").write_text("Filename Type Size Used Priority\n")
    (proc / "pressure" / "memory").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    if kmsg:
        (root / "kmsg").write_text("")
    if cgroup:
        (root / "cgroup" / "memory" / "docker").mkdir(parents=True)
    sock = root / "docker.sock"
    sock.write_text("")
    return GrantPaths(proc=proc, kmsg=root / "kmsg", docker_socket=sock, host_cgroup=root / "cgroup",
                      dockerenv=root / ".dockerenv")


def test_all_grants_present(tmp_path: Path) -> None:
    checks = check_grants(host_tree(tmp_path), pid=4242, docker_ping=lambda: None)
    assert [c.detail for c in checks if not c.ok] == []
    assert len(checks) == 7


def test_each_missing_grant_names_what_is_blind(tmp_path: Path) -> None:
    paths = host_tree(tmp_path, kmsg=False, cgroup=False)
    (paths.proc / "pressure" / "memory").unlink()
    missing = [c.detail for c in check_grants(paths, pid=1, docker_ping=lambda: "daemon refused")
               if not c.ok]
    assert len(missing) == 5
    joined = "\n".join(missing)
    assert "no host PID namespace (pid: host)" in joined
    assert "PSI) is not watched" in joined
    assert "kernel OOM kills will not be seen" in joined
    assert "daemon refused: engines of the docker runtime can be neither started nor adopted" in joined
    assert "cgroup" in joined and "not mounted" in joined


def test_socket_not_mounted(tmp_path: Path) -> None:
    paths = host_tree(tmp_path)
    assert paths.docker_socket is not None
    paths.docker_socket.unlink()
    [bad] = [c for c in check_grants(paths, pid=7) if not c.ok]
    assert bad.detail.startswith(f"no Docker socket at {paths.docker_socket}:")


def test_own_cgroup_instead_of_the_hosts_tree(tmp_path: Path) -> None:
    paths = host_tree(tmp_path, cgroup=False)
    (paths.host_cgroup / "memory").mkdir(parents=True)  # a container's own v1 memory cgroup
    [bad] = [c for c in check_grants(paths, pid=7) if not c.ok]
    assert "no docker/ cgroups" in bad.detail


def test_real_kmsg_without_permission_is_reported(tmp_path: Path) -> None:
    paths = host_tree(tmp_path)
    # Unreadable for everyone, root included (root reads a 0000 file anyway: the old chmod(0) version
    # asserted nothing when the suite ran as root, as CI does).
    paths.kmsg.unlink()
    paths.kmsg.mkdir()
    check = {c.grant: c for c in check_grants(paths, pid=7)}["/dev/kmsg"]
    assert not check.ok and f"cannot read {paths.kmsg}" in check.detail


def test_paths_from_env() -> None:
    p = grant_paths_from_env({"APPLIANCE_HOST_CGROUP": "/host/sys/fs/cgroup",
                              "DOCKER_HOST": "unix:///run/d.sock"})
    assert p.host_cgroup == Path("/host/sys/fs/cgroup") and p.docker_socket == Path("/run/d.sock")
    assert grant_paths_from_env({"DOCKER_HOST": "tcp://10.0.0.1:2375"}).docker_socket is None
