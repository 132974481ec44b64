"""The fixed parts of the report page.

The HTML skeleton, the style sheet, the drawing script, and what every figure's layout shares.

The script draws the charts lazily, as they scroll into view; ``window.tspDrawAll()`` draws
every one."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["PAGE", "SCRIPT", "STYLE", "Chart", "layout"]

Chart = Callable[[dict[str, Any], str], str]
"""Files a plotly figure spec and returns its placeholder ``<div>`` (``render_page``'s ``chart``)."""


def layout(*, legend: bool = False, **extra: Any) -> dict[str, Any]:
    """A figure's layout: the page's font on white, a legend in one row above the plot only
    with ``legend``; ``extra`` adds or replaces keys."""
    spec: dict[str, Any] = {
        "margin": {"l": 60, "r": 20, "t": 10, "b": 40},
        "height": 260,
        "template": None,
        "plot_bgcolor": "#ffffff",
        "paper_bgcolor": "#ffffff",
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "showlegend": legend,
    }
    if legend:
        spec["legend"] = {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0}
    return {**spec, **extra}


STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1400px; padding: 0 24px;
       color: #222; background: #fafafa; }
h1 { margin: 18px 0 6px; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { margin: 0 0 4px; font-size: 15px; }
header, #findings { background: #fff; border: 1px solid #ddd; border-radius: 6px;
                    padding: 8px 16px; margin: 12px 0; }
#findings li { margin: 4px 0; font-size: 15px; }
#findings a { color: #a00; text-decoration: none; }
#findings a:hover { text-decoration: underline; }
.meta { color: #666; font-size: 13px; margin: 2px 0 6px; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 12px; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 8px 10px; }
.chart { min-height: 160px; }
.grid.wide { grid-template-columns: minmax(0, 3fr) minmax(320px, 2fr); align-items: start; }
.chart.steps { background: #fff; border: 1px solid #ddd; border-radius: 6px; }
@media (max-width: 1100px) { .grid.wide { grid-template-columns: minmax(0, 1fr); } }
table.spread { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 6px 10px;
               font-size: 13px; white-space: nowrap; }
.timeline { background: #fff; border: 1px solid #ddd; border-radius: 6px; margin-bottom: 12px; }
table.diff { font-size: 12px; border-collapse: collapse; margin: 6px 0; }
table.diff td, table.diff th { padding: 1px 10px 1px 0; text-align: right; }
table.diff td:first-child, table.diff th:first-child { text-align: left; }
table.ops-diff td:nth-child(2), table.ops-diff th:nth-child(2) { text-align: left; }
table.ops { font-size: 12px; border-collapse: collapse; margin-top: 4px; }
table.ops td, table.ops th { padding: 1px 8px 1px 0; text-align: left; }
table.ops td:first-child { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 13px; }
p.warning { background: #fff4e5; border: 1px solid #f0b46c; border-radius: 6px; padding: 6px 10px; }
"""

SCRIPT = """
(function () {
  var figures = JSON.parse(document.getElementById("tsp-figures").textContent);
  var config = {displayModeBar: false, responsive: true};
  window.tspDrawn = 0;
  function draw(div) {
    if (div.dataset.drawn) { return; }
    div.dataset.drawn = "1";
    var fig = figures[Number(div.dataset.fig)];
    Plotly.newPlot(div, fig.data, fig.layout, config);
    window.tspDrawn += 1;
  }
  var charts = Array.prototype.slice.call(document.querySelectorAll("div.chart"));
  window.tspDrawAll = function () { charts.forEach(draw); return charts.length; };
  if ("IntersectionObserver" in window) {
    var seen = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { seen.unobserve(e.target); draw(e.target); }
      });
    }, {rootMargin: "400px"});
    charts.forEach(function (div) { seen.observe(div); });
  } else {
    window.tspDrawAll();
  }
})();
"""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
<script type="text/javascript">{plotlyjs}</script>
</head><body>
{body}
<script type="application/json" id="tsp-figures">{figures}</script>
<script type="text/javascript">{script}</script>
</body></html>
"""
