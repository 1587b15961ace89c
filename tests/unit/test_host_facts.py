"""gather_facts over fixture host trees and over the real machine; the pure parsers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from appliance.host_facts import (
    GIB,
    UNLIMITED,
    parse_cgroup_limit,
    parse_memlock,
    parse_modules,
    parse_pci_kind,
)
from host_setup.facts import HostFactsError, gather_facts
from tests.unit.recipe_helpers import HOME, HOSTS, host


def test_reference_host_facts() -> None:
    f = host("reference")
    assert f.mem_total_bytes == 32778732 * 1024
    assert round(f.mem_total_gib, 2) == 31.26
    assert f.mem_available_bytes == 30211584 * 1024
    assert (f.swap_total_bytes, f.swap_free_bytes) == (4194300 * 1024, 4194300 * 1024)
    assert f.swappiness == 60
    assert f.kernel_release == "5.15.0-191-generic"
    assert "hydcu" in f.modules
    assert f.has_boot_param("iommu=pt") and f.has_boot_param("pci=disable_acs_redir=")
    assert not f.has_boot_param("iommu=on")
    assert (f.memlock_soft_bytes, f.memlock_hard_bytes) == (8388608, 8388608)
    assert f.cgroup_version == 2
    assert f.cgroup_memory_limit_bytes is None  # memory.max is "max"
    assert [g.pci_address for g in f.gpus] == ["0000:03:00.0", "0000:23:00.0", "0000:43:00.0", "0000:63:00.0"]
    assert {(g.vendor, g.kind, g.driver) for g in f.gpus} == {("hygon", "display", "hydcu")}
    assert f.appliance_home == HOME
    assert f.expand("${APPLIANCE_HOME}/cache") == f"{HOME}/cache"


def test_swap_and_swappiness_after_recipe_c_host_changes() -> None:
    f = host("reference-swap8-swappiness200")
    assert f.swap_total_bytes == 8388600 * 1024
    assert f.swappiness == 200


def copy_host(tmp_path: Path, name: str = "reference") -> Path:
    root = tmp_path / name
    shutil.copytree(HOSTS / name, root, symlinks=True)
    return root


def test_missing_optional_files_are_unknown_not_errors(tmp_path: Path) -> None:
    root = tmp_path / "bare"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text("MemTotal: 1048576 kB\nMemFree: 524288 kB\n")
    f = gather_facts(root, appliance_home=Path("/srv/a"))
    assert (f.mem_total_bytes, f.swap_total_bytes, f.swappiness, f.gpus, f.modules) == (GIB, 0, None, (), ())
    assert (f.memlock_soft_bytes, f.cgroup_version, f.kernel_release) == (None, None, None)


def test_not_a_host_tree_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HostFactsError, match="proc/meminfo"):
        gather_facts(tmp_path)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("garbage\n")
    with pytest.raises(HostFactsError, match="no MemTotal"):
        gather_facts(tmp_path)


def test_cgroup_v1_limit_of_our_own_cgroup(tmp_path: Path) -> None:
    root = copy_host(tmp_path)
    shutil.rmtree(root / "sys/fs/cgroup")
    limit_dir = root / "sys/fs/cgroup/memory/docker/abc"
    limit_dir.mkdir(parents=True)
    (limit_dir / "memory.limit_in_bytes").write_text(f"{32 * GIB}\n")
    (root / "proc/self/cgroup").write_text("4:memory:/docker/abc\n0::/\n")
    f = gather_facts(root)
    assert (f.cgroup_version, f.cgroup_memory_limit_bytes) == (1, 32 * GIB)


def test_unbound_gpu_has_no_driver(tmp_path: Path) -> None:
    root = copy_host(tmp_path)
    (root / "sys/bus/pci/devices/0000:63:00.0/driver").unlink()
    f = gather_facts(root)
    assert [g.driver for g in f.gpus] == ["hydcu", "hydcu", "hydcu", None]


def test_real_machine() -> None:
    f = gather_facts(Path("/"))
    assert f.mem_total_bytes > 256 * 1024**2
    assert 0 <= f.mem_available_bytes <= f.mem_total_bytes
    assert f.swap_free_bytes <= f.swap_total_bytes
    assert f.swappiness is None or 0 <= f.swappiness <= 200
    assert f.memlock_soft_bytes is not None  # /proc/self/limits exists on every Linux
    assert f.cgroup_version in (1, 2, None)


def test_parse_memlock() -> None:
    text = "Limit  Soft Limit  Hard Limit  Units\nMax locked memory    unlimited    unlimited    bytes\n"
    assert parse_memlock(text) == (UNLIMITED, UNLIMITED)
    assert parse_memlock("Max locked memory  65536  131072  bytes") == (65536, 131072)
    assert parse_memlock("") == (None, None)


def test_parse_pci_kind_and_modules_and_cgroup_limits() -> None:
    assert [parse_pci_kind(c) for c in ("0x030000", "0x038000", "0x120000", "0x060400", "")] == [
        "display",
        "display",
        "accelerator",
        None,
        None,
    ]
    assert parse_modules("b 1 0 - Live 0x0\na 2 1 b, Live 0x0\n\n") == ("a", "b")
    assert [parse_cgroup_limit(t) for t in ("max\n", "9223372036854771712\n", "1073741824\n")] == [
        None,
        None,
        GIB,
    ]
