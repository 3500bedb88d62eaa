"""A demo run's report.html in a real headless browser (Debian's ``chromium``): the page renders, every image
decodes and loads, and the browser logs no console message (a blocked resource, a script, a CSP violation).
Skipped, saying so, where no chromium is installed (``.ci/run`` installs it)."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed: apt-get install -y chromium")

# appended to a copy of the page (the report itself has no script and its CSP forbids one): counts the images the
# browser decoded and writes the count into the DOM that --dump-dom prints
PROBE = ("<script>window.addEventListener('load', () => { const all = [...document.images]; document.body"
         ".setAttribute('data-loaded', all.filter(i => i.complete && i.naturalWidth > 0).length + '/' + all.length)"
         "; });</script>")


def chromium(page: Path, *flags: str) -> subprocess.CompletedProcess:
    """Run headless chromium on ``page`` (a file), no GPU, no sandbox (root in CI), a fixed virtual-time budget so
    the page has loaded before the DOM is dumped."""
    return subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                           f"--user-data-dir={page.parent / '.chromium'}", "--virtual-time-budget=5000", *flags,
                           page.resolve().as_uri()], capture_output=True, text=True, timeout=120)


def console_lines(stderr: str) -> list[str]:
    """The page's console messages in chromium's log (``--enable-logging=stderr``: ``...:CONSOLE...] "..."``)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_the_report_renders_in_chromium_with_every_image_loaded_and_no_console_message(demo_report, tmp_path):
    from PIL import Image

    done = chromium(demo_report, "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert console_lines(done.stderr) == []
    dom = done.stdout
    assert "gradient inversion report</h1>" in dom and 'class="verdict"' in dom
    sources = re.findall(r"<img [^>]*src=\"([^\"]*)\"", dom)
    assert len(sources) == 6  # two reconstructions, two truths, psnr.png, objective.png
    for src in sources:
        head, _, data = src.partition(",")
        assert head == "data:image/png;base64"
        Image.open(io.BytesIO(base64.b64decode(data, validate=True))).verify()  # a whole, valid PNG

    probed = tmp_path / "probed.html"  # the browser's own word on every image: decoded, with a size
    probed.write_text(re.sub(r"<meta http-equiv=\"Content-Security-Policy\"[^>]*>", "", demo_report.read_text())
                      .replace("</body>", PROBE + "</body>"))
    done = chromium(probed, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r'data-loaded="(\d+)/(\d+)"', done.stdout).groups() == ("6", "6")

    shot = tmp_path / "report.png"
    done = chromium(demo_report, f"--screenshot={shot}", "--window-size=1000,1400")
    assert done.returncode == 0 and shot.stat().st_size > 10_000
    pixels = Image.open(shot).convert("L")
    assert pixels.getextrema()[0] < 100  # text and images drawn, not a blank page


def test_a_blocked_resource_is_a_console_message(tmp_path):
    """The check above would see a resource the page must not load: the CSP blocks it and chromium logs it."""
    from gi.analysis import html

    page = tmp_path / "bad.html"
    page.write_text(html.page("bad", '<img src="https://example.invalid/x.png" alt="">'))
    done = chromium(page, "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert any("Content Security Policy" in line for line in console_lines(done.stderr)), done.stderr[-2000:]
