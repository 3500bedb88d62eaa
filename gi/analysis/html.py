"""The one HTML writer of the output directories (docs/usage.md, "Configs and outputs"): ``report.html`` of
``gi run`` / ``gi attack`` / ``result.save`` (built in :mod:`gi.analysis.outputs`) and of the tables of
``gi ablate``, ``gi defend`` and ``gi bench`` (:func:`write_table_report`).

A page is self-contained: plain HTML with inline CSS, every image a base64 ``data:`` URI, no script and no
external resource; its Content-Security-Policy (:data:`CSP`) lets the browser load nothing else, so the file opens
from disk or a mail attachment alone. Every string that reaches the page goes through :func:`text`
(``html.escape``): configs, captures and labels are untrusted input. Pages are built from :func:`page`,
:func:`section`, :func:`paragraph`, :func:`table`, :func:`image` and :func:`preformatted`; nothing else writes
markup."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gi.analysis.report import format_cell

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"  # no script, no network, no file
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STYLE = """
body { font-family: system-ui, sans-serif; color: #222; max-width: 72rem; margin: 1.5rem auto; padding: 0 1rem; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
table { border-collapse: collapse; font-size: .8rem; margin: .4rem 0; }
th, td { border: 1px solid #ccc; padding: .15rem .45rem; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
.verdict { background: #fff8e1; border-left: 4px solid #f0b400; padding: .5rem .8rem; }
figure { display: inline-block; margin: .3rem; text-align: center; vertical-align: top; }
figcaption { font-size: .75rem; max-width: 14rem; white-space: pre-line; }
img.pixels { width: 96px; height: 96px; image-rendering: pixelated; border: 1px solid #ccc; }
figure.plot { max-width: 47%; } img.plot { max-width: 100%; }
p.caption { font-size: .75rem; white-space: pre-line; margin: .2rem; max-width: 15rem; }
.card { display: inline-block; border: 1px solid #ddd; border-radius: 4px; margin: .3rem; padding: .3rem; }
pre { background: #f6f6f6; padding: .6rem; overflow: auto; font-size: .75rem; }
"""


def text(value: Any) -> str:
    """``value`` as escaped page text (``html.escape`` of ``str(value)``, quotes included)."""
    return html.escape(str(value), quote=True)


def page(title: str, *parts: str) -> str:
    """A whole page: the escaped ``title`` as ``<title>`` and ``<h1>``, then ``parts`` (markup of this module),
    under :data:`CSP` and :data:`STYLE`."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{text(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{text(title)}</h1>\n"
            + "\n".join(parts) + "\n</body>\n</html>\n")


def section(heading: str, *parts: str, folded: bool = False) -> str:
    """An ``<h2>`` section of ``parts``; ``folded``: closed until clicked (``<details>``, no script)."""
    if folded:
        return f"<details><summary><b>{text(heading)}</b></summary>\n" + "\n".join(parts) + "\n</details>"
    return f"<section>\n<h2>{text(heading)}</h2>\n" + "\n".join(parts) + "\n</section>"


def paragraph(words: str, css: str = "") -> str:
    """One escaped paragraph (``css``: its class, e.g. ``verdict``)."""
    attribute = f' class="{text(css)}"' if css else ""
    return f"<p{attribute}>{text(words)}</p>"


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as a table: ``columns`` (default: every key, in first-seen order) as its head, each cell
    :func:`gi.analysis.report.format_cell` escaped; nothing for no rows."""
    if not rows:
        return ""
    keys: list[str] = list(columns) if columns is not None else []
    if columns is None:
        for row in rows:
            keys += [k for k in row if k not in keys]
    head = "".join(f"<th>{text(k)}</th>" for k in keys)
    body = "\n".join("<tr>" + "".join(f"<td>{text(format_cell(row.get(k)))}</td>" for k in keys) + "</tr>"
                     for row in rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def data_uri(png: bytes | Path) -> str:
    """A PNG (its bytes, or a file) as a ``data:image/png;base64`` URI; anything but a PNG is a ``ValueError``."""
    data = Path(png).read_bytes() if isinstance(png, Path) else png
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError(f"not a PNG: {png if isinstance(png, Path) else 'the bytes given'}")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def image(png: bytes | Path, alt: str, caption: str = "", css: str = "plot") -> str:
    """A PNG embedded as a :func:`data_uri` in a ``<figure>``, with its escaped ``alt`` text and ``caption``
    (newlines kept as line breaks); ``css``: ``plot`` (scaled to the page) or ``pixels`` (a small image, enlarged
    without smoothing)."""
    cap = f"<figcaption>{text(caption)}</figcaption>" if caption else ""
    return (f"<figure class=\"{text(css)}\"><img class=\"{text(css)}\" src=\"{data_uri(png)}\" "
            f"alt=\"{text(alt)}\">{cap}</figure>")


def card(*parts: str) -> str:
    """Parts kept together on one line of the page (an image beside its truth and their caption)."""
    return "<div class=\"card\">" + "".join(parts) + "</div>"


def preformatted(words: str) -> str:
    """Escaped text kept as it is (a config as YAML)."""
    return f"<pre>{text(words)}</pre>"


def write_page(path: Path, markup: str) -> Path:
    """Write a page (UTF-8); returns ``path``."""
    path.write_text(markup, encoding="utf-8")
    return path


def plot_section(out: Path, names: Sequence[str], heading: str = "Plots") -> str:
    """The PNGs ``names`` of the directory ``out`` that exist, embedded in one section (nothing when none does)."""
    found = [name for name in names if (out / name).is_file()]
    return section(heading, *(image(out / name, name, name) for name in found)) if found else ""


def write_table_report(out: Path, title: str, rows: Sequence[Mapping[str, Any]], plots: Sequence[str] = (),
                       notes: Sequence[str] = (), name: str = "report.html") -> Path:
    """``out / name``: the page of a command's table (``gi ablate``, ``gi defend``, ``gi bench``): ``notes`` as
    paragraphs, the ``rows`` (the command's table.md / CSV) and its ``plots`` (PNG files in ``out``)."""
    return write_page(out / name, page(title, *(paragraph(n) for n in notes), section("Table", table(rows)),
                                       plot_section(out, plots)))
