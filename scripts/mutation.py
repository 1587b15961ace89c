"""`make mutation`: mutmut's command line, with one change — trees are copied with their symlinks.

mutmut copies tests/ into mutants/ with `shutil.copytree`, which follows symlinks; the host fixture
trees (tests/fixtures/hosts/*/sys) hold sysfs-style links that only resolve on a real host, so the copy
fails. Keeping them as links is what the tests expect (they read the trees through gather_facts).
"""

from __future__ import annotations

import shutil
import sys
from typing import Any

_copytree = shutil.copytree


def _copytree_keeping_links(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
    if not args:
        kwargs["symlinks"] = True
    return _copytree(src, dst, *args, **kwargs)


shutil.copytree = _copytree_keeping_links

from mutmut.__main__ import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli())
