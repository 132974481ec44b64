"""What a folder of read traces says: plain records computed from ``reading``'s ``TraceInfo``.

``summarize`` groups traces by region and step (wall time per rank, stragglers); ``findings``,
``collectives`` and ``memory`` explain a straggler; ``runs`` tells runs in one folder apart;
``diff`` compares two sets of traces; ``merge`` makes one Chrome trace of many.
"""
