"""Reading trace files: open one safely, parse its events, describe it, scan a folder (cached, in parallel).

``loading`` opens one file (a regular file only, gzipped or not); ``events``, ``fused``,
``gpu_time``, ``collective_calls`` and ``memory_events`` read what a trace's events say;
``files`` puts it together as one ``TraceInfo`` per file; ``cache`` and ``parallel`` make a
second scan of a large folder cheap.
"""
