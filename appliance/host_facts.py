"""Host facts: what admission and render need to know about the machine. Pure data and parsers.

`host_setup.facts.gather_facts(root)` reads the files; everything here only turns text into values,
so tests feed fixture text and fixture trees (`tests/fixtures/hosts/<name>/`). /proc/meminfo and
swappiness parsing is shared with the host watch (`appliance.observe.procfs`).

Why these facts (DOMAIN §1, §3): host RAM is the binding constraint (MemTotal 31.26 GiB, swap
4 GiB on the reference host); `vm.swappiness` 60→200 raised the margin 0.29→2.71 GiB (S14c);
pinned memory is bounded by RLIMIT_MEMLOCK (S11f §10.1); a kernel without `hydcu` has no GPU.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

GIB = 1024**3
MIB = 1024**2
HOME_PLACEHOLDER = "${APPLIANCE_HOME}"
UNLIMITED = -1  # RLIMIT_INFINITY as `ulimit -l` / docker `--ulimit memlock=-1` spell it

# PCI vendor ids of the GPUs the appliance knows (sysfs `vendor`).
GPU_VENDORS = {"0x1002": "amd", "0x1d94": "hygon", "0x10de": "nvidia"}
# PCI base class (first byte of sysfs `class`) → kind. DCUs and datacenter GPUs often report
# "display controller" or "processing accelerator" rather than VGA.
_PCI_KINDS = {"03": "display", "12": "accelerator", "0b": "processor"}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Gpu(_Frozen):
    pci_address: str
    vendor: str = Field(description="amd | hygon | nvidia")
    vendor_id: str
    device_id: str
    kind: str = Field(description="From the PCI class: display, accelerator, processor.")
    driver: str | None = Field(default=None, description="Bound kernel driver (hydcu, amdgpu, nvidia).")


class HostFacts(_Frozen):
    mem_total_bytes: int
    mem_available_bytes: int
    swap_total_bytes: int
    swap_free_bytes: int
    swappiness: int | None = None
    cmdline: str = ""
    kernel_release: str | None = None
    modules: tuple[str, ...] = ()
    memlock_soft_bytes: int | None = Field(default=None, description="-1 = unlimited; None = unknown.")
    memlock_hard_bytes: int | None = None
    gpus: tuple[Gpu, ...] = ()
    cgroup_version: Literal[1, 2] | None = None
    cgroup_memory_limit_bytes: int | None = Field(
        default=None, description="Memory limit of the cgroup this process runs in; None = none/unknown."
    )
    appliance_home: str = Field(description="Substituted for ${APPLIANCE_HOME} in recipe strings.")
    is_root: bool = False

    @property
    def mem_total_gib(self) -> float:
        return self.mem_total_bytes / GIB

    @property
    def mem_available_gib(self) -> float:
        return self.mem_available_bytes / GIB

    @property
    def swap_total_gib(self) -> float:
        return self.swap_total_bytes / GIB

    @property
    def boot_params(self) -> tuple[str, ...]:
        return tuple(self.cmdline.split())

    def has_boot_param(self, wanted: str) -> bool:
        """`iommu=pt` must match exactly; `pci=disable_acs_redir=` (ending in '=') matches any value."""
        if wanted.endswith("="):
            return any(p.startswith(wanted) for p in self.boot_params)
        return wanted in self.boot_params

    def expand(self, text: str) -> str:
        """Substitute ${APPLIANCE_HOME} (the only placeholder recipes may use)."""
        return text.replace(HOME_PLACEHOLDER, self.appliance_home.rstrip("/") or "/")

    def gpus_of(self, vendors: tuple[str, ...]) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if g.vendor in vendors)


def parse_cmdline(text: str) -> str:
    return " ".join(text.split())


def parse_modules(text: str) -> tuple[str, ...]:
    """`/proc/modules`: the first column of each line."""
    return tuple(sorted({line.split()[0] for line in text.splitlines() if line.strip()}))


_LIMIT_LINE = re.compile(r"^Max locked memory\s+(\S+)\s+(\S+)\s+bytes\s*$")


def parse_memlock(limits_text: str) -> tuple[int | None, int | None]:
    """Soft and hard RLIMIT_MEMLOCK from `/proc/<pid>/limits` (-1 = unlimited)."""
    for line in limits_text.splitlines():
        m = _LIMIT_LINE.match(line.strip())
        if m:
            return _limit_value(m.group(1)), _limit_value(m.group(2))
    return None, None


def _limit_value(text: str) -> int | None:
    if text == "unlimited":
        return UNLIMITED
    return int(text) if text.isdigit() else None


def parse_pci_kind(class_text: str) -> str | None:
    """sysfs `class` (e.g. `0x038000`) → kind, or None when it is not a GPU-like class."""
    value = class_text.strip().lower().removeprefix("0x").rjust(6, "0")
    return _PCI_KINDS.get(value[:2])


def parse_cgroup_limit(text: str) -> int | None:
    """cgroup v2 `memory.max` ("max" = none) or v1 `memory.limit_in_bytes` (a huge number = none)."""
    value = text.strip()
    if value == "max" or not value.isdigit():
        return None
    limit = int(value)
    # cgroup v1 prints PAGE_COUNTER_MAX × page size (~2^63) for "no limit".
    return None if limit >= 2**62 else limit
