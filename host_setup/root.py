"""The host as host_setup sees it: every directory it reads or writes, relative to one injected root.

On the real host the root is `/`. Tests point it at a fixture tree, and an operator can point
`--host-root` at a copied tree to see what a plan would do to another machine. Paths *as the host
names them* (what goes into fstab, what /proc/swaps lists) are "host paths"; `path()` maps them
into the root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

DEFAULT_SWAP_DIR = "/var/lib/appliance/swap"
SWAPFILE_NAME = "appliance.swap"


@dataclass(frozen=True)
class HostRoot:
    base: Path = Path("/")
    swap_dir: str = DEFAULT_SWAP_DIR  # a host path: the directory our swapfile lives in

    @classmethod
    def at(cls, base: Path | str, swap_dir: str = DEFAULT_SWAP_DIR) -> HostRoot:
        if not PurePosixPath(swap_dir).is_absolute():
            raise ValueError(f"swap dir must be an absolute host path, got {swap_dir!r}")
        return cls(base=Path(base).resolve(), swap_dir=swap_dir)

    @property
    def is_real(self) -> bool:
        """True when this is the running machine itself (apply then needs root, and the kernel is live)."""
        return self.base == Path("/")

    def path(self, host_path: str | PurePosixPath) -> Path:
        relative = str(host_path).lstrip("/")
        return self.base / relative if relative else self.base

    def host_path(self, real: Path) -> str:
        """The inverse of `path()`: how the host names a file that lives inside the root."""
        try:
            return "/" + str(real.relative_to(self.base)).removeprefix(".").lstrip("/")
        except ValueError:
            return str(real)

    @property
    def proc(self) -> Path:
        return self.path("/proc")

    @property
    def sys(self) -> Path:
        return self.path("/sys")

    @property
    def etc(self) -> Path:
        return self.path("/etc")

    @property
    def dev(self) -> Path:
        return self.path("/dev")

    @property
    def boot(self) -> Path:
        return self.path("/boot")

    @property
    def lib_modules(self) -> Path:
        return self.path("/lib/modules")

    @property
    def swapfile_host_path(self) -> str:
        return str(PurePosixPath(self.swap_dir) / SWAPFILE_NAME)


def read_text(path: Path) -> str | None:
    """A host file's text, or None when it does not exist (absence is a fact, not an error)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
