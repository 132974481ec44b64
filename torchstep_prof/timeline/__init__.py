"""The job-wide timeline: the span log each process writes, and what ``torchstep-prof timeline`` reads from it.

``span_log`` is the writing side (started by ``tsp.spans``); ``reading`` reads span files back
without trusting them, ``clock`` aligns the processes' clocks from their anchors, ``ledger``
builds each step's record (busy and idle time, what each gap waited for, the critical path, the
long tail) and ``output`` prints it. Only ``span_log`` runs in training processes; none of
them imports torch.
"""
