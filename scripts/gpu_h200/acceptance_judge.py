#!/usr/bin/env python3
"""Judge a GPU acceptance run (docs/gpu-h200.md): the I/O around appliance.evaluation.gpu_acceptance.judge.

    python3 scripts/gpu_h200/acceptance_judge.py DIR [--write-docs docs/gpu-h200.md] [--fixtures OUT]

DIR is what `scripts/gpu_h200/acceptance.sh` packed into accept.tgz (`accept/`): `launch-<ID>.json`
(`appliance launches ID`), `runs/<ID>/engine.log`, `gateway.jsonl`, `steps.tsv`. Prints the dated
markdown table and the verdict; exits 1 on FAIL. `--write-docs` inserts or replaces the section
`## Acceptance run YYYY-MM-DD` in that doc; `--fixtures` copies the judged inputs (redacted) into a
fixture folder (e.g. tests/fixtures/engine_logs/gpu-h200-accept-YYYY-MM-DD/, which
tests/unit/test_gpu_acceptance.py re-judges in CI).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (or .gpuwt/)

from appliance.evaluation.gpu_acceptance import (
    EXPECTED_RECIPES,
    Verdict,
    inputs_from_files,
    judge,
    redact,
    render_markdown,
    replace_section,
)

INPUT_GLOBS = ("launch-*.json", "runs/*/engine.log", "gateway.jsonl", "steps.tsv")


def read_inputs(folder: Path) -> dict[str, str]:
    """{relative path: text} of the files the judge reads in `folder`."""
    files: dict[str, str] = {}
    for pattern in INPUT_GLOBS:
        for path in sorted(folder.glob(pattern)):
            if path.is_file():
                files[path.relative_to(folder).as_posix()] = path.read_text(errors="replace")
    return files


def judge_folder(folder: Path, expected: tuple[str, ...] = EXPECTED_RECIPES) -> Verdict:
    inputs = inputs_from_files(read_inputs(folder))
    return judge(inputs.records, inputs.logs, inputs.answers, inputs.steps, expected,
                 today=time.strftime("%Y-%m-%d", time.gmtime()))


def write_fixtures(folder: Path, out: Path) -> list[Path]:
    """Copy the judged inputs of `folder`, redacted, into `out` (same layout)."""
    written = []
    for rel, text in read_inputs(folder).items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(redact(text))
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("folder", type=Path, help="the unpacked accept/ folder")
    ap.add_argument("--write-docs", type=Path, metavar="DOC", help="insert/replace '## Acceptance run DATE'")
    ap.add_argument("--fixtures", type=Path, metavar="DIR", help="copy the judged inputs (redacted) here")
    ap.add_argument("--expect", default=",".join(EXPECTED_RECIPES),
                    help="comma-separated recipes that must have launched (default: %(default)s)")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        ap.error(f"{args.folder} is not a folder")
    verdict = judge_folder(args.folder, tuple(r for r in args.expect.split(",") if r))
    print(f"## Acceptance run {verdict.date}\n")
    print(render_markdown(verdict))
    if args.write_docs:
        doc = args.write_docs.read_text() if args.write_docs.exists() else ""
        args.write_docs.write_text(replace_section(doc, verdict))
        print(f"wrote the section '## Acceptance run {verdict.date}' into {args.write_docs}")
    if args.fixtures:
        n = len(write_fixtures(args.folder, args.fixtures))
        print(f"copied {n} input files (redacted) into {args.fixtures}")
    print(f"verdict: {verdict.word}")
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
