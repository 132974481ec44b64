"""``torchstep-prof run``: profiling an unmodified script.

``step_on`` says what ends a step (an
optimizer step, a top-level backward, a function's return), ``boundaries`` turns those into
step blocks whose traces hold the whole step, ``open_ranges`` watches the script's
``record_function`` ranges near selected steps (a trace never starts inside one begun under
another), and ``script_runner`` runs the script as ``__main__``."""
