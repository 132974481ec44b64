"""``torchstep-prof report``: the report's content as records, then rendered as one HTML page.

``content`` builds the records from the analysis; ``page`` renders them, with ``steps`` for
timelines and step charts, ``diagnosis`` for collective waits, memory and baseline sections,
``text`` for every name shown (escaped) and ``template`` for the fixed HTML, style and script
and what every figure's layout shares.
"""
