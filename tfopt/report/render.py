"""Rendering the report's blocks (:mod:`tfopt.report.content`) as markdown and as one self-contained HTML file.

The HTML file needs nothing beside it: images are inlined as base64 ``data:`` URIs and the style
sheet is in the page, so it can be mailed or attached to a CI run as is.
"""

from __future__ import annotations

import base64
import html as html_lib
import re
from collections.abc import Mapping, Sequence

from tfopt.core.tables import markdown_table

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")


_MD_SPECIAL = re.compile(r"([\\`<\[\]|])")
_MD_CODE = re.compile(r"(`[^`\n]+`)")


def _md_text(text: str, cell: bool = False) -> str:
    """Markdown for text that holds names taken from runs and models: only its code spans stay markup.

    Outside ```code``` spans, what makes HTML, links, images or table cells (``<``, ``[``, ``]``,
    ``|``, a backtick, a backslash) is backslash-escaped, so a run named ``<img src=x onerror=...>``
    or ``[x](http://...)`` shows as text; a code span's content is literal in markdown already (in
    a table ``cell``, its ``|`` is escaped too, as GitHub's tables need).
    """
    parts = _MD_CODE.split(str(text).replace("\n", " "))
    return "".join(
        (p.replace("|", "\\|") if cell else p) if i % 2 else _MD_SPECIAL.sub(r"\\\1", p)
        for i, p in enumerate(parts)
    )


def _md_cell(text: str) -> str:
    return _md_text(text, cell=True)


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in ``text`` (the text cannot close it)."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def markdown(items: Sequence[dict]) -> str:
    """GitHub-flavoured markdown; images are referenced by their file name (they sit beside report.md)."""
    out: list[str] = []
    for b in items:
        t = b["type"]
        if t in ("h1", "h2", "h3"):
            out.append("#" * int(t[1]) + " " + _md_text(b["text"]))
        elif t == "p":
            out.append(_md_text(b["text"]))
        elif t == "callout":
            out.append("\n>\n".join("> " + _md_text(item) for item in b["items"]))
        elif t == "list":
            out.append("\n".join(f"- {_md_text(item)}" for item in b["items"]))
        elif t == "table":
            if b["rows"]:
                out.append(
                    markdown_table(
                        [_md_cell(h) for h in b["header"]],
                        [[_md_cell(c) for c in r] for r in b["rows"]],
                    )
                )
            else:
                out.append("(no rows)")
            if b.get("note"):
                out.append(f"<sub>{_md_text(b['note'])}</sub>")
        elif t == "img":
            out.append(f"![{_md_text(b['alt'])}]({b['file']})")
        elif t == "toc":
            continue
        elif t == "pre":
            fence = _fence(b["text"])
            out.append(
                f"<details><summary>{html_lib.escape(b['summary'], quote=False)}</summary>\n\n{fence}text\n"
                f"{b['text']}\n{fence}\n\n</details>"
            )
        else:
            raise ValueError(f"unknown block type {t!r}")
    return "\n\n".join(out) + "\n"


def _inline(text: str) -> str:
    """Escapes ``text`` for HTML, then turns ``**bold**`` and ```code``` into tags."""
    escaped = html_lib.escape(str(text), quote=False)
    escaped = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", escaped)
    return _BOLD.sub(lambda m: f"<strong>{m.group(1)}</strong>", escaped)


_STATUS = {
    "PASS": "pass",
    "pass": "pass",
    "MISS": "miss",
    "FAIL": "miss",
    "n/a": "na",
    "not judged": "na",
    "chosen": "pass",
}

CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --band: #f6f8fa; --accent: #0969da;
        --good: #1a7f37; --bad: #cf222e; --chosen: #fff8c5; }
* { box-sizing: border-box; }
body { font: 15px/1.5 -apple-system, "Segoe UI", "Noto Sans", Helvetica, Arial, sans-serif; color: var(--fg);
       margin: 0; background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 1.8em; margin: 0.2em 0 0.3em; border-bottom: 1px solid var(--line); padding-bottom: 0.3em; }
h2 { font-size: 1.35em; margin: 1.8em 0 0.6em; border-bottom: 1px solid var(--line); padding-bottom: 0.25em; }
h3 { font-size: 1.1em; margin: 1.3em 0 0.5em; }
p { margin: 0.5em 0; }
code { font: 0.9em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: var(--band);
       padding: 0.1em 0.35em; border-radius: 4px; }
.meta { color: var(--muted); font-size: 0.9em; }
.callout { background: #ddf4ff; border: 1px solid #54aeff66; border-left: 4px solid var(--accent);
           border-radius: 6px; padding: 10px 16px; margin: 14px 0; }
.callout p { margin: 0.35em 0; }
.scroll { overflow-x: auto; margin: 10px 0 4px; }
table { border-collapse: collapse; font-size: 13px; width: auto; min-width: 50%; }
th, td { border: 1px solid var(--line); padding: 4px 9px; text-align: left; vertical-align: top; }
th { background: var(--band); font-weight: 600; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr:nth-child(even) td { background: #fbfcfd; }
tr.chosen td { background: var(--chosen); font-weight: 600; }
tr.keras td { color: var(--muted); font-style: italic; }
td.pass { color: var(--good); font-weight: 700; }
td.miss { color: var(--bad); font-weight: 700; }
td.na { color: var(--muted); }
.note { color: var(--muted); font-size: 12.5px; margin: 2px 0 12px; max-width: 1100px; }
figure { margin: 12px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
figcaption { color: var(--muted); font-size: 12.5px; }
details { margin: 8px 0; }
summary { cursor: pointer; color: var(--accent); }
pre { background: var(--band); border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px;
      font: 12px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; overflow-x: auto;
      white-space: pre-wrap; word-break: break-word; max-height: 480px; }
ul { margin: 0.4em 0; padding-left: 1.4em; }
nav.toc { margin: 18px 0 4px; font-size: 0.92em; color: var(--muted); }
nav.toc a { color: var(--accent); text-decoration: none; }
nav.toc a:hover { text-decoration: underline; }
"""


def _anchor(text: str) -> str:
    # "s-" keeps section ids apart from table ids (a table and its section share a name)
    return "s-" + re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _table_html(b: dict) -> str:
    numeric = b.get("numeric") or [False] * len(b["header"])
    head = "".join(f"<th>{_inline(h)}</th>" for h in b["header"])
    body = []
    for row, cls in zip(b["rows"], b.get("row_classes") or [""] * len(b["rows"])):
        cells = []
        for i, c in enumerate(row):
            classes = [
                k
                for k in (
                    ("num" if i < len(numeric) and numeric[i] else ""),
                    _STATUS.get(str(c), ""),
                )
                if k
            ]
            attr = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{attr}>{_inline(c)}</td>")
        body.append(f"<tr{f' class={chr(34)}{cls}{chr(34)}' if cls else ''}>{''.join(cells)}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(b["header"])}">(no rows)</td></tr>')
    note = f'<p class="note">{_inline(b["note"])}</p>' if b.get("note") else ""
    return (
        f'<div class="scroll"><table id="{html_lib.escape(b["id"])}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>{note}"
    )


def html(items: Sequence[dict], images: Mapping[str, bytes]) -> str:
    """One self-contained HTML page: inline CSS, images as base64 PNG data URIs.

    Args:
        items: The blocks (:func:`tfopt.report.content.blocks`).
        images: Image key -> PNG bytes (an ``img`` block whose key is missing is left out).
    """
    title = next((b["text"] for b in items if b["type"] == "h1"), "report")
    parts: list[str] = []
    first_p = True
    heads = [(b["text"], _anchor(b["text"])) for b in items if b["type"] == "h2"]
    for b in items:
        t = b["type"]
        if t in ("h1", "h2", "h3"):
            parts.append(f'<{t} id="{_anchor(b["text"])}">{_inline(b["text"])}</{t}>')
        elif t == "p":
            cls = ' class="meta"' if first_p else ""
            first_p = False
            parts.append(f"<p{cls}>{_inline(b['text'])}</p>")
        elif t == "callout":
            parts.append(
                '<div class="callout">'
                + "".join(f"<p>{_inline(i)}</p>" for i in b["items"])
                + "</div>"
            )
        elif t == "list":
            parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b["items"]) + "</ul>")
        elif t == "toc":
            parts.append(
                '<nav class="toc">'
                + " · ".join(f'<a href="#{a}">{_inline(text)}</a>' for text, a in heads)
                + "</nav>"
            )
        elif t == "table":
            parts.append(_table_html(b))
        elif t == "img":
            png = images.get(b["key"])
            if png is None:
                continue
            data = base64.b64encode(png).decode("ascii")
            parts.append(
                f'<figure><img alt="{html_lib.escape(b["alt"])}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_inline(b['alt'])}</figcaption></figure>"
            )
        elif t == "pre":
            parts.append(
                f"<details><summary>{_inline(b['summary'])}</summary><pre>{html_lib.escape(b['text'])}</pre>"
                "</details>"
            )
        else:
            raise ValueError(f"unknown block type {t!r}")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html_lib.escape(title)}</title><style>{CSS}</style></head>\n<body><main>\n"
        + "\n".join(parts)
        + "\n</main></body></html>\n"
    )
