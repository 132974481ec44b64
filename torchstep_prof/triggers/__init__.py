"""On-demand traces of a running job (``on_demand``): ``torchstep-prof trigger`` asks, each rank serves.

``request`` and ``status`` are the files in the trigger directory (no torch: the command line
reads and writes them); ``planning`` turns the ranks' status into the absolute steps of a
request; ``watcher`` is the job's side (the poll thread, and the plan a step boundary reads).
"""
