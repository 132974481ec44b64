"""What profiling did in this process: the records (``tsp.records()``) and the table at exit.

``records`` keeps them, ``exit_table`` prints them (fitting the table to a terminal or a log
with ``rendering``, as the command line's tables do).
"""
