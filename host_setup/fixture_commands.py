"""`Commands` for a host root that is not the running machine (fixture trees, `--host-root` copies).

Nothing here reaches the live kernel: `swapon`/`swapoff` edit the tree's own `proc/swaps` (so a
second `apply` sees the swap as active, exactly like on a real host), `systemctl`/`sysctl` are only
recorded, and `fallocate`/`dd` make a sparse file unless told to run for real. `mkswap` runs for
real by default: it only formats a file, and only files inside the root are accepted. Every call
is recorded in `calls` so tests can assert what apply/revert would have run.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from host_setup.commands import CommandError, CommandResult
from host_setup.root import HostRoot

_SWAPS_HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
_PAGE = 4096  # mkswap keeps one page for its header; /proc/swaps reports the rest


class FixtureCommands:
    def __init__(
        self,
        root: HostRoot,
        *,
        real: frozenset[str] = frozenset({"mkswap"}),
        canned: Mapping[str, CommandResult] | None = None,
        fail: Mapping[str, str] | None = None,
    ) -> None:
        """`real`: commands run as subprocesses (file-only ones: mkswap, fallocate, dd).
        `canned`: argv[0] → result returned as is (e.g. `docker` → a `docker info` JSON).
        `fail`: argv[0] → stderr of a simulated failure (exit 1), to test error paths."""
        if root.is_real:
            raise ValueError("FixtureCommands is for fixture roots; the real host uses SubprocessCommands")
        self.root = root
        self.real = real
        self.canned = dict(canned or {})
        self.fail = dict(fail or {})
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        args = tuple(argv)
        self.calls.append(args)
        name = args[0]
        if name in self.fail:
            return self._result(args, 1, "", self.fail[name], check)
        if name in self.canned:
            canned = self.canned[name]
            return self._result(args, canned.returncode, canned.stdout, canned.stderr, check)
        if name in self.real:
            for arg in args[1:]:
                self._inside_root(arg.removeprefix("of="))
            done = subprocess.run(list(args), capture_output=True, text=True, check=False, timeout=300)
            return self._result(args, done.returncode, done.stdout, done.stderr, check)
        handler: Callable[[tuple[str, ...]], tuple[int, str, str]] | None = {
            "swapon": self._swapon,
            "swapoff": self._swapoff,
            "fallocate": self._fallocate,
            "dd": self._dd,
            "systemctl": self._recorded,
            "sysctl": self._recorded,
        }.get(name)
        if handler is None:
            return self._result(args, 127, "", f"{name}: not available on a fixture root", check)
        code, out, err = handler(args)
        return self._result(args, code, out, err, check)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    # --- simulated commands ---------------------------------------------------------------------

    def _swaps_path(self) -> Path:
        return self.root.proc / "swaps"

    def _swap_lines(self) -> list[str]:
        path = self._swaps_path()
        if not path.exists():
            return []
        return [line for line in path.read_text().splitlines()[1:] if line.strip()]

    def _write_swaps(self, lines: list[str]) -> None:
        path = self._swaps_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_SWAPS_HEADER + "".join(line + "\n" for line in lines))

    def _swapon(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        real = self._inside_root(args[-1])
        host = self.root.host_path(real)
        if not real.exists():
            return 255, "", f"swapon: cannot open {args[-1]}: No such file or directory"
        with real.open("rb") as f:
            header = f.read(_PAGE)
        if header[_PAGE - 10 :] != b"SWAPSPACE2":
            return 255, "", f"swapon: {args[-1]}: read swap header failed"
        lines = self._swap_lines()
        if any(line.split()[0] == host for line in lines):
            return 255, "", f"swapon: {args[-1]}: swapon failed: Device or resource busy"
        size_kib = (real.stat().st_size - _PAGE) // 1024
        lines.append(f"{host}\tfile\t\t{size_kib}\t\t0\t\t-2")
        self._write_swaps(lines)
        return 0, "", ""

    def _swapoff(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        host = self.root.host_path(self._inside_root(args[-1]))
        lines = self._swap_lines()
        kept = [line for line in lines if line.split()[0] != host]
        if len(kept) == len(lines):
            return 255, "", f"swapoff: {args[-1]}: swapoff failed: Invalid argument"
        self._write_swaps(kept)
        return 0, "", ""

    def _fallocate(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        # `fallocate -l BYTES PATH`: a sparse file of the same size (no real blocks in a fixture tree).
        size = int(args[args.index("-l") + 1])
        with self._inside_root(args[-1]).open("r+b" if Path(args[-1]).exists() else "wb") as f:
            f.truncate(size)
        return 0, "", ""

    def _dd(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        opts = dict(a.split("=", 1) for a in args[1:] if "=" in a)
        size = int(opts["count"]) * (1024 * 1024 if opts.get("bs") == "1M" else int(opts.get("bs", "512")))
        with self._inside_root(opts["of"]).open("wb") as f:
            f.truncate(size)
        return 0, "", ""

    def _recorded(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        return 0, "", ""

    # --- helpers --------------------------------------------------------------------------------

    def _inside_root(self, arg: str) -> Path:
        path = Path(arg)
        if path.is_absolute() and not path.resolve().is_relative_to(self.root.base):
            raise ValueError(f"fixture command touches {arg}, outside the fixture root {self.root.base}")
        return path

    @staticmethod
    def _result(args: tuple[str, ...], code: int, out: str, err: str, check: bool) -> CommandResult:
        if check and code != 0:
            raise CommandError(args, code, err)
        return CommandResult(args, code, out, err)
