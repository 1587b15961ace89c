"""Read the host facts through an injected root: `/` on the host, a fixture tree in tests.

Everything read is a file under `root` (`proc/meminfo`, `proc/sys/vm/swappiness`, `proc/cmdline`,
`proc/modules`, `proc/self/limits`, `proc/self/cgroup`, `sys/bus/pci/devices/*`, `sys/fs/cgroup`),
so `appliance plan --host-root DIR` can judge a copied tree of another machine. A missing file is
a fact ("unknown"), not an error; only a missing `/proc/meminfo` is fatal (no RAM, no admission).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from appliance import settings
from appliance.host_facts import (
    GPU_VENDORS,
    Gpu,
    HostFacts,
    parse_cgroup_limit,
    parse_cmdline,
    parse_memlock,
    parse_modules,
    parse_pci_kind,
)
from appliance.observe.procfs import (
    ProcParseError,
    memory_cgroup_of,
    parse_meminfo,
    parse_proc_cgroup,
    parse_swappiness,
)


class HostFactsError(RuntimeError):
    """The root does not look like a Linux host (no /proc/meminfo)."""


def default_appliance_home() -> Path:
    """$APPLIANCE_HOME, else the rule in appliance/settings.py (as controller.settings.default_home)."""
    return settings.current().appliance_home()


def gather_facts(root: Path = Path("/"), appliance_home: Path | None = None) -> HostFacts:
    """Host facts read under `root`. `appliance_home` defaults to $APPLIANCE_HOME / the settings rule."""
    meminfo_text = _read(root / "proc/meminfo")
    if meminfo_text is None:
        raise HostFactsError(f"{root / 'proc/meminfo'} not found: is {root} the root of a Linux host tree?")
    swappiness_text = _read(root / "proc/sys/vm/swappiness")
    try:
        mem = parse_meminfo(meminfo_text)
        swappiness = parse_swappiness(swappiness_text) if swappiness_text else None
    except ProcParseError as exc:
        raise HostFactsError(f"{root}: {exc}") from None
    soft, hard = parse_memlock(_read(root / "proc/self/limits") or "")
    version = _cgroup_version(root)
    return HostFacts(
        mem_total_bytes=mem.mem_total_bytes,
        mem_available_bytes=mem.available_bytes,
        swap_total_bytes=mem.swap_total_bytes,
        swap_free_bytes=mem.swap_free_bytes,
        swappiness=swappiness,
        cmdline=parse_cmdline(_read(root / "proc/cmdline") or ""),
        kernel_release=(_read(root / "proc/sys/kernel/osrelease") or "").strip() or None,
        modules=parse_modules(_read(root / "proc/modules") or ""),
        memlock_soft_bytes=soft,
        memlock_hard_bytes=hard,
        gpus=_gpus(root / "sys/bus/pci/devices"),
        cgroup_version=version,
        cgroup_memory_limit_bytes=_cgroup_limit(root, version),
        appliance_home=str(appliance_home if appliance_home is not None else default_appliance_home()),
        is_root=os.geteuid() == 0,
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None


def _gpus(devices: Path) -> tuple[Gpu, ...]:
    if not devices.is_dir():
        return ()
    found: list[Gpu] = []
    for dev in sorted(devices.iterdir()):
        vendor_id = (_read(dev / "vendor") or "").strip().lower()
        kind = parse_pci_kind(_read(dev / "class") or "")
        if vendor_id not in GPU_VENDORS or kind is None:
            continue
        driver_link = dev / "driver"
        driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
        found.append(
            Gpu(
                pci_address=dev.name,
                vendor=GPU_VENDORS[vendor_id],
                vendor_id=vendor_id,
                device_id=(_read(dev / "device") or "").strip().lower(),
                kind=kind,
                driver=driver,
            )
        )
    return tuple(found)


def _cgroup_version(root: Path) -> Literal[1, 2] | None:
    cgroup = root / "sys/fs/cgroup"
    if (cgroup / "cgroup.controllers").exists():
        return 2
    if (cgroup / "memory").is_dir():
        return 1
    return None


def _cgroup_limit(root: Path, version: Literal[1, 2] | None) -> int | None:
    """The memory limit of our own cgroup: a process-runtime engine inherits it (DOMAIN §3)."""
    own = memory_cgroup_of(parse_proc_cgroup(_read(root / "proc/self/cgroup") or ""))
    if own is None or version is None:
        return None
    rel = own.lstrip("/")
    path = (
        (root / "sys/fs/cgroup" / rel / "memory.max")
        if version == 2
        else (root / "sys/fs/cgroup/memory" / rel / "memory.limit_in_bytes")
    )
    text = _read(path)
    return parse_cgroup_limit(text) if text else None
