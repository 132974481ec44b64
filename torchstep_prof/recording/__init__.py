"""One torch profiler window: starting and stopping it, its ranges and spans, other profilers.

``session`` is the window, ``spans`` the regions of other threads and tasks, ``range_names`` the
names of ranges, ``warm_up`` torch's one-time start-up, ``foreign`` someone else's profiler.
"""
