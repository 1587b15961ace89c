"""The journal of host changes: what `apply` did, so `revert` can undo exactly that, even after a
controller restart or on another day.

One JSON file (`paths().host_changes` by default), rewritten atomically. An entry is written
*before* its change is made (status `applying`) and marked `applied` after: if apply dies half
way, revert still knows what might have been touched, and every revert step tolerates a change
that was only partly made. The first original wins: applying again (or applying a second recipe)
never overwrites the value the host had before the appliance touched it, so revert always goes
back to the operator's state, not to an intermediate one of ours.

A journal belongs to one host root: revert refuses a journal written for another root, so a
fixture tree's changes can never be "reverted" on the real host.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from host_setup.files import atomic_write
from host_setup.model import Action, Area, Frozen, HostSetupError, Undo


class JournalEntry(Frozen):
    id: str
    area: Area
    recipe: str | None
    status: Literal["applying", "applied"]
    first_applied_at: datetime
    last_applied_at: datetime
    action: Action
    undo: Undo


class JournalFile(Frozen):
    version: Literal[1] = 1
    host_root: str
    entries: tuple[JournalEntry, ...] = Field(default=())


class Journal:
    def __init__(self, path: Path, host_root: Path) -> None:
        self.path = path
        self.host_root = str(host_root)

    def load(self) -> JournalFile:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return JournalFile(host_root=self.host_root)
        try:
            data = JournalFile.model_validate_json(text)
        except ValidationError as exc:
            raise HostSetupError(
                f"the host change journal {self.path} is unreadable ({exc.error_count()} errors): "
                "fix or move it aside; revert cannot know what to undo without it"
            ) from exc
        if data.host_root != self.host_root:
            raise HostSetupError(
                f"the journal {self.path} records changes to host root {data.host_root}, "
                f"not {self.host_root}: "
                "pass the matching --host-root (or --journal for this root)"
            )
        return data

    def entries(self, areas: Iterable[Area] | None = None) -> tuple[JournalEntry, ...]:
        wanted = set(areas) if areas is not None else None
        return tuple(e for e in self.load().entries if wanted is None or e.area in wanted)

    def get(self, entry_id: str) -> JournalEntry | None:
        return next((e for e in self.load().entries if e.id == entry_id), None)

    def begin(
        self, entry_id: str, area: Area, recipe: str | None, action: Action, undo: Undo
    ) -> JournalEntry:
        """Record a change about to be made; an existing entry keeps its original undo record."""
        now = datetime.now(UTC)
        current = self.load()
        old = next((e for e in current.entries if e.id == entry_id), None)
        entry = JournalEntry(
            id=entry_id,
            area=area,
            recipe=recipe,
            status="applying",
            first_applied_at=old.first_applied_at if old else now,
            last_applied_at=now,
            action=action,
            undo=old.undo if old else undo,
        )
        self._save(current, replace=entry)
        return entry

    def mark_applied(self, entry_id: str) -> None:
        current = self.load()
        entry = next(e for e in current.entries if e.id == entry_id)
        self._save(current, replace=entry.model_copy(update={"status": "applied"}))

    def remove(self, entry_id: str) -> None:
        current = self.load()
        kept = tuple(e for e in current.entries if e.id != entry_id)
        self._write(current.model_copy(update={"entries": kept}))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the journal for a whole apply/revert: two of them at once would interleave their records."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with lock_path.open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise HostSetupError(
                    f"another `appliance host apply/revert` holds {lock_path}; wait for it to finish"
                ) from None
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _save(self, current: JournalFile, replace: JournalEntry) -> None:
        entries = [e for e in current.entries if e.id != replace.id]
        position = next((i for i, e in enumerate(current.entries) if e.id == replace.id), len(entries))
        entries.insert(position, replace)
        self._write(current.model_copy(update={"entries": tuple(entries)}))

    def _write(self, data: JournalFile) -> None:
        atomic_write(self.path, data.model_dump_json(indent=2) + "\n", mode=0o600)
