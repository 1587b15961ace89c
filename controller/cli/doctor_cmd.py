"""`appliance doctor FILE…`: the supervisor's pure diagnosis, run over saved engine logs or dmesg text.

Operators used to read `docker logs` and `dmesg` by eye after a 27-minute start died (DOMAIN §5).
This command runs the same rules the supervisor uses (`appliance.diagnosis`) over saved text:
every signature found per file (benign ones flagged "expected on Z100, ignore"), the start-up phase
and compile-cache outcome each engine log reached (`appliance.observe.log_phases`), and one diagnosis over
all the files together — so `appliance doctor engine.log dmesg.txt` ties a "worker died" in the
engine log to the global OOM in the kernel log.

Exit codes: 0 nothing bad (benign lines only), 1 a failure or degradation signature was found,
2 an input could not be read (the other files are still examined).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from appliance.diagnosis.diagnose import Diagnosis, FailureFacts, diagnose
from appliance.diagnosis.scan import Finding, clip, gpu_events_in_kernel_text, oom_events_in_text, scan_lines
from appliance.diagnosis.signatures import Severity, severity_at_least
from appliance.observe.engine_facts import read_facts
from appliance.observe.kmsg import OomEvent
from appliance.observe.log_phases import PhaseTracker, track_text
from controller.cli.options import JsonOpt

EXIT_OK = 0
EXIT_FOUND = 1
EXIT_UNREADABLE = 2


class UnreadableInput(Exception):
    """A FILE argument that is not readable text; the message says why."""


@dataclass(frozen=True)
class FileReport:
    path: str
    findings: list[Finding]
    tracker: PhaseTracker
    oom_events: list[OomEvent]
    lines: list[str]

    def to_json(self) -> dict[str, object]:
        summary = self.tracker.summary()
        return {
            "path": self.path,
            "findings": [f.model_dump(mode="json") for f in self.findings],
            "phase": None if summary.furthest is None else summary.furthest.value,
            "progress": self.tracker.describe() if self.tracker.events else None,
            "cache_outcome": summary.cache_outcome.value,
            "startup": summary.model_dump(mode="json"),
            "engine": read_facts("\n".join(self.lines)).model_dump(mode="json", exclude_none=True),
            "oom_kills": [e.model_dump(mode="json", exclude={"lines"}) for e in self.oom_events],
        }


def read_input(name: str) -> str:
    """Text of FILE (`-` = stdin). Raises UnreadableInput with a message an operator can act on."""
    if name == "-":
        data = sys.stdin.buffer.read()
    else:
        path = Path(name)
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise UnreadableInput(f"{name}: no such file") from exc
        except IsADirectoryError as exc:
            raise UnreadableInput(f"{name}: is a directory (pass the log file itself)") from exc
        except PermissionError as exc:
            raise UnreadableInput(f"{name}: permission denied (dmesg/kmsg dumps may need root)") from exc
        except OSError as exc:
            raise UnreadableInput(f"{name}: cannot read: {exc.strerror or exc}") from exc
    if b"\x00" in data[:65536]:
        raise UnreadableInput(f"{name}: binary data, not a text log (a core dump or a compressed file?)")
    # Logs are UTF-8 with the odd broken byte (tqdm bars cut mid-character); do not refuse those.
    return data.decode("utf-8", errors="replace")


def examine(name: str, text: str) -> FileReport:
    lines = text.split("\n")
    return FileReport(
        path=name,
        findings=scan_lines(lines),
        tracker=track_text(text),
        oom_events=oom_events_in_text(lines),
        lines=lines,
    )


def overall_diagnosis(reports: list[FileReport]) -> Diagnosis:
    """One diagnosis over all files: kernel OOM kills from any of them, the phase of the last engine log."""
    lines = [line for r in reports for line in r.lines]
    events = tuple(e for r in reports for e in r.oom_events)
    gpu = tuple(gpu_events_in_kernel_text(lines))
    engine_logs = [r for r in reports if r.tracker.events]
    tracker = engine_logs[-1].tracker if engine_logs else None
    return diagnose(FailureFacts(
        log_tail=tuple(lines),
        oom_events=events,
        gpu_events=gpu,
        phase_reached=tracker.furthest if tracker else None,
        progress=tracker.describe() if tracker else None,
    ))


def exit_code_for(findings: list[Finding], unreadable: bool) -> int:
    if unreadable:
        return EXIT_UNREADABLE
    if any(severity_at_least(f.severity, Severity.WARNING) for f in findings):
        return EXIT_FOUND
    return EXIT_OK


def _print_report(report: FileReport) -> None:
    typer.echo(f"== {report.path}")
    if report.tracker.events:
        typer.echo(f"   start-up reached: {report.tracker.describe()}")
    if not report.findings:
        typer.echo("   no known signature")
    for f in report.findings:
        times = f" ×{f.count}" if f.count > 1 else ""
        tag = "ok  " if f.benign else f"{f.severity.value:<7}"
        typer.echo(f"   [{tag}] {f.code.value}{times} (line {f.first_line_no}): {f.summary}")
        typer.echo(f"             → {f.hint}")
        if not f.benign:
            typer.echo(f"             {clip(f.evidence[0], 220)}")


def _print_diagnosis(d: Diagnosis) -> None:
    retry = "retryable" if d.retryable else "NOT retryable: fix first"
    typer.echo("")
    typer.echo(f"DIAGNOSIS {d.code.value} ({d.severity.value}, {retry})")
    typer.echo(f"   {d.summary}")
    typer.echo(f"   action: {d.hint}")
    typer.echo(f"   fact:   {d.fact}")
    for line in d.evidence[:5]:
        typer.echo(f"   > {clip(line, 220)}")


def doctor(
    files: Annotated[
        list[str],
        typer.Argument(metavar="FILE...", help="Saved engine logs or dmesg/kmsg text; '-' reads stdin."),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Diagnose saved engine logs and kernel logs with the supervisor's rules (DOMAIN §5).

    Exit code 0 when nothing bad is found, 1 when a failure signature is, 2 when an input is unreadable.
    """
    reports: list[FileReport] = []
    errors: list[str] = []
    for name in files:
        try:
            reports.append(examine(name, read_input(name)))
        except UnreadableInput as exc:
            errors.append(str(exc))
    all_findings = [f for r in reports for f in r.findings]
    code = exit_code_for(all_findings, unreadable=bool(errors))
    diagnosis = overall_diagnosis(reports) if reports else None
    bad = any(severity_at_least(f.severity, Severity.WARNING) for f in all_findings)

    if as_json:
        typer.echo(json.dumps({
            "files": [r.to_json() for r in reports],
            "unreadable": errors,
            "diagnosis": (
                diagnosis.model_dump(mode="json", exclude={"findings"}) if diagnosis and bad else None
            ),
            "exit_code": code,
        }, indent=2))
    else:
        for report in reports:
            _print_report(report)
        if diagnosis is not None and bad:
            _print_diagnosis(diagnosis)
        elif reports:
            typer.echo("")
            typer.echo("no failure signature found")
        for message in errors:
            typer.echo(f"doctor: {message}", err=True)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add `appliance doctor` to the `appliance` app."""
    app.command("doctor")(doctor)
