"""Trace files once written: their names, reading them back, and what the command line makes of them.

``names`` is the one builder of a trace's file name and its parser (the training side uses it
too); ``reading/`` opens a file and describes it, ``analysis/`` turns a folder of described
traces into records (summarize, findings, collective waits, memory, diff, merge) and ``report/``
renders those records as one HTML page. Each layer imports only the ones before it, and nothing
here imports torch.
"""
