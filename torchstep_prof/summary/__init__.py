"""What profiling did in this process: the records (``tsp.records()``) and the table at exit.

``records`` keeps them, ``exit_table`` prints them; ``label_wrap`` and ``plain_console`` fit a
table to a terminal or a log (the command line's tables use them too).
"""
