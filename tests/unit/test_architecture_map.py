"""The maps check themselves: every module of appliance/ and controller/ is named in ARCHITECTURE.md
(in backticks) or in its package's ``__init__`` docstring, the package's own map. A module added
without a line in either fails here, as a citation of a missing heading fails test_doc_references."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = (ROOT / "ARCHITECTURE.md").read_text()


def _named_in_backticks(stem: str, text: str) -> bool:
    return re.search(r"`[^`\n]*\b" + re.escape(stem) + r"(\.py)?\b[^`\n]*`", text) is not None


def _named_in_words(stem: str, text: str) -> bool:
    return re.search(r"\b" + re.escape(stem) + r"\b", text) is not None


def unmapped(root: Path = ROOT, architecture: str = ARCHITECTURE) -> list[str]:
    missing = []
    for top in ("appliance", "controller"):
        for path in sorted((root / top).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            init = path.parent / "__init__.py"
            package_map = ""
            if init.exists():
                package_map = ast.get_docstring(ast.parse(init.read_text())) or ""
            if _named_in_backticks(path.stem, architecture) or _named_in_words(path.stem, package_map):
                continue
            missing.append(path.relative_to(root).as_posix())
    return missing


def test_every_module_is_on_a_map() -> None:
    missing = unmapped()
    assert not missing, (
        "modules on no map — name each in ARCHITECTURE.md (in backticks) or in its package's "
        f"__init__ docstring: {missing}"
    )


def test_a_module_on_no_map_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "controller" / "things"
    pkg.mkdir(parents=True)
    (tmp_path / "appliance").mkdir()
    (pkg / "__init__.py").write_text('"""Things: ``mapped`` does one thing."""\n')
    (pkg / "mapped.py").write_text("")
    (pkg / "listed.py").write_text("")
    (pkg / "forgotten.py").write_text("")
    assert unmapped(tmp_path, "the `listed.py` module") == ["controller/things/forgotten.py"]
