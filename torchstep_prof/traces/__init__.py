"""Trace files once written: names, reading them back, and what the CLI makes of them.

Trace files once written: their names (the one builder and its parser), reading them back, and
what the command line makes of a folder of them (summarize, merge, report). Nothing here imports
torch."""
