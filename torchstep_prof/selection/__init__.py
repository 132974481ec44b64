"""Deciding what a region does: the scope stack's frames, the step and rank rules, open steps.

``frames`` holds what is in force where a region runs, ``rules`` the pure rules for steps and
ranks, ``open_blocks`` the steps begun with ``begin_step``, ``missed_steps`` the selected steps
that never ran.
"""
