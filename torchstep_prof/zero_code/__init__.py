"""``torchstep-prof run``: profiling an unmodified script.

``torchstep-prof run``: profiling an unmodified script, with step boundaries from torch's
global optimizer hooks (``boundaries``) and the script run as ``__main__`` (``script_runner``)."""
