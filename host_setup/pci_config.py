"""PCI Express configuration space: find the ACS capability and read/write its control word.

The ACS (Access Control Services) extended capability has ID 0x000D. Extended capabilities start
at offset 0x100; each begins with a 32-bit header: ID (bits 0–15), version (16–19), offset of the
next one (20–31, 0 = last). The ACS capability register is at +4, the control register at +6
(both 16 bit); control bits as in linux/pci_regs.h `PCI_ACS_*`.

Two ways in, behind one protocol:
- `SysfsConfigAccess` reads and writes `/sys/bus/pci/devices/<bdf>/config` (root sees all 4 KiB;
  non-root sees 64 bytes) — works on fixture trees, needs no tool;
- `SetpciAccess` runs `setpci -s <bdf> ECAP_ACS+6.w[=value]` through the command seam, the way
  the original `dcu_p2p_acs.py` did (DOMAIN §6).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Protocol

from host_setup.commands import CommandError, Commands, HostContext
from host_setup.model import HostSetupError
from host_setup.root import HostRoot

ACS_EXT_CAP_ID = 0x000D
EXT_CONFIG_START = 0x100
ACS_CAP_REG = 4
ACS_CTRL_REG = 6

ACS_BITS = {
    0x01: "SrcValid",
    0x02: "TransBlk",
    0x04: "ReqRedir",
    0x08: "CmpltRedir",
    0x10: "UpstreamFwd",
    0x20: "EgressCtrl",
    0x40: "DirectTrans",
}
# What `pci=disable_acs_redir=` clears (drivers/pci/pci.c: PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_EC):
# DOMAIN §6 saw 0x001d become 0x0011 with it.
REDIRECT_BITS = 0x04 | 0x08 | 0x20


class AcsUnreadable(HostSetupError):
    """The config space cannot be read far enough to know whether ACS is there."""


def find_ext_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of extended capability `cap_id`, or None. Raises AcsUnreadable when the extended space
    is not visible (a conventional-PCI device shows only 256 bytes, a non-root reader 64)."""
    if len(config) <= EXT_CONFIG_START:
        raise AcsUnreadable(
            f"only {len(config)} bytes of config space are visible"
            + (" (run as root)" if len(config) <= 64 else " (no PCIe extended space)")
        )
    offset = EXT_CONFIG_START
    seen: set[int] = set()
    while offset and offset not in seen and offset + 4 <= len(config):
        seen.add(offset)
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return offset
        offset = (header >> 20) & 0xFFC
    return None


def describe_control(value: int) -> str:
    names = [name for bit, name in ACS_BITS.items() if value & bit]
    return f"0x{value:04x} ({' '.join(names) if names else 'all off'})"


class PciConfigAccess(Protocol):
    def acs_offset(self, bdf: str) -> int | None:
        """Offset of the ACS capability; None when the device has none. May raise AcsUnreadable."""
        ...

    def read_control(self, bdf: str) -> int: ...

    def write_control(self, bdf: str, value: int) -> None: ...


class SysfsConfigAccess:
    def __init__(self, root: HostRoot) -> None:
        self.root = root

    def _config(self, bdf: str) -> Path:
        return self.root.sys / "bus" / "pci" / "devices" / bdf / "config"

    def acs_offset(self, bdf: str) -> int | None:
        try:
            data = self._config(bdf).read_bytes()
        except OSError as exc:
            raise AcsUnreadable(f"cannot read {self._config(bdf)}: {exc.strerror}") from exc
        return find_ext_capability(data, ACS_EXT_CAP_ID)

    def _ctrl_offset(self, bdf: str) -> int:
        offset = self.acs_offset(bdf)
        if offset is None:
            raise HostSetupError(f"{bdf} has no ACS capability")
        return offset + ACS_CTRL_REG

    def read_control(self, bdf: str) -> int:
        with self._config(bdf).open("rb") as f:
            f.seek(self._ctrl_offset(bdf))
            (value,) = struct.unpack("<H", f.read(2))
        return int(value)

    def write_control(self, bdf: str, value: int) -> None:
        offset = self._ctrl_offset(bdf)
        try:
            # One aligned 2-byte write: the kernel turns it into a single config word write.
            with self._config(bdf).open("r+b", buffering=0) as f:
                f.seek(offset)
                f.write(struct.pack("<H", value))
        except OSError as exc:
            raise HostSetupError(f"cannot write ACS control of {bdf}: {exc.strerror} (needs root)") from exc


class SetpciAccess:
    def __init__(self, commands: Commands) -> None:
        self.commands = commands

    def acs_offset(self, bdf: str) -> int | None:
        try:
            self.commands.run(["setpci", "-s", bdf, "ECAP_ACS+0.l"])
        except CommandError:
            return None  # setpci fails when the capability is missing
        return -1  # present; setpci addresses it by name, the offset is not needed

    def read_control(self, bdf: str) -> int:
        out = self.commands.run(["setpci", "-s", bdf, "ECAP_ACS+6.w"]).stdout.strip()
        try:
            return int(out, 16)
        except ValueError:
            raise HostSetupError(f"setpci returned {out!r} for the ACS control of {bdf}") from None

    def write_control(self, bdf: str, value: int) -> None:
        self.commands.run(["setpci", "-s", bdf, f"ECAP_ACS+6.w={value:04x}"])


def access_for(ctx: HostContext) -> PciConfigAccess:
    if ctx.pci_via == "setpci":
        return SetpciAccess(ctx.commands)
    return SysfsConfigAccess(ctx.root)
