"""Every piece of process-wide state in one list: what it holds, how tests reset it, what a fork does.

The package keeps state for the life of a process: the records, the engine, the scope stacks
(context variables), caches, warn-once flags, locks and its threads. :data:`STATES` names each
one; ``tests/test_process_state.py`` scans the package and fails on state missing from it, so a
new global, context variable, lock, thread or class attribute used as state gets a line here.

A fork is handled where the state lives: the module registers a function with
``_fork.at_fork_in_child`` and the child runs it (locks made anew, the parent's threads and work
forgotten, the engine made inert). Tests reset through :func:`reset_for_tests` (the fixture in
``tests/conftest.py``), which brings each state back to what a new process has. This module
imports nothing of the package: it resets only modules already imported (one never imported
is as a new process has it), naming each by its path.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import attrs

__all__ = ["STATES", "State", "reset_for_tests"]


@attrs.frozen
class State:
    """One piece of process-wide state.

    ``module`` and ``name`` say where it is (``name`` is ``thread`` for the threads a module
    starts); ``reset`` is what :func:`reset_for_tests` does: ``("call", "STORE.clear")`` calls
    that attribute of the module, ``("set", "_warned", False)`` assigns it, ``None`` does nothing
    (``tests`` says why).
    """

    module: str
    name: str
    kind: str
    holds: str
    tests: str
    fork: str
    reset: Optional[tuple[Any, ...]] = None


_KEPT = "kept (the child continues the parent's value)"
_NEW_LOCK = "made anew by the module's fork handler (another thread may have held it)"
_LOCK_TESTS = "no reset: a lock holds nothing between calls"
_ONCE = "cleared, so each test sees the warnings a new process gives"
_NOT_THE_CHILDS = "not the child's (only the forking thread exists in a child)"
_ONE_PER_PROCESS = "forgotten, its lock made anew, by one_per_process.py's fork handler"


STATES: tuple[State, ...] = (
    # --- foundations ----------------------------------------------------------------------
    State("_fork", "_in_child", "registry", "the functions a forked child runs",
           "no reset: registered once at import", "run in the child, in registration order"),
    State("_fork", "_registered", "global", "whether os.register_at_fork was called",
           "no reset: registered once per process", _KEPT),
    State("interrupts", "_GUARD", "global", "the Ctrl-C guard: holds open, traces recording on the main thread",
           "no reset: every hold and trace ends with its block (the fixture checks no trace is left)",
           "replaced by a new guard; Python's SIGINT handler restored"),
    State("interrupts", "_INTERRUPTIBLE", "registry", "the waits a Ctrl-C ends at once (code objects)",
           "no reset: filled at import", _KEPT),
    State("background", "_lock", "lock", "guards the work list", _LOCK_TESTS, _NEW_LOCK),
    State("background", "_work", "registry", "background work a flush waits for (writes, hooks)",
           "no reset: the fixture's tsp.flush() waits for all of it", "emptied: the parent's threads are not the child's"),
    State("topology", "_WORLD", "cache", "torch.distributed's group registry, once imported",
           "no reset: the same object for the process's life", _KEPT),
    State("topology", "_cached", "cache", "the resolved rank and world", "forget_topology()",
           "dropped (the child resolves its own rank)", ("call", "forget_topology")),
    State("topology", "_warned", "warn-once", "rank warnings given", "forget_topology()", _KEPT),
    State("topology", "_ray_warned", "warn-once", "the Ray actor warning given", "forget_topology()", _KEPT),
    # --- records and config ---------------------------------------------------------------
    State("summary.records", "STORE", "singleton", "the records: traces written, hook runs, costs, notes",
           "STORE.clear()", _KEPT + "; a child writes nothing to add", ("call", "STORE.clear")),
    State("config.environment", "_last", "cache", "the environment's layer, keyed on the variables' values",
           "no reset: a changed environment is read afresh (the key changes)", _KEPT),
    State("config.environment", "_ownership", "cache", "whether this process owns the environment's config",
           "no reset: keyed on the variables' values, like _last", _KEPT + " (TORCHSTEP_PROF_OWNER tells)"),
    # --- selection ------------------------------------------------------------------------
    State("selection.frames", "_STACK", "context variable", "the scope stack: the innermost frame",
           "no reset: every scope pops its frame on exit", "kept (the forking thread's context)"),
    State("selection.frames", "_ROOT", "singleton", "the frame outside every scope (the environment's config)",
           "reset_root()", _KEPT, ("call", "reset_root")),
    State("selection.frames", "_ROOT_RESOLVED", "global", "whether the root frame read the environment",
           "reset_root()", _KEPT),
    State("selection.frames", "_ENV_HOOK_SCOPE", "global", "the one hook scope of a hook set through the environment",
           "reset_root()", _KEPT + "; the engine's fork handler keeps its hook from running there"),
    State("selection.frames", "_ENV_HOOK_LOCK", "lock", "guards _ENV_HOOK_SCOPE", _LOCK_TESTS,
           "kept (taken only while a frame is made on the training thread)"),
    State("selection.frames", "_ON_ENV_HOOK", "registry", "callbacks when the environment sets a hook (the engine's)",
           "no reset: registered once at import", _KEPT),
    State("selection.frames", "_ON_DEMAND_FRAMES", "registry", "callbacks for frames that opt in to on-demand traces",
           "no reset: registered once at import", _KEPT),
    State("selection.frames", "_ON_ROOT_RESOLVED", "registry", "callbacks when the root frame reads the environment "
           "(the engine's)", "no reset: registered once at import", _KEPT),
    State("selection.frames", "HookScope._ordinals", "class attribute", "the count of hook scopes made, per kind",
           "no reset: scope ids name node-sync folders, so they stay unique for the process's life; "
           "no test depends on their numbers", _KEPT),
    State("selection.frames", "HookScope._ordinals_lock", "lock", "guards HookScope._ordinals", _LOCK_TESTS,
           "kept (held only for a dict lookup on the training thread)"),
    State("selection.steps", "CURRENT_STEP", "context variable", "the step block in force",
           "no reset: every step block resets it on exit", "kept (the forking thread's context)"),
    State("selection.steps", "COUNTERS", "counter", "regions counted per role and stage (the step they count)",
           "cleared, as a new process starts", _KEPT, ("call", "COUNTERS.clear")),
    State("selection.steps", "_OCCURRENCES", "counter", "traces of one region and step so far (their occurrence)",
           "forget_occurrences()", _KEPT, ("call", "forget_occurrences")),
    State("selection.steps", "_LOCK", "lock", "guards _OCCURRENCES", _LOCK_TESTS, _NEW_LOCK),
    State("selection.open_blocks", "_BEGUN", "context variable", "the step this thread or task began and not ended",
           "no reset: a test ends the steps it begins", "kept (the forking thread's context)"),
    State("selection.open_blocks", "_OPEN", "registry", "every begun step still open",
           "no reset: a test ends the steps it begins", "emptied: a child never ends its parent's steps"),
    State("selection.open_blocks", "_LOCK", "lock", "guards _OPEN", _LOCK_TESTS, _NEW_LOCK),
    State("selection.step_meaning", "_RUN", "singleton", "what a step number counts under torchstep-prof run",
           "no reset: set and cleared by the run", _KEPT),
    # --- recording ------------------------------------------------------------------------
    State("recording.foreign", "_lock", "lock", "guards the walk for someone else's profiler", _LOCK_TESTS,
           "kept (held only for the walk, on the training thread)"),
    State("recording.foreign", "_clean_at", "cache", "torch's profiler state when a walk found no other profiler",
           "no reset: keyed on torch's state", _KEPT),
    State("recording.foreign", "_own", "registry", "every torch profile of ours (weak)",
           "no reset: entries go with their profiles", _KEPT),
    State("recording.labels", "_LOCK", "lock", "guards the label collision check", _LOCK_TESTS, _KEPT),
    State("recording.labels", "_BY_FILE_NAME", "cache", "the first labels seen for each file-name pair",
           "cleared, so a label in one test never collides with another test's", _KEPT,
           ("call", "_BY_FILE_NAME.clear")),
    State("recording.labels", "_WARNED", "warn-once", "label collisions warned about", _ONCE, _KEPT,
           ("call", "_WARNED.clear")),
    State("recording.range_names", "RANGE_NAMES", "cache", "interned range names per role and stage",
           "no reset: a pure function of its key", _KEPT),
    State("recording.memory_history", "_warned", "warn-once", "allocator-history warnings given", _ONCE, _KEPT,
           ("call", "_warned.clear")),
    State("recording.nvtx", "_warned", "warn-once", "the NVTX-missing warning given", _ONCE, _KEPT,
           ("set", "_warned", False)),
    State("recording.session", "_warned_no_cuda", "warn-once", "the no-CUDA warning given", _ONCE, _KEPT,
           ("set", "_warned_no_cuda", False)),
    State("recording.slot", "NESTED_FAST_PATH", "singleton", "the frame and thread of the nested fast path",
           "no reset: cleared when its trace ends (the fixture checks no trace is left)",
           "cleared with the slot by the engine's fork handler"),
    # --- writing, the hook, metrics, on-demand traces ------------------------------------------
    State("writing.writer", "thread", "thread", "torchstep_prof-writer: writes stopped traces",
           "no reset: the fixture's tsp.flush() waits until it is idle",
           "forgotten by the engine's fork handler (Engine.after_fork_in_child)"),
    State("hook.finishing", "thread", "thread", "torchstep_prof-finish-hook: one per hook run",
           "no reset: the fixture's tsp.flush() waits for each", _NOT_THE_CHILDS),
    State("hook.finishing", "_RUNS", "registry", "hook runs not yet done (the exit wait's list)",
           "no reset: runs leave it when done; the fixture's tsp.flush() waits for them", _NOT_THE_CHILDS),
    State("hook.finishing", "_RUNS_LOCK", "lock", "guards _RUNS", _LOCK_TESTS, "kept (held only for list updates)"),
    State("hook.process", "thread", "thread", "torchstep_prof-hook-<stream>: copies a hook's output",
           "no reset: each ends with its command", _NOT_THE_CHILDS),
    State("hook.process", "_RUNNING", "registry", "hook commands running now (Ctrl-C at exit kills them)",
           "no reset: commands leave it when they end", _NOT_THE_CHILDS),
    State("hook.process", "_RUNNING_LOCK", "lock", "guards _RUNNING and _cancelled", _LOCK_TESTS,
           "kept (held only for set updates)"),
    State("hook.process", "_write_lock", "lock", "one hook output line at a time", _LOCK_TESTS,
           "kept (held only for a write)"),
    State("hook.process", "_cancelled", "global", "hooks cancelled by a Ctrl-C at exit",
           "set back to False, so a test that cancels leaves later hooks running", _KEPT,
           ("set", "_cancelled", False)),
    State("region_metrics.endpoint", "_started", "global", "the config the metrics endpoint started with",
           "no reset: one endpoint per process (tests/test_metrics.py starts it, then forget()s it)", _KEPT),
    State("region_metrics.endpoint", "_address", "global", "the endpoint's address", "as _started", _KEPT),
    State("region_metrics.endpoint", "_server", "global", "the endpoint's HTTP server",
           "as _started", "kept, but its thread is the parent's: a child serves nothing"),
    State("region_metrics.endpoint", "_LOCK", "lock", "guards the endpoint's start", _LOCK_TESTS, _KEPT),
    State("region_metrics.endpoint", "_ON_START", "registry", "callbacks when metrics start (the engine's)",
           "no reset: registered once at import", _KEPT),
    State("region_metrics.endpoint", "_warned", "warn-once", "endpoint warnings given", "forget() clears it", _KEPT),
    State("region_metrics.server", "thread", "thread", "torchstep_prof metrics server: serves the endpoint",
           "no reset: as the endpoint", _NOT_THE_CHILDS),
    State("region_metrics.recorder", "thread", "thread", "torchstep_prof metrics: folds recorded times",
           "no reset: idle between folds", "started anew by the recorder's fork handler"),
    State("region_metrics.recorder", "_LOCAL", "thread-local", "each thread's own list of spans",
           "no reset: forget() empties the lists", "the forking thread's kept, emptied"),
    State("region_metrics.recorder", "_STORES_LOCK", "lock", "guards the recorder's tables", _LOCK_TESTS, _NEW_LOCK),
    State("region_metrics.recorder", "_DRAIN_LOCK", "lock", "one drain of the span lists at a time", _LOCK_TESTS,
           _NEW_LOCK),
    State("region_metrics.recorder", "_UNWRITTEN", "registry", "drained spans the span log has not taken",
           "forget() empties it", "emptied by the recorder's fork handler"),
    State("region_metrics.recorder", "_FOLDED", "counter", "folded times per series", "forget()", "emptied"),
    State("region_metrics.recorder", "_SERIES", "cache", "the series each key folds into", "forget()", _KEPT),
    State("region_metrics.recorder", "_ADMITTED", "registry", "pairs with a series of their own", "forget()", _KEPT),
    State("region_metrics.recorder", "BOUNDS", "config", "the buckets, set once per process", "forget()", _KEPT),
    State("region_metrics.recorder", "_folding", "singleton", "the folding thread, once started",
           "no reset: one per process", "started anew by the recorder's fork handler"),
    State("region_metrics.recorder", "_capped", "warn-once", "the pair cap warned about", "forget()", _KEPT),
    State("region_metrics.recorder", "WATCHED", "singleton", "what the automatic-trace watch reads (steps, a region)",
           "WATCHED.reset()", "reset by the recorder's fork handler", ("call", "WATCHED.reset")),
    State("slow_steps.decisions", "DECISIONS", "counter", "automatic-trace decisions: counts, lines, steps traced",
           "DECISIONS.clear()", _KEPT + "; a child traces nothing automatically", ("call", "DECISIONS.clear")),
    State("slow_steps.why", "_WHY", "cache", "why each automatically traced step was traced",
           "_WHY.clear()", _KEPT, ("call", "_WHY.clear")),
    State("slow_steps.why", "_LOCK", "lock", "guards _WHY", _LOCK_TESTS, "kept (held only for a dict update)"),
    State("triggers.watcher", "_AUTO_WARNED", "warn-once", "auto_trace off warnings given", _ONCE, _KEPT,
           ("call", "_AUTO_WARNED.clear")),
    State("region_metrics.recorder", "_SPANS_ON", "flag", "whether regions append spans (the span log is on)",
           "no reset: tests that log spans run in processes of their own", "cleared: a child logs no spans"),
    State("region_metrics.recorder", "_SPAN_LISTS", "registry", "every thread's list of spans not yet drained",
           "no reset: as _SPANS_ON", "emptied by the recorder's fork handler"),
    State("region_metrics.recorder", "_IDLE", "counter", "idle time before each region (spans and metrics on)",
           "forget()", "emptied by the recorder's fork handler"),
    State("timeline.wall_clock", "_BASE", "cache", "wall minus perf_counter: the span log's, else the first reading",
           "no reset: the same clock for the process's life", _KEPT),
    State("timeline.wall_clock", "_RECENT_ANCHORS", "registry", "the last 256 clock anchors passed, for the next trace",
           "_RECENT_ANCHORS.clear()", "cleared: the parent's barriers", ("call", "_RECENT_ANCHORS.clear")),
    State("timeline.wall_clock", "_RECENT_RAY", "registry", "the last 1024 sides of Ray calls noted, for the next trace",
           "_RECENT_RAY.clear()", "cleared: the parent's Ray calls", ("call", "_RECENT_RAY.clear")),
    State("timeline.wall_clock", "_RAY_NUMBERS", "counter", "Ray call sides noted so far (each goes in one trace)",
           "no reset: numbers only grow", _KEPT),
    State("timeline.span_log", "_LOG", "singleton", "the process's span log, once started",
           "no reset: tests that log spans run in processes of their own", "forgotten: the file is the parent's"),
    State("timeline.span_log", "_LOG_LOCK", "lock", "guards the span log's start and anchors", _LOCK_TESTS, _NEW_LOCK),
    State("timeline.span_log", "_ANCHOR_SEQ", "counter", "clock anchors passed so far, by name",
           "no reset: as _LOG", _KEPT),
    State("timeline.span_log", "thread", "thread", "torchstep_prof spans: appends the span log's file",
           "no reset: as _LOG", _NOT_THE_CHILDS),
    State("triggers.running", "ENGINE", "registry", "the engine on-demand plans drive (registered by engine.py)",
           "no reset: registered once at import", _KEPT),
    State("triggers.running", "ON_DEMAND", "singleton", "the poll thread in force (on-demand traces), and its lock",
           "no reset: the scope that starts it stops it on exit", _ONE_PER_PROCESS),
    State("triggers.watcher", "thread", "thread", "torchstep_prof-on-demand: polls the trigger folder",
           "no reset: stopped by its scope's exit", _NOT_THE_CHILDS),
    State("live.open_regions", "_LOCAL", "thread-local", "each thread's open regions (live status)",
           "no reset: every region a test opens it closes", "the forking thread's kept"),
    State("live.open_regions", "_LISTS", "registry", "every thread's list of open regions",
           "no reset: a dead thread's list is dropped when the status thread reads them",
           "only the forking thread's kept, by the module's fork handler"),
    State("live.open_regions", "_LISTS_LOCK", "lock", "guards _LISTS", _LOCK_TESTS, _NEW_LOCK),
    State("live.running", "LIVE", "singleton", "the live-status reporter in force (a stall or on-demand scope), and its lock",
           "no reset: the scope that starts it stops it on exit", _ONE_PER_PROCESS),
    State("live.reporter", "thread", "thread", "torchstep_prof-live: writes this rank's live status",
           "no reset: stopped by its scope's exit", _NOT_THE_CHILDS),
    State("live.stall", "thread", "thread", "torchstep_prof-stall-cmd: runs a stall's command once",
           "no reset: it ends with its command (time-limited)", _NOT_THE_CHILDS),
    # --- the engine and its users ------------------------------------------------------------
    State("engine", "ENGINE", "singleton", "the profiler slot, the writer, deferred hooks, exit work",
           "its warn-once keys cleared; the fixture checks it left no trace recording",
           "made inert by Engine.after_fork_in_child: it writes nothing and runs no hook",
           ("call", "ENGINE._warned.clear")),
    State("engine", "_WRITER_LOCK", "lock", "makes the one writer", _LOCK_TESTS, "kept (held only to make it)"),
    State("scopes", "_ENTERED", "context variable", "the scopes entered in this context and their managers",
           "no reset: every scope exits", "kept (the forking thread's context)"),
    State("scopes", "_CODE_CONFIG", "context variable", "the code's config at each depth",
           "no reset: every scope exits", "kept (the forking thread's context)"),
    State("integrations.ray", "_SUBMITTED", "registry", "Ray references submitted and not yet got (capped)",
           "_SUBMITTED.clear()", "kept (a child makes no Ray calls of the parent's)", ("call", "_SUBMITTED.clear")),
    State("zero_code.boundaries", "_DRIVER", "singleton", "the one step driver while torchstep-prof run runs",
           "no reset: set and cleared by the run", _KEPT),
)  # fmt: skip


def reset_for_tests() -> None:
    """Bring every process-wide state :data:`STATES` resets back to what a new process has.

    For tests running many jobs in one process (``tests/conftest.py`` calls it before and after
    each test); a process never needs it.
    """
    for state in STATES:
        if state.reset is None:
            continue
        module = sys.modules.get(f"torchstep_prof.{state.module}")
        if module is None:  # never imported: its state is a new process's
            continue
        action, path, *value = state.reset
        owner: Any = module
        *parents, last = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        if action == "call":
            getattr(owner, last)()
        else:
            setattr(owner, last, value[0])
