"""Slow steps trace themselves (``auto_trace``): the rule, the watch, why a trace was taken.

``rule`` is the pure decision (no torch, no files); ``watch`` feeds it on the on-demand poll
thread and acts; ``why`` keeps each automatic trace's reason for its metadata; ``decisions``
counts what the watch decided (``tsp.auto_trace`` is in scopes.py). docs/auto-trace.md.
"""
