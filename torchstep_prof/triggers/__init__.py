"""On-demand traces of a running job: ``torchstep-prof trigger`` asks, a poll thread in each rank serves (``on_demand``).

``request`` and ``status`` are the files in the trigger directory (no torch: the command line
reads and writes them); ``planning`` turns the ranks' status into the absolute steps of a
request; ``watcher`` is the job's side (the poll thread, and the plan a step boundary reads).
"""
