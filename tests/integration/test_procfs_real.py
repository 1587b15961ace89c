"""The host-watch readers over the real /proc of this machine, cross-checked against psutil and
against memory this test really allocates."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from controller.watch.procreader import ProcReader
from controller.watch.sampler import HostSampler, Watermarks

MIB = 2**20


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A python child that holds 64 MiB of touched anonymous memory until its stdin closes."""
    code = (
        "import sys; b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
        "print('ok', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()  # by the Popen handle: only the child this fixture started
        proc.wait(10)


def test_meminfo_matches_psutil() -> None:
    m = ProcReader().meminfo()
    vm = psutil.virtual_memory()
    assert m.mem_total_bytes == vm.total
    assert m.mem_available_bytes is not None  # every kernel since 3.14
    assert 0 < m.available_bytes <= m.mem_total_bytes
    # MemAvailable moves between the two reads; other engineers run heavy things here.
    assert abs(m.available_bytes - vm.available) < 2 * 1024 * MIB
    sw = psutil.swap_memory()
    assert m.swap_total_bytes == sw.total


def test_swaps_psi_swappiness_are_readable() -> None:
    r = ProcReader()
    areas = r.swaps()
    assert sum(a.size_bytes for a in areas) == r.meminfo().swap_total_bytes
    swappiness = r.swappiness()
    assert swappiness is not None and 0 <= swappiness <= 200
    assert swappiness == int(Path("/proc/sys/vm/swappiness").read_text())
    if not Path("/proc/pressure/memory").exists():
        pytest.skip("kernel without PSI")
    p = r.pressure()
    assert p is not None and p.full is not None
    assert 0.0 <= p.some.avg10 <= 1.0 and p.some.total_seconds >= p.full.total_seconds >= 0


def test_process_tree_and_rssanon_of_a_real_child(child: subprocess.Popen[bytes]) -> None:
    r = ProcReader()
    me = os.getpid()
    assert child.pid in r.process_tree([me])
    assert r.process_tree([child.pid]) == {child.pid}
    mem = r.process_memory(child.pid)
    assert mem is not None
    assert mem.comm is not None and mem.comm.startswith("python")
    assert mem.anon_bytes >= 64 * MIB  # the touched bytearray is anonymous memory
    st = psutil.Process(child.pid).memory_full_info()
    assert abs(mem.anon_bytes - st.uss) < 64 * MIB  # same order as psutil's unique set
    assert r.memory_cgroup(child.pid) == r.memory_cgroup(me)


def test_sampler_and_watermarks_over_the_real_host(child: subprocess.Popen[bytes]) -> None:
    sampler = HostSampler()
    marks = Watermarks("real")
    for phase in ("a", "b"):
        marks.update(sampler.sample([child.pid]), phase=phase)
    s = marks.summary()
    assert s.samples == 2 and set(s.mem_available_min_by_phase) == {"a", "b"}
    assert s.engine_anon_peak_bytes >= 64 * MIB
    assert child.pid in marks.pids_seen
    assert s.mem_available_min_bytes is not None and s.mem_available_min_bytes > 0


def test_vanished_pid_is_skipped(child: subprocess.Popen[bytes]) -> None:
    pid = child.pid
    assert child.stdin is not None
    child.stdin.close()
    child.wait(10)
    r = ProcReader()
    assert r.process_memory(pid) is None
    assert r.process_tree([pid]) == set()
    assert HostSampler().sample([pid]).processes == ()
