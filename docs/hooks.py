"""mkdocs hook: links from the guides to files outside docs/ (the README, the notebooks) point to the repository.

In the repository the guides link those files relatively (GitHub renders them, tests/project/readme_test.py checks
them); the site holds only docs/, so there they become the repository's URLs.
"""

from __future__ import annotations

import re
from typing import Any

REPOSITORY = "https://github.com/tfbuffers/tfbuffers/blob/main/"
OUTSIDE = re.compile(r"\]\(\.\./([^)\s]+)\)")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page's Markdown with each `](../path)` link made the repository's URL of `path`."""
    return OUTSIDE.sub(lambda link: f"]({REPOSITORY}{link.group(1)})", markdown)
