"""Every reference a comment, a recipe or a rule makes to the domain record resolves inside the repository.

Code, recipes, monitoring and scripts cite the facts they encode: "DOMAIN §n" (the domain record),
seed labels ("S14c", "S11f §10.1", "seed 004 §6": the engineering records behind it), "MEASURED.md"
(facts measured on these machines) and "ARCHITECTURE" (the map of the code). Those documents live
in the repository as docs/domain.md, docs/measured.md and ARCHITECTURE.md; this test holds every
citation to a heading there. How a reference maps to a heading is written at the top of
docs/domain.md ("How references resolve") and implemented by `resolve` below.

The other way round: a citation of the project's issue tracker by number ("issue 9", "Issue 19 item 3",
"hardening 2 item 7") cannot be followed from the repository, so comments and docstrings say what
was meant instead; the last tests below hold that.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOMAIN_DOC = REPO / "docs" / "domain.md"
MEASURED_DOC = REPO / "docs" / "measured.md"
ARCHITECTURE_DOC = REPO / "ARCHITECTURE.md"

SCANNED = ("appliance", "controller", "host_setup", "recipes", "tests", "bench", "monitoring", "scripts",
           "images", "compose.yaml", "Makefile", "pyproject.toml")
SKIPPED_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules"}
THIS_FILE = Path(__file__).resolve()

# Known-wrong labels still cited, each to be fixed in the code (none now: "S8 §8" was meant as seed
# 000 chapter 一 §8 and says so since). A new wrong label fails the test below.
KNOWN_WRONG: set[str] = set()

SECTION = r"\d+(?:[.-]\d+)*"
DOMAIN_REF = re.compile(rf"\bDOMAIN(?:\.md)? §({SECTION})((?:\s*[/,]\s*§{SECTION})*)")
STEP_REF = re.compile(rf"(?<![\w#])S0*(\d{{1,2}})([a-z]\d?)?(?![\w])(?: ?§({SECTION}))?")
SEED_REF = re.compile(rf"\b[Ss]eeds? (00\d)((?:,? (?:chapter \S+ )?§{SECTION}(?:/§{SECTION})*)?)")
MEASURED_REF = re.compile(r"\bMEASURED\.md(?:'s)?(?: \"([^\"]+)\")?")
ARCH_REF = re.compile(r"\bARCHITECTURE(?:\.md)?\b(?:'s)?(?: [\"']([^\"']+)[\"'])?")
HEADING = re.compile(r"^(#{2,6}) +(.+?) *$", re.MULTILINE)


@dataclass(frozen=True)
class Ref:
    where: str   # path:line
    text: str    # the reference as cited, normalised ("DOMAIN §4", "S14c §3.12.1", "seed 004 §6")


@dataclass(frozen=True)
class Section:
    level: int
    title: str
    body: str    # the text up to the next heading of the same or a higher level


def sections(path: Path) -> list[Section]:
    text = path.read_text(encoding="utf-8")
    found = list(HEADING.finditer(text))
    out = []
    for i, m in enumerate(found):
        level = len(m.group(1))
        end = next((n.start() for n in found[i + 1:] if len(n.group(1)) <= level), len(text))
        out.append(Section(level, m.group(2), text[m.end():end]))
    return out


def scanned_files() -> Iterator[Path]:
    for name in SCANNED:
        top = REPO / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            if path.is_file() and path.resolve() != THIS_FILE and not SKIPPED_DIRS & set(path.parts):
                yield path


def references(path: Path) -> Iterator[Ref]:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return
    yield from references_in(text, str(path.relative_to(REPO)))


def references_in(text: str, name: str) -> Iterator[Ref]:
    for lineno, line in enumerate(text.splitlines(), 1):
        where = f"{name}:{lineno}"
        for m in DOMAIN_REF.finditer(line):
            for sec in [m.group(1), *re.findall(SECTION, m.group(2))]:
                yield Ref(where, f"DOMAIN §{sec}")
        for m in STEP_REF.finditer(line):
            label = f"S{int(m.group(1))}{m.group(2) or ''}"
            yield Ref(where, f"{label} §{m.group(3)}" if m.group(3) else label)
        for m in SEED_REF.finditer(line):
            qualifier = m.group(2).lstrip(", ")
            parts = [p for p in re.split(r"/(?=§)", qualifier) if p] if qualifier else [""]
            for part in parts:
                yield Ref(where, f"seed {m.group(1)} {part}".rstrip())
        for m in MEASURED_REF.finditer(line):
            yield Ref(where, f'MEASURED.md "{m.group(1)}"' if m.group(1) else "MEASURED.md")
        for m in ARCH_REF.finditer(line):
            yield Ref(where, f'ARCHITECTURE "{m.group(1)}"' if m.group(1) else "ARCHITECTURE")


def _cites(body: str, qualifier: str) -> bool:
    """The body of a seed's heading lists this cited section (`§3.7`, `chapter 一 §8`) as a whole token."""
    return re.search(re.escape(qualifier) + r"(?![\d.-]\d)", body) is not None


def resolve(ref: str, domain: list[Section], measured: list[Section], architecture: list[Section]) -> bool:
    """Whether a normalised reference names a heading (and, for a cited section, an entry under it)."""
    if m := re.fullmatch(rf"DOMAIN §({SECTION})", ref):
        number = m.group(1)
        level = 2 + number.count(".")
        return any(s.level == level and re.match(rf"{re.escape(number)}\.? ", s.title) for s in domain)
    if m := re.fullmatch(rf"(S\d+[a-z]?\d?)(?: (§{SECTION}))?", ref):
        heads = [s for s in domain if s.level == 3 and re.match(rf"{m.group(1)}(?![\w])", s.title)]
        return bool(heads) and (m.group(2) is None or any(_cites(s.body, m.group(2)) for s in heads))
    if m := re.fullmatch(r"seed (00\d)(?: (.+))?", ref):
        heads = [s for s in domain if s.level == 3 and s.title.lower().startswith(f"seed {m.group(1)} ")]
        return bool(heads) and (m.group(2) is None or any(_cites(s.body, m.group(2)) for s in heads))
    for prefix, doc in (("MEASURED.md", measured), ("ARCHITECTURE", architecture)):
        if ref == prefix:
            return bool(doc)
        if ref.startswith(f'{prefix} "'):
            quoted = ref[len(prefix) + 2:-1].lower()
            return any(quoted in s.title.lower() for s in doc)
    raise AssertionError(f"unclassified reference {ref!r}")


def all_references() -> list[Ref]:
    return [ref for path in scanned_files() for ref in references(path)]


def test_every_reference_resolves_to_a_heading() -> None:
    domain, measured, architecture = sections(DOMAIN_DOC), sections(MEASURED_DOC), sections(ARCHITECTURE_DOC)
    refs = all_references()
    assert len(refs) > 300, "the scan found too few references: is SCANNED still right?"
    broken = sorted({f"{r.where}: {r.text}" for r in refs
                     if r.text not in KNOWN_WRONG and not resolve(r.text, domain, measured, architecture)})
    assert not broken, "references that resolve to no heading in docs/domain.md, docs/measured.md or " \
                       "ARCHITECTURE.md:\n" + "\n".join(broken)


def test_known_wrong_labels_are_still_cited() -> None:
    """An allow-listed label that the code no longer cites must leave the list (it was fixed), and the
    docs must not make it resolve by accident."""
    cited = {r.text for r in all_references()}
    assert cited >= KNOWN_WRONG, f"fixed, remove from KNOWN_WRONG: {sorted(KNOWN_WRONG - cited)}"
    domain, measured, architecture = sections(DOMAIN_DOC), sections(MEASURED_DOC), sections(ARCHITECTURE_DOC)
    resolving = sorted(r for r in KNOWN_WRONG if resolve(r, domain, measured, architecture))
    assert not resolving, f"allow-listed as wrong, yet they resolve (a doc papers over them): {resolving}"


def test_mapping_rules_on_examples() -> None:
    domain = [Section(2, "4. Start-up, compile cache, warm restarts", ""),
              Section(3, "2.1 Common base", ""),
              Section(3, "S14 — TP=4 27B", "- §3.7.2 — memory"),
              Section(3, "S14c — memory recipe", ""),
              Section(3, "Seed 004 — gates", "- §5.4 — fixed first five\n- §6 — shorter outputs")]
    measured = [Section(2, "Building images here", "")]
    arch = [Section(3, "Warm-cache restart", "")]
    ok = ["DOMAIN §4", "DOMAIN §2.1", "S14", "S14 §3.7.2", "S14c", "seed 004 §6", "seed 004 §5.4", "seed 004",
          'MEASURED.md "Building images here"', "MEASURED.md", 'ARCHITECTURE "Warm-cache restart"']
    bad = ["DOMAIN §5", "DOMAIN §2.2", "S14 §3.7", "S14 §3.7.20", "S14d", "S1", "seed 004 §5", "seed 000",
           'MEASURED.md "Docker"', 'ARCHITECTURE "Failure"']
    assert [r for r in ok if not resolve(r, domain, measured, arch)] == []
    assert [r for r in bad if resolve(r, domain, measured, arch)] == []


def test_scanner_reads_citation_forms() -> None:
    line = ('DOMAIN §2/§4 (S8 §5.4, S11m), DOMAIN §3, §5; S09 §3.10.1 / S9–S14; seed 004 §5.4/§6; '
            "seed 000 chapter 一 §8; MEASURED.md's \"warm restart\"; ARCHITECTURE 'Failure'; S11a §5-3; "
            "S14b/S14d, ipS3, #S4")
    refs = [r.text for r in references_in(line, "example")]
    assert refs == ["DOMAIN §2", "DOMAIN §4", "DOMAIN §3", "DOMAIN §5", "S8 §5.4", "S11m", "S9 §3.10.1",
                    "S9", "S14", "S11a §5-3", "S14b", "S14d", "seed 004 §5.4", "seed 004 §6",
                    "seed 000 chapter 一 §8", 'MEASURED.md "warm restart"', 'ARCHITECTURE "Failure"']


# ---- tracker numbers: the tracker is not in the repository ---------------------------------------

# Where comments and docstrings are read for tracker numbers. Python files: their comments and
# docstrings only (a string the program uses is code, and its tests pin it). Every other text file
# (recipes, rules, scripts, Dockerfiles, READMEs): all of it, its comments and notes alike.
TRACKER_SCANNED = ("appliance", "controller", "host_setup", "recipes", "monitoring", "bench", "scripts",
                   "images", "compose.yaml", "Makefile")
TRACKER_REF = re.compile(r"\b[Ii]ssues? #?\d+|\b[Hh]ardening \d+|\(items? \d+")


def python_prose(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and each line of each docstring of a Python source."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            for offset, line in enumerate(first.value.value.splitlines()):
                yield first.lineno + offset, line


def tracker_citations_in(text: str, name: str) -> Iterator[Ref]:
    lines = python_prose(text) if name.endswith(".py") else enumerate(text.splitlines(), 1)
    for lineno, line in lines:
        for m in TRACKER_REF.finditer(line):
            yield Ref(f"{name}:{lineno}", m.group(0))


def tracker_scanned_files() -> Iterator[Path]:
    for name in TRACKER_SCANNED:
        top = REPO / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        yield from (p for p in paths if p.is_file() and not SKIPPED_DIRS & set(p.parts))


def test_no_comment_or_docstring_cites_the_tracker_by_number() -> None:
    found: list[Ref] = []
    scanned = 0
    for path in tracker_scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        scanned += path.suffix == ".py"
        found += tracker_citations_in(text, str(path.relative_to(REPO)))
    assert scanned > 100, "the scan read too few Python files: is TRACKER_SCANNED still right?"
    assert not found, "say what was meant, not the tracker's number (the tracker is not in the " \
                      "repository):\n" + "\n".join(f"{r.where}: {r.text}" for r in found)


def test_tracker_scanner_reads_comments_and_docstrings_not_code_strings() -> None:
    source = ('"""Module (issue 9)."""\n'
              "X = 1  # Issue 19 item 3: a trailing comment\n"
              "def f():\n"
              '    """First line.\n\n    hardening 2 item 7 on a later line."""\n'
              '    return "issue 13: a message the program prints"  # see (item 6)\n')
    refs = [(r.where, r.text) for r in tracker_citations_in(source, "example.py")]
    assert sorted(refs) == [("example.py:1", "issue 9"), ("example.py:2", "Issue 19"),
                            ("example.py:6", "hardening 2"), ("example.py:7", "(item 6")]
    assert [r.text for r in tracker_citations_in("# issue #25\nkey: 1\n", "example.yaml")] == ["issue #25"]
    assert list(tracker_citations_in("# DOMAIN §3, S14c §3.12.1, 5 items 2 GiB, tissue 4\n", "x.sh")) == []
