"""One torch profiler window: starting and stopping it, its ranges and spans, other profilers.

``slot`` starts and stops torch's one profiler (its moves: ``slot_states``), ``session`` is the
window, ``spans`` the regions of other threads and tasks, ``range_names`` the names of ranges,
``warm_up`` torch's one-time start-up, ``foreign`` someone else's profiler.
"""
