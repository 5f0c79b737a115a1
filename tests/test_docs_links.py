"""Every relative link of the README and the guides leads somewhere: the file exists, the heading too."""

import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "docs/*.md", "pipelines/*.md", "notebooks/*.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: str) -> set[str]:
    """The anchors GitHub gives the headings of a markdown file (code blocks left out)."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#{1,6} (.+)$", text, re.M)
    }


def broken_links(path: str) -> list[str]:
    """The relative links in ``path`` whose file or heading does not exist."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto: ...: not checked offline
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(dest):
            out.append(f"{target} (no such file)")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            out.append(f"{target} (no such heading)")
    return out


def test_every_relative_link_resolves():
    files = sorted({p for pattern in DOCS for p in glob.glob(os.path.join(REPO, pattern))})
    assert len(files) >= 10, files
    broken = {os.path.relpath(p, REPO): b for p in files if (b := broken_links(p))}
    assert broken == {}, broken


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Top: part\n\n## Two words\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#top-part) [ok](a.md#two-words) [ok](#local) [web](https://x.y/z)\n"
        "[bad](a.md#nowhere) [gone](c.md)\n\n## Local\n```\n[in code](d.md)\n```\n"
    )
    assert broken_links(str(tmp_path / "b.md")) == [
        "a.md#nowhere (no such heading)",
        "c.md (no such file)",
    ]
