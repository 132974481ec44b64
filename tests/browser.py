"""Opening a report page in real headless Chromium, for tests: what it drew, and a screenshot.

``probe_page`` loads a copy of the page with a small script that records JavaScript errors (and
``console.error`` lines), draws every chart, then writes what each chart drew (plotly's SVGs,
bars and their places on the page) into the DOM, which ``--dump-dom`` prints. ``screenshot``
takes a PNG of the page at the same window size, so a chart's place from the probe is its place
in the picture. Chromium is the Debian package ``chromium`` (``apt-get install -y chromium``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

WINDOW = (1400, 3200)

_PROBE = """
window.__tspErrors = [];
window.addEventListener("error", function (e) { window.__tspErrors.push(String(e.message)); });
window.addEventListener("unhandledrejection", function (e) {
  window.__tspErrors.push("unhandled rejection: " + String(e.reason));
});
(function () {
  var original = console.error;
  console.error = function () {
    window.__tspErrors.push(Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
})();
window.addEventListener("load", function () {
  setTimeout(function () {
    // What the page drew by itself (the charts in or near the window), then everything.
    window.__tspDrawnAtLoad = window.tspDrawn;
    window.__tspTotal = window.tspDrawAll ? window.tspDrawAll() : -1;
    setTimeout(collect, 300);
  }, 300);
});
function collect() {
    var charts = Array.prototype.map.call(document.querySelectorAll("div.chart"), function (div) {
      var r = div.getBoundingClientRect();
      var bars = Array.prototype.filter.call(div.querySelectorAll("g.point path"), function (p) {
        var box = p.getBBox();
        return box.width > 0 && box.height > 0;
      });
      var card = div.closest(".card");
      // Text drawn past the chart's edges is cut off (a label cut at its start, a clipped title).
      var cut = Array.prototype.filter.call(div.querySelectorAll("svg text"), function (t) {
        var b = t.getBoundingClientRect();
        return b.width > 0 && (b.left < r.left - 1 || b.right > r.right + 1 || b.top < r.top - 1 || b.bottom > r.bottom + 1);
      }).map(function (t) { return t.textContent; });
      // Annotations (the median's label) drawn over a bar.
      var boxes = bars.map(function (p) { return p.getBoundingClientRect(); });
      var over = Array.prototype.filter.call(div.querySelectorAll("g.annotation text"), function (t) {
        var a = t.getBoundingClientRect();
        return boxes.some(function (b) {
          return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
        });
      }).map(function (t) { return t.textContent; });
      return {fig: Number(div.dataset.fig), kind: div.className.split(" ")[1],
              card: card ? card.id : "",
              svg: div.querySelectorAll("svg.main-svg").length, bars: bars.length,
              links: div.querySelectorAll("a").length, cut: cut, over_bars: over,
              text: div.textContent,
              rect: [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height]};
    });
    var pre = document.createElement("pre");
    pre.id = "tsp-probe";
    pre.textContent = JSON.stringify({errors: window.__tspErrors, total: window.__tspTotal,
                                      drawn_at_load: window.__tspDrawnAtLoad,
                                      drawn: window.tspDrawn, charts: charts});
    document.body.appendChild(pre);
}
"""


def chromium() -> str:
    """The Chromium binary, or skip the test saying that it is missing."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    raise AssertionError  # unreachable: pytest.skip raises


def _run(
    args: list[str], profile: str, window: tuple[int, int] = WINDOW
) -> subprocess.CompletedProcess[str]:
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={window[0]},{window[1]}",
        "--virtual-time-budget=10000",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def probe_page(page: Path, window: tuple[int, int] = WINDOW) -> dict[str, Any]:
    """What the page drew in Chromium: ``{"errors", "total", "drawn_at_load", "drawn", "charts":
    [{"fig", "kind", "card", "svg", "bars", "links", "cut", "over_bars", "text", "rect"}]}``
    (``card``: the id of the chart's card, if any; ``links``: ``<a>`` elements inside the chart;
    ``cut``: its texts drawn past its edges, so cut off; ``over_bars``: its annotations drawn
    over a bar)."""
    text = page.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="tsp-chromium-") as scratch:
        probed = Path(scratch) / "probed.html"
        probed.write_text(text.replace("<head>", f"<head><script>{_PROBE}</script>", 1))
        done = _run(["--dump-dom", probed.as_uri()], str(Path(scratch) / "profile"), window)
    match = re.search(r'<pre id="tsp-probe">(.*?)</pre>', done.stdout, re.S)
    assert match, f"the probe did not run (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(_unescape(match[1]))


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)


def screenshot(page: Path, out: Path) -> Path:
    """A PNG of the top of ``page`` at :data:`WINDOW`."""
    with tempfile.TemporaryDirectory(prefix="tsp-chromium-") as scratch:
        done = _run([f"--screenshot={out}", page.as_uri()], str(Path(scratch) / "profile"))
    assert out.exists(), f"no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    return out


def colored_pixels(png: Path, rect: list[float], color: str) -> int:
    """How many pixels of ``color`` (``#rrggbb``) lie inside ``rect`` (left, top, width, height)
    of the screenshot ``png``."""
    image = pytest.importorskip("PIL.Image", reason="Pillow is not installed (the [test] extra)")
    wanted = tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))
    with image.open(png) as picture:
        left, top, width, height = (int(v) for v in rect)
        box = picture.convert("RGB").crop((left, top, left + width, top + height))
        return sum(count for count, rgb in box.getcolors(maxcolors=1 << 24) if rgb == wanted)
