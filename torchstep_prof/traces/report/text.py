"""Text on the report page: names from traces as HTML text and as chart text, labels that fit.

Every name on the page comes from a trace (operators are free text, whatever a file holds):
:func:`escape` for the page's HTML, :func:`chart_text` for what plotly draws, :func:`script_json`
for the figures' JSON inside a ``<script>`` element, :func:`axis_labels` for long names on an axis.
"""

from __future__ import annotations

import html
import json
from typing import Any, Iterable, Sequence

__all__ = ["AXIS_LABEL_CHARS", "axis_labels", "chart_text", "escape", "label_margin", "script_json"]

AXIS_LABEL_CHARS = 34
"""Longest label on a chart axis, in characters: longer names are cut in the middle (their start
names the namespace, their end the operator), whole in the hover."""

_TEMPLATE_KEYS = frozenset({"hovertemplate", "texttemplate"})
"""Figure keys whose strings are plotly templates written here (``<br>``, ``<extra>``), never
data: every other string of a figure may hold a name from a trace."""

_SCRIPT_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def escape(text: object) -> str:
    """``text`` as HTML text (quotes included, for attributes)."""
    return html.escape(str(text), quote=True)


def chart_text(value: Any, key: str = "") -> Any:
    """``value`` (a figure, or any part of one) with ``&``, ``<`` and ``>`` of its strings as
    entities: plotly renders a subset of HTML in every text it draws (axis labels, legends,
    hovers), so an operator named ``<a href=...>`` would be a live link. plotly shows the
    entities as the characters themselves. Templates (:data:`_TEMPLATE_KEYS`) are kept.

    >>> chart_text({"y": ["<b>x</b>"], "hovertemplate": "%{y}<br>"})
    {'y': ['&lt;b&gt;x&lt;/b&gt;'], 'hovertemplate': '%{y}<br>'}
    """
    if isinstance(value, str):
        return value if key in _TEMPLATE_KEYS else html.escape(value, quote=False)
    if isinstance(value, dict):
        return {k: chart_text(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [chart_text(v, key) for v in value]
    return value


def script_json(figures: Iterable[Any]) -> str:
    """The figures as JSON to place inside ``<script type="application/json">``.

    Inside ``<script>``, ``</script`` ends the element and ``<!--`` changes how the rest is
    parsed (an operator named ``<!--<script>`` swallowed the page's end): ``<``, ``>`` and ``&``
    go as ``\\u`` escapes, the same text to ``JSON.parse``, none of them seen by the HTML parser.
    """
    return json.dumps(list(figures), separators=(",", ":"), allow_nan=False).translate(_SCRIPT_ESCAPES)


def axis_labels(names: Sequence[str], limit: int = AXIS_LABEL_CHARS) -> list[str]:
    """``names`` cut in the middle to at most ``limit`` characters (``…`` where cut).

    >>> axis_labels(["aten::mm", "autograd::engine::evaluate_function: AddmmBackward0"])
    ['aten::mm', 'autograd::engine…n: AddmmBackward0']
    """
    head = (limit - 1) // 2
    tail = limit - 1 - head
    return [name if len(name) <= limit else f"{name[:head]}…{name[-tail:]}" for name in names]


def label_margin(labels: Sequence[str]) -> int:
    """Pixels left of a plot for ``labels`` at the page's 12 px font (about 7 px a character)."""
    return 16 + 7 * max((len(label) for label in labels), default=4)
