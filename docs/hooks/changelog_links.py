"""MkDocs hook: the changelog's links to docs pages work on GitHub and in the site.

CHANGELOG.md lives at the repository root and docs/changelog.md is a symlink to it, so one text
serves two places. On GitHub a link is relative to the root (`docs/guides/evaluation.md`); in the
site the page sits in docs/, where that page is `guides/evaluation.md`. The changelog keeps the
GitHub form and this hook drops the `docs/` prefix of its inline links before the site renders
them. The rewritten links are still checked: a link to a missing page or anchor is a warning,
and `mkdocs build --strict` fails on it (tests/test_docs.py). Files outside docs/ have no page in
the site: name them in backticks, not as links.
"""

import re

_DOCS_LINK = re.compile(r"(\]\()docs/")


def on_page_markdown(markdown, page, **kwargs):
    if page.file.src_uri != "changelog.md":
        return markdown
    return _DOCS_LINK.sub(r"\1", markdown)
