#!/usr/bin/env python3
"""Judge a same-card blue/green run (docs/gpu-h200.md): the I/O around appliance.evaluation.samecard_switch.

    python3 scripts/gpu_h200/samecard_judge.py DIR

DIR is what `scripts/gpu_h200/samecard.sh` packed into samecard.tgz (`samecard/`): `launch-<ID>.json`
(`appliance launches ID --json`) and `client.json` (switch_load.py). Prints the verdict and the
figures; exits 1 on FAIL. tests/unit/test_samecard_switch_judge.py judges a fixture folder the same way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (or .gpuwt/)

from appliance.evaluation.samecard_switch import SameCardVerdict, inputs_from_files, judge, render_text

INPUT_GLOBS = ("launch-*.json", "client.json")


def read_inputs(folder: Path) -> dict[str, str]:
    """{relative path: text} of the files the judge reads in `folder`."""
    files: dict[str, str] = {}
    for pattern in INPUT_GLOBS:
        for path in sorted(folder.glob(pattern)):
            if path.is_file():
                files[path.relative_to(folder).as_posix()] = path.read_text(errors="replace")
    return files


def judge_folder(folder: Path) -> SameCardVerdict:
    records, client = inputs_from_files(read_inputs(folder))
    return judge(records, client)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("folder", type=Path, help="the unpacked samecard/ folder")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        ap.error(f"{args.folder} is not a folder")
    verdict = judge_folder(args.folder)
    print(render_text(verdict))
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
