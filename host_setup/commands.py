"""The one seam for the commands that change the running kernel: mkswap, swapon, swapoff, setpci,
sysctl, systemctl, docker.

Every executor runs its commands through a `Commands` object. The real host uses
`SubprocessCommands`; unit tests and `--host-root` trees use `FixtureCommands`
(`host_setup/fixture_commands.py`), which records each call and never touches the live kernel.
Arguments are real filesystem paths (inside the host root), so the same argv works for both.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from host_setup.model import HostSetupError
from host_setup.root import HostRoot

# Which package provides a command, for the "not installed" message an operator can act on.
_PROVIDERS = {
    "mkswap": "util-linux",
    "swapon": "util-linux",
    "swapoff": "util-linux",
    "fallocate": "util-linux",
    "setpci": "pciutils",
    "sysctl": "procps",
    "systemctl": "systemd",
    "docker": "docker.io / docker-ce",
}


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandError(HostSetupError):
    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no error output"
        super().__init__(f"`{' '.join(self.argv)}` failed (exit {returncode}): {detail}")


class Commands(Protocol):
    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        """Run argv; with check=True a non-zero exit raises CommandError."""
        ...


class SubprocessCommands:
    """The real host: each command is a subprocess with a timeout (swapoff of a full swap can be slow)."""

    def __init__(self, timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except FileNotFoundError:
            package = _PROVIDERS.get(argv[0], "the package that provides it")
            raise HostSetupError(f"`{argv[0]}` is not installed: install {package}") from None
        except subprocess.TimeoutExpired:
            raise HostSetupError(f"`{' '.join(argv)}` did not finish within {self.timeout_s:.0f} s") from None
        result = CommandResult(tuple(argv), done.returncode, done.stdout, done.stderr)
        if check and done.returncode != 0:
            raise CommandError(argv, done.returncode, done.stderr)
        return result


@dataclass(frozen=True)
class HostContext:
    """What an executor needs: where the host is, and how to run commands on it."""

    root: HostRoot
    commands: Commands
    pci_via: Literal["sysfs", "setpci"] = "sysfs"  # how PCI config words are read and written
