"""The HTML pages in a real headless browser (Debian's ``chromium``): they load from disk
with no network, the DOM the browser built holds the plots and their marks, and the
screenshot it rendered shows the plots' colours.

Skips with the reason when chromium is absent; with HCP_TUNE_REQUIRE_BROWSER=1 (CI, which
installs it in .ci/run) it fails instead.
"""
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from helpers import rows_for, store  # noqa: E402

from hcp_tune.store.folder import ResultStore  # noqa: E402
from hcp_tune.outputs import html_report, regress, report  # noqa: E402
from hcp_tune.outputs.svg import COLOURS  # noqa: E402

BASE = [1.00, 1.01, 0.99]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    reason = "chromium is not installed (apt-get install -y chromium)"
    if os.environ.get("HCP_TUNE_REQUIRE_BROWSER") == "1":
        pytest.fail(reason + " [HCP_TUNE_REQUIRE_BROWSER=1]", pytrace=False)
    pytest.skip(reason)


def browse(page: Path, *mode: str) -> subprocess.CompletedProcess:
    # --no-sandbox: CI runs as root; no network is needed or allowed for the page
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", "--proxy-server=127.0.0.1:9", *mode, page.as_uri()],
        capture_output=True, text=True, timeout=120)


def png_pixels(path: Path) -> set[tuple[int, int, int]]:
    """The set of RGB colours in an 8-bit RGB/RGBA PNG (what chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, prev, colours = zlib.decompress(idat), width * bpp, bytearray(width * bpp), set()
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(tuple(line[i:i + 3]) for i in range(0, stride, bpp))
        prev = line
    return colours


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("pages")
    rows = (rows_for("old", 1, 4, BASE, mem=3 << 30) + rows_for("old", 4, 1, [1.2] * 3, mem=2 << 30)
            + rows_for("old", 2, 2, [1.1] * 3, mem=4 << 30)
            + rows_for("new", 1, 4, [1.3, 1.31, 1.29], mem=3 << 30)
            + rows_for("new", 4, 1, [1.2] * 3, mem=2 << 30)
            + rows_for("new", 2, 2, [1.1] * 3, mem=4 << 30))
    stored = ResultStore(store(tmp / "res", rows)).rows()
    rep = regress.compare(stored, regress.Options(baseline="old", candidate="new"))
    out = {"regress": tmp / "regress.html", "report": tmp / "report.html"}
    out["regress"].write_text(html_report.regress_page(rep))
    keys = report.summarize(stored, results_dir=tmp / "res", env_tag="old")
    out["report"].write_text(html_report.report_page(keys, "report"))
    return out


def test_pages_are_self_contained(pages):
    for page in pages.values():
        text = page.read_text()
        assert "<script" not in text and "http://" not in text.replace(
            'xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text


def test_regress_page_renders_its_plots_in_chromium(pages):
    dom = browse(pages["regress"], "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert html.count('data-plot="ratio"') == 1 and html.count('data-plot="step-times"') == 1
    # 3 layouts: 3 ratio points, 3 x (3 + 3) per-trial medians
    assert html.count('class="mark"') == 3 + 18
    assert html.count('class="interval"') == 3 and html.count('class="band"') == 3
    assert "REGRESSION" in html and "winner changed" in html


def test_report_page_renders_pareto_spread_and_prediction(pages):
    dom = browse(pages["report"], "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for kind in ("pareto", "spread", "predicted"):
        assert f'data-plot="{kind}"' in html, kind
    assert html.count('class="front"') == 1  # [1,4] (fastest) and [4,1] (smallest memory)
    assert "<td>yes</td>" in html


def test_screenshot_shows_the_plot_colours(pages, tmp_path):
    shot = tmp_path / "regress.png"
    r = browse(pages["regress"], f"--screenshot={shot}", "--window-size=1200,1000")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    colours = png_pixels(shot)
    # the baseline's and the candidate's marks (fill-opacity blends them with the
    # background, so look for the band colour and the pure series colour of the ratio line)
    assert rgb(COLOURS[0]) in colours  # the ratio intervals are drawn opaque
    assert rgb("#dcebdc") in colours  # the not-flagged bands
