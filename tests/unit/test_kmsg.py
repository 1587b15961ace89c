"""Kernel log records and every OOM form, over fixture text (tests/fixtures/kmsg/README.md says
which files are real captures and which are composed from the kernel's format strings)."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
from pathlib import Path

import pytest

from appliance.observe.kmsg import (
    KmsgRecord,
    OomAssembler,
    OomEvent,
    OomEventKind,
    OomScope,
    SeqGap,
    SequenceTracker,
    oom_events,
    parse_oom_line,
    parse_record,
    parse_stream,
)
from controller.watch.kmsg_follower import KmsgFollower, KmsgOverrun

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kmsg"
ID = "3f1c9a7be0d24c56a8e1f2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"
REAL_ID = "f90dce4547d80006ce3231b0f64500bc520ca75fbd45946e1c1e55269bdf3273"


def events_of(name: str) -> list[OomEvent]:
    return oom_events(parse_stream((FIX / name).read_text()))


# --- records ------------------------------------------------------------------------------------


def test_record_header_fields() -> None:
    rec = parse_record("3,467,234772609,-;Memory cgroup out of memory: Killed process 5582 (tail)\n")
    assert rec == KmsgRecord(
        facility=0, level=3, seq=467, ts_usec=234772609, flags="-",
        message="Memory cgroup out of memory: Killed process 5582 (tail)",
    )


def test_record_facility_and_extra_header_fields() -> None:
    # prio 14 = facility 1 (user) level 6; newer kernels may append fields after flags
    rec = parse_record(b"14,9,100,c,caller=T42;hello")
    assert rec is not None
    assert (rec.facility, rec.level, rec.flags, rec.message) == (1, 6, "c", "hello")


def test_record_continuation_lines_become_fields() -> None:
    raw = (
        "6,197,98283,-;acpi PNP0A08:00: _OSC: OS supports [ASPM]\n"
        " SUBSYSTEM=acpi\n DEVICE=+acpi:PNP0A08:00\n"
    )
    rec = parse_record(raw)
    assert rec is not None
    assert rec.fields == {"SUBSYSTEM": "acpi", "DEVICE": "+acpi:PNP0A08:00"}
    assert rec.message == "acpi PNP0A08:00: _OSC: OS supports [ASPM]"


def test_record_unescapes_kernel_escapes() -> None:
    rec = parse_record(r"6,1,1,-;tab\x09here back\x5cslash caf\xc3\xa9")
    assert rec is not None
    assert rec.message == "tab\there back\\slash café"


@pytest.mark.parametrize(
    "garbage",
    ["", "no header at all", "6,x,1,-;bad seq", "6,1,1,-", ";only message", "\x00\xff\xfe", "1,2;short",
     "-1,2,3,-;negative prio"],
)
def test_garbage_records_are_none(garbage: str) -> None:
    assert parse_record(garbage) is None


def test_stream_with_continuations_gap_and_garbage() -> None:
    recs = list(parse_stream((FIX / "continuation_gap_garbage.txt").read_text()))
    seqs = [r.seq for r in recs]
    assert seqs == [195, 196, 197, 198, 199, 200, 201, 202, 206, 207, 208, 209, 210, 211, 212]
    assert recs[2].fields == {"SUBSYSTEM": "acpi", "DEVICE": "+acpi:PNP0A08:00"}
    assert recs[-1].fields["DEVICE"] == "+pci:0000:00:03.0"
    tracker = SequenceTracker()
    gaps = [g for g in (tracker.observe(s) for s in seqs) if g is not None]
    assert gaps == [SeqGap(expected=203, got=206)]
    assert gaps[0].lost == 3
    assert oom_events(recs) == []


def test_sequence_going_backwards_restarts_without_a_gap() -> None:
    t = SequenceTracker()
    assert [t.observe(s) for s in (10, 11, 3, 4, 6)] == [None, None, None, None, SeqGap(expected=5, got=6)]


# --- every OOM form -----------------------------------------------------------------------------


def test_real_memcg_oom_from_this_machine() -> None:
    (ev,) = events_of("memcg_v1_kernel_6.18_docker.txt")
    assert ev.kind is OomEventKind.KILL
    assert ev.scope is OomScope.CGROUP
    assert ev.constraint == "CONSTRAINT_MEMCG"
    assert (ev.pid, ev.task) == (5582, "tail")
    assert ev.anon_rss_bytes == 32384 * 1024
    assert ev.file_rss_bytes == 1328 * 1024
    assert ev.total_vm_bytes == 34504 * 1024
    assert ev.oom_memcg == ev.task_memcg == f"/docker/{REAL_ID}"
    assert ev.cpuset == REAL_ID
    assert ev.reason == "Memory cgroup out of memory"
    assert (ev.trigger_task, ev.gfp_mask, ev.order) == ("tail", "0xcc0", 0)
    assert (ev.seq, ev.ts_usec) == (467, 234772609)
    assert ev.lines[0].startswith("tail invoked oom-killer")
    assert ev.lines[-1].startswith("Memory cgroup out of memory: Killed process 5582")


def test_global_oom_tp4_graph_and_its_reaper() -> None:
    kill, reaped = events_of("global_oom_5.15_cgroup2_tp4_graph.txt")
    assert kill.kind is OomEventKind.KILL and kill.scope is OomScope.GLOBAL
    assert kill.constraint == "CONSTRAINT_NONE"
    assert kill.oom_memcg is None
    assert kill.task_memcg == f"/system.slice/docker-{ID}.scope"
    assert (kill.pid, kill.task) == (412879, "VLLM::Worker_TP")
    assert round(kill.anon_rss_bytes / 1024**3, 2) == 6.76  # type: ignore[operator]  # DOMAIN §3 victim
    assert kill.reason == "Out of memory"
    assert reaped.kind is OomEventKind.REAPED
    assert (reaped.pid, reaped.anon_rss_bytes) == (412879, 0)
    # the reaper line inherits what the kill line knew
    assert reaped.scope is OomScope.GLOBAL and reaped.task_memcg == kill.task_memcg


def test_summary_keys_in_any_order_and_bitmaps_with_commas() -> None:
    (ev,) = events_of("memcg_reordered_keys.txt")
    assert ev.scope is OomScope.CGROUP
    assert (ev.pid, ev.task, ev.uid) == (77123, "python3", 1000)
    assert ev.oom_memcg == ev.task_memcg == f"/docker/{ID}"
    assert ev.cpuset == "/"
    line = parse_oom_line(ev.lines[1])
    assert line is not None
    assert line.values["nodemask"] == "0-1,3"  # type: ignore[union-attr]
    assert line.values["mems_allowed"] == "0-1,3"  # type: ignore[union-attr]


def test_pre_4_19_memcg_task_in_and_sacrifice() -> None:
    kill, reaped = events_of("memcg_4.9_task_in_sacrifice.txt")
    assert kill.scope is OomScope.CGROUP
    assert kill.constraint is None  # no summary line before 4.19
    assert (kill.pid, kill.task, kill.score) == (20511, "python", 1000)
    assert kill.task_memcg == kill.oom_memcg == f"/docker/{ID}"
    assert kill.anon_rss_bytes == 5112288 * 1024
    assert kill.reason == "Memory cgroup out of memory"  # from the "Kill process" line
    assert reaped.kind is OomEventKind.REAPED and reaped.scope is OomScope.CGROUP


def test_old_global_sacrifice_child_reports_the_killed_child() -> None:
    (ev,) = events_of("global_3.10_sacrifice_child.txt")
    assert ev.scope is OomScope.GLOBAL
    assert (ev.pid, ev.task, ev.score) == (2401, "java-child", 924)
    assert ev.trigger_task == "java" and ev.gfp_mask == "0x201da"


def test_kill_line_alone_still_says_global() -> None:
    (ev,) = events_of("global_rate_limited_kill_only.txt")
    assert ev.scope is OomScope.GLOBAL
    assert (ev.pid, ev.task) == (4242, "VLLM::EngineCor")
    assert ev.trigger_task is None


@pytest.mark.parametrize(
    ("message", "pid", "task", "anon_kb", "uid"),
    [
        # RHEL 6 (2.6.32) form
        ("Killed process 2398, UID 500, (java) total-vm:9832920kB, anon-rss:7339820kB, file-rss:0kB",
         2398, "java", 7339820, 500),
        # 4.9: no prefix, shmem-rss present
        ("Killed process 20511 (python) total-vm:9200496kB, anon-rss:5112288kB, file-rss:0kB, shmem-rss:0kB",
         20511, "python", 5112288, None),
        # comm with spaces and parentheses
        ("Out of memory: Killed process 7 (a (b) c) total-vm:10kB, anon-rss:5kB, file-rss:0kB, "
         "shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:-1000", 7, "a (b) c", 5, 0),
    ],
)
def test_killed_line_variants(message: str, pid: int, task: str, anon_kb: int, uid: int | None) -> None:
    (ev,) = OomAssembler().feed_message(message)
    assert (ev.pid, ev.task, ev.anon_rss_bytes, ev.uid) == (pid, task, anon_kb * 1024, uid)


def test_oom_kill_allocating_task_prefix_is_global() -> None:
    (ev,) = OomAssembler().feed_message(
        "Out of memory (oom_kill_allocating_task): "
        "Killed process 9 (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB"
    )
    assert ev.scope is OomScope.GLOBAL


@pytest.mark.parametrize(
    ("constraint", "scope"),
    [("CONSTRAINT_CPUSET", OomScope.CPUSET), ("CONSTRAINT_MEMORY_POLICY", OomScope.MEMPOLICY)],
)
def test_node_constrained_ooms(constraint: str, scope: OomScope) -> None:
    a = OomAssembler()
    a.feed_message(f"oom-kill:constraint={constraint},nodemask=1,cpuset=/,mems_allowed=1,global_oom,"
                   "task_memcg=/,task=x,pid=9,uid=0")
    (ev,) = a.feed_message("Out of memory: Killed process 9 (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB")
    assert ev.scope is scope


def test_header_without_kill_line_is_flushed_by_next_episode_and_at_end() -> None:
    a = OomAssembler()
    assert a.feed_message("a invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0") == []
    assert a.feed_message("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
                          "global_oom,task_memcg=/user.slice,task=big,pid=31,uid=0") == []
    assert a.pending_has_victim
    (ev,) = a.feed_message("b invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0")
    assert (ev.pid, ev.task, ev.scope) == (31, "big", OomScope.GLOBAL)
    assert ev.seq is None
    assert a.flush() == []  # the second episode named no victim


@pytest.mark.parametrize(
    "line",
    [
        "oom-kill:",
        "oom-kill:,,,",
        "x invoked oom-killer",
        "Killed process abc (x)",
        "Kill process 1 (x) score lots or sacrifice child",
        "oom_reaper: reaped process (x)",
        "Task in killed as a result of limit of",
        "random text mentioning Out of memory and oom_reaper",
        "\x00\x01garbage",
    ],
)
def test_malformed_oom_lines_are_ignored(line: str) -> None:
    a = OomAssembler()
    assert a.feed_message(line) == []
    assert a.flush() == []


def test_unrelated_kernel_text_produces_nothing() -> None:
    recs = list(parse_stream((FIX / "memcg_v1_kernel_6.18_docker.txt").read_text()))
    unrelated = [r for r in recs if "docker0" in r.message or "veth" in r.message]
    assert unrelated and oom_events(unrelated) == []


# --- the follower over a fake source (the declared seam: KmsgSource) -----------------------------


class FakeSource:
    """Yields scripted reads: bytes records, None for EAGAIN, an exception for EPIPE."""

    def __init__(self, script: list[bytes | BaseException | None]) -> None:
        self.script = list(script)
        self._r, self._w = os.pipe()  # a real fd so the asyncio driver can poll something

    def fileno(self) -> int:
        return self._r

    def read_record(self) -> bytes | None:
        if not self.script:
            return None
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


def _records(name: str) -> list[bytes]:
    out: list[bytes] = []
    for line in (FIX / name).read_text().splitlines(keepends=True):
        if line.startswith(" ") and out:
            out[-1] += line.encode()
        else:
            out.append(line.encode())
    return out


def test_follower_reports_events_gaps_and_overruns() -> None:
    recs = _records("memcg_v1_kernel_6.18_docker.txt")
    # lose records 400..409 to an overrun (EPIPE) in the middle of the call trace
    script: list[bytes | BaseException | None] = [
        r for r in recs if not (400 <= int(r.split(b",")[1]) <= 409)
    ]
    script.insert(38, KmsgOverrun(os.strerror(errno.EPIPE)))
    script.insert(5, b"garbage that is not a record\n")
    events: list[OomEvent] = []
    gaps: list[SeqGap] = []
    src = FakeSource(script)
    follower = KmsgFollower(src, events.append, on_gap=gaps.append)
    returned = follower.drain()
    src.close()
    assert returned == events
    assert [(e.pid, e.task, e.scope) for e in events] == [(5582, "tail", OomScope.CGROUP)]
    assert gaps == [SeqGap(expected=400, got=410)]
    assert follower.overruns == 1 and follower.unparsed == 1


def test_follower_async_run_flushes_a_stale_episode_and_stops() -> None:
    header = [
        b"4,1,10,-;x invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n",
        b"6,2,11,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        b"oom_memcg=/docker/" + ID.encode() + b",task_memcg=/docker/" + ID.encode()
        + b",task=x,pid=77,uid=0\n",
    ]
    src = FakeSource(list(header))
    events: list[OomEvent] = []

    async def main() -> None:
        stop = asyncio.Event()
        follower = KmsgFollower(src, events.append)
        task = asyncio.create_task(follower.run(stop))
        for _ in range(100):
            if events:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    src.close()
    assert [(e.pid, e.scope, e.task_memcg) for e in events] == [(77, OomScope.CGROUP, f"/docker/{ID}")]


def test_a_consumer_failing_on_one_event_does_not_end_the_follow() -> None:
    # The controller's consumer writes the OOM to the launch store; a write that raised went out of
    # drain() and ended the follower: every later OOM kill of the run went unseen.
    records = _records("memcg_v1_kernel_6.18_docker.txt")
    src = FakeSource([*records, *records])  # the same episode twice (a second kill later)
    seen: list[OomEvent] = []

    def consumer(event: OomEvent) -> None:
        seen.append(event)
        if len(seen) == 1:
            raise sqlite3.OperationalError("database is locked")

    follower = KmsgFollower(src, consumer)
    returned = follower.drain()
    src.close()
    assert len(seen) == len(returned) == 2 and follower.failed_events == 1
