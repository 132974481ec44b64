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


@attrs.frozen(kw_only=True)
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


def _state(module: str, name: str, kind: str, holds: str, tests: str, fork: str, reset: Any = None) -> State:
    return State(module=module, name=name, kind=kind, holds=holds, tests=tests, fork=fork, reset=reset)


STATES: tuple[State, ...] = (
    # --- foundations ----------------------------------------------------------------------
    _state("_fork", "_in_child", "registry", "the functions a forked child runs",
           "no reset: registered once at import", "run in the child, in registration order"),
    _state("_fork", "_registered", "global", "whether os.register_at_fork was called",
           "no reset: registered once per process", _KEPT),
    _state("interrupts", "_GUARD", "global", "the Ctrl-C guard: holds open, traces recording on the main thread",
           "no reset: every hold and trace ends with its block (the fixture checks no trace is left)",
           "replaced by a new guard; Python's SIGINT handler restored"),
    _state("interrupts", "_INTERRUPTIBLE", "registry", "the waits a Ctrl-C ends at once (code objects)",
           "no reset: filled at import", _KEPT),
    _state("background", "_lock", "lock", "guards the work list", _LOCK_TESTS, _NEW_LOCK),
    _state("background", "_work", "registry", "background work a flush waits for (writes, hooks)",
           "no reset: the fixture's tsp.flush() waits for all of it", "emptied: the parent's threads are not the child's"),
    _state("topology", "_WORLD", "cache", "torch.distributed's group registry, once imported",
           "no reset: the same object for the process's life", _KEPT),
    _state("topology", "_cached", "cache", "the resolved rank and world", "forget_topology()",
           "dropped (the child resolves its own rank)", ("call", "forget_topology")),
    _state("topology", "_warned", "warn-once", "rank warnings given", "forget_topology()", _KEPT),
    _state("topology", "_ray_warned", "warn-once", "the Ray actor warning given", "forget_topology()", _KEPT),
    # --- records and config ---------------------------------------------------------------
    _state("summary.records", "STORE", "singleton", "the records: traces written, hook runs, costs, notes",
           "STORE.clear()", _KEPT + "; a child writes nothing to add", ("call", "STORE.clear")),
    _state("config.environment", "_last", "cache", "the environment's layer, keyed on the variables' values",
           "no reset: a changed environment is read afresh (the key changes)", _KEPT),
    _state("config.environment", "_ownership", "cache", "whether this process owns the environment's config",
           "no reset: keyed on the variables' values, like _last", _KEPT + " (TORCHSTEP_PROF_OWNER tells)"),
    # --- selection ------------------------------------------------------------------------
    _state("selection.frames", "_STACK", "context variable", "the scope stack: the innermost frame",
           "no reset: every scope pops its frame on exit", "kept (the forking thread's context)"),
    _state("selection.frames", "_ROOT", "singleton", "the frame outside every scope (the environment's config)",
           "reset_root()", _KEPT, ("call", "reset_root")),
    _state("selection.frames", "_ROOT_RESOLVED", "global", "whether the root frame read the environment",
           "reset_root()", _KEPT),
    _state("selection.frames", "_ENV_HOOK_SCOPE", "global", "the one hook scope of a hook set through the environment",
           "reset_root()", _KEPT + "; the engine's fork handler keeps its hook from running there"),
    _state("selection.frames", "_ENV_HOOK_LOCK", "lock", "guards _ENV_HOOK_SCOPE", _LOCK_TESTS,
           "kept (taken only while a frame is made on the training thread)"),
    _state("selection.frames", "_ON_ENV_HOOK", "registry", "callbacks when the environment sets a hook (the engine's)",
           "no reset: registered once at import", _KEPT),
    _state("selection.frames", "_ON_DEMAND_FRAMES", "registry", "callbacks for frames that opt in to on-demand traces",
           "no reset: registered once at import", _KEPT),
    _state("selection.frames", "_ON_ROOT_RESOLVED", "registry", "callbacks when the root frame reads the environment "
           "(the engine's)", "no reset: registered once at import", _KEPT),
    _state("selection.frames", "HookScope._ordinals", "class attribute", "the count of hook scopes made, per kind",
           "no reset: scope ids name node-sync folders, so they stay unique for the process's life; "
           "no test depends on their numbers", _KEPT),
    _state("selection.frames", "HookScope._ordinals_lock", "lock", "guards HookScope._ordinals", _LOCK_TESTS,
           "kept (held only for a dict lookup on the training thread)"),
    _state("selection.steps", "CURRENT_STEP", "context variable", "the step block in force",
           "no reset: every step block resets it on exit", "kept (the forking thread's context)"),
    _state("selection.steps", "COUNTERS", "counter", "regions counted per role and stage (the step they count)",
           "cleared, as a new process starts", _KEPT, ("call", "COUNTERS.clear")),
    _state("selection.steps", "_OCCURRENCES", "counter", "traces of one region and step so far (their occurrence)",
           "forget_occurrences()", _KEPT, ("call", "forget_occurrences")),
    _state("selection.steps", "_LOCK", "lock", "guards _OCCURRENCES", _LOCK_TESTS, _NEW_LOCK),
    _state("selection.open_blocks", "_BEGUN", "context variable", "the step this thread or task began and not ended",
           "no reset: a test ends the steps it begins", "kept (the forking thread's context)"),
    _state("selection.open_blocks", "_OPEN", "registry", "every begun step still open",
           "no reset: a test ends the steps it begins", "emptied: a child never ends its parent's steps"),
    _state("selection.open_blocks", "_LOCK", "lock", "guards _OPEN", _LOCK_TESTS, _NEW_LOCK),
    _state("selection.step_meaning", "_RUN", "singleton", "what a step number counts under torchstep-prof run",
           "no reset: set and cleared by the run", _KEPT),
    # --- recording ------------------------------------------------------------------------
    _state("recording.foreign", "_lock", "lock", "guards the walk for someone else's profiler", _LOCK_TESTS,
           "kept (held only for the walk, on the training thread)"),
    _state("recording.foreign", "_clean_at", "cache", "torch's profiler state when a walk found no other profiler",
           "no reset: keyed on torch's state", _KEPT),
    _state("recording.foreign", "_own", "registry", "every torch profile of ours (weak)",
           "no reset: entries go with their profiles", _KEPT),
    _state("recording.labels", "_LOCK", "lock", "guards the label collision check", _LOCK_TESTS, _KEPT),
    _state("recording.labels", "_BY_FILE_NAME", "cache", "the first labels seen for each file-name pair",
           "cleared, so a label in one test never collides with another test's", _KEPT,
           ("call", "_BY_FILE_NAME.clear")),
    _state("recording.labels", "_WARNED", "warn-once", "label collisions warned about", _ONCE, _KEPT,
           ("call", "_WARNED.clear")),
    _state("recording.range_names", "RANGE_NAMES", "cache", "interned range names per role and stage",
           "no reset: a pure function of its key", _KEPT),
    _state("recording.memory_history", "_warned", "warn-once", "allocator-history warnings given", _ONCE, _KEPT,
           ("call", "_warned.clear")),
    _state("recording.nvtx", "_warned", "warn-once", "the NVTX-missing warning given", _ONCE, _KEPT,
           ("set", "_warned", False)),
    _state("recording.session", "_warned_no_cuda", "warn-once", "the no-CUDA warning given", _ONCE, _KEPT,
           ("set", "_warned_no_cuda", False)),
    _state("recording.slot", "NESTED_FAST_PATH", "singleton", "the frame and thread of the nested fast path",
           "no reset: cleared when its trace ends (the fixture checks no trace is left)",
           "cleared with the slot by the engine's fork handler"),
    # --- writing, the hook, metrics, on-demand traces ------------------------------------------
    _state("writing.writer", "thread", "thread", "torchstep_prof-writer: writes stopped traces",
           "no reset: the fixture's tsp.flush() waits until it is idle",
           "forgotten by the engine's fork handler (Engine.after_fork_in_child)"),
    _state("hook.finishing", "thread", "thread", "torchstep_prof-finish-hook: one per hook run",
           "no reset: the fixture's tsp.flush() waits for each", _NOT_THE_CHILDS),
    _state("hook.finishing", "_RUNS", "registry", "hook runs not yet done (the exit wait's list)",
           "no reset: runs leave it when done; the fixture's tsp.flush() waits for them", _NOT_THE_CHILDS),
    _state("hook.finishing", "_RUNS_LOCK", "lock", "guards _RUNS", _LOCK_TESTS, "kept (held only for list updates)"),
    _state("hook.process", "thread", "thread", "torchstep_prof-hook-<stream>: copies a hook's output",
           "no reset: each ends with its command", _NOT_THE_CHILDS),
    _state("hook.process", "_RUNNING", "registry", "hook commands running now (Ctrl-C at exit kills them)",
           "no reset: commands leave it when they end", _NOT_THE_CHILDS),
    _state("hook.process", "_RUNNING_LOCK", "lock", "guards _RUNNING and _cancelled", _LOCK_TESTS,
           "kept (held only for set updates)"),
    _state("hook.process", "_write_lock", "lock", "one hook output line at a time", _LOCK_TESTS,
           "kept (held only for a write)"),
    _state("hook.process", "_cancelled", "global", "hooks cancelled by a Ctrl-C at exit",
           "set back to False, so a test that cancels leaves later hooks running", _KEPT,
           ("set", "_cancelled", False)),
    _state("region_metrics.endpoint", "_started", "global", "the config the metrics endpoint started with",
           "no reset: one endpoint per process (tests/test_metrics.py starts it, then forget()s it)", _KEPT),
    _state("region_metrics.endpoint", "_address", "global", "the endpoint's address", "as _started", _KEPT),
    _state("region_metrics.endpoint", "_server", "global", "the endpoint's HTTP server",
           "as _started", "kept, but its thread is the parent's: a child serves nothing"),
    _state("region_metrics.endpoint", "_LOCK", "lock", "guards the endpoint's start", _LOCK_TESTS, _KEPT),
    _state("region_metrics.endpoint", "_ON_START", "registry", "callbacks when metrics start (the engine's)",
           "no reset: registered once at import", _KEPT),
    _state("region_metrics.endpoint", "_warned", "warn-once", "endpoint warnings given", "forget() clears it", _KEPT),
    _state("region_metrics.server", "thread", "thread", "torchstep_prof metrics server: serves the endpoint",
           "no reset: as the endpoint", _NOT_THE_CHILDS),
    _state("region_metrics.recorder", "thread", "thread", "torchstep_prof metrics: folds recorded times",
           "no reset: idle between folds", "started anew by the recorder's fork handler"),
    _state("region_metrics.recorder", "_LOCAL", "thread-local", "each thread's own list of spans",
           "no reset: forget() empties the lists", "the forking thread's kept, emptied"),
    _state("region_metrics.recorder", "_STORES_LOCK", "lock", "guards the recorder's tables", _LOCK_TESTS, _NEW_LOCK),
    _state("region_metrics.recorder", "_DRAIN_LOCK", "lock", "one drain of the span lists at a time", _LOCK_TESTS,
           _NEW_LOCK),
    _state("region_metrics.recorder", "_UNWRITTEN", "registry", "drained spans the span log has not taken",
           "forget() empties it", "emptied by the recorder's fork handler"),
    _state("region_metrics.recorder", "_FOLDED", "counter", "folded times per series", "forget()", "emptied"),
    _state("region_metrics.recorder", "_SERIES", "cache", "the series each key folds into", "forget()", _KEPT),
    _state("region_metrics.recorder", "_ADMITTED", "registry", "pairs with a series of their own", "forget()", _KEPT),
    _state("region_metrics.recorder", "BOUNDS", "config", "the buckets, set once per process", "forget()", _KEPT),
    _state("region_metrics.recorder", "_folding", "singleton", "the folding thread, once started",
           "no reset: one per process", "started anew by the recorder's fork handler"),
    _state("region_metrics.recorder", "_capped", "warn-once", "the pair cap warned about", "forget()", _KEPT),
    _state("region_metrics.recorder", "WATCHED", "singleton", "what the automatic-trace watch reads (steps, a region)",
           "WATCHED.reset()", "reset by the recorder's fork handler", ("call", "WATCHED.reset")),
    _state("slow_steps.decisions", "DECISIONS", "counter", "automatic-trace decisions: counts, lines, steps traced",
           "DECISIONS.clear()", _KEPT + "; a child traces nothing automatically", ("call", "DECISIONS.clear")),
    _state("slow_steps.why", "_WHY", "cache", "why each automatically traced step was traced",
           "_WHY.clear()", _KEPT, ("call", "_WHY.clear")),
    _state("slow_steps.why", "_LOCK", "lock", "guards _WHY", _LOCK_TESTS, "kept (held only for a dict update)"),
    _state("triggers.watcher", "_AUTO_WARNED", "warn-once", "auto_trace off warnings given", _ONCE, _KEPT,
           ("call", "_AUTO_WARNED.clear")),
    _state("region_metrics.recorder", "_SPANS_ON", "flag", "whether regions append spans (the span log is on)",
           "no reset: tests that log spans run in processes of their own", "cleared: a child logs no spans"),
    _state("region_metrics.recorder", "_SPAN_LISTS", "registry", "every thread's list of spans not yet drained",
           "no reset: as _SPANS_ON", "emptied by the recorder's fork handler"),
    _state("region_metrics.recorder", "_IDLE", "counter", "idle time before each region (spans and metrics on)",
           "forget()", "emptied by the recorder's fork handler"),
    _state("timeline.wall_clock", "_BASE", "cache", "wall minus perf_counter: the span log's, else the first reading",
           "no reset: the same clock for the process's life", _KEPT),
    _state("timeline.wall_clock", "_RECENT_ANCHORS", "registry", "the last 256 clock anchors passed, for the next trace",
           "_RECENT_ANCHORS.clear()", "cleared: the parent's barriers", ("call", "_RECENT_ANCHORS.clear")),
    _state("timeline.wall_clock", "_RECENT_RAY", "registry", "the last 1024 sides of Ray calls noted, for the next trace",
           "_RECENT_RAY.clear()", "cleared: the parent's Ray calls", ("call", "_RECENT_RAY.clear")),
    _state("timeline.wall_clock", "_RAY_NUMBERS", "counter", "Ray call sides noted so far (each goes in one trace)",
           "no reset: numbers only grow", _KEPT),
    _state("timeline.span_log", "_LOG", "singleton", "the process's span log, once started",
           "no reset: tests that log spans run in processes of their own", "forgotten: the file is the parent's"),
    _state("timeline.span_log", "_LOG_LOCK", "lock", "guards the span log's start and anchors", _LOCK_TESTS, _NEW_LOCK),
    _state("timeline.span_log", "_ANCHOR_SEQ", "counter", "clock anchors passed so far, by name",
           "no reset: as _LOG", _KEPT),
    _state("timeline.span_log", "thread", "thread", "torchstep_prof spans: appends the span log's file",
           "no reset: as _LOG", _NOT_THE_CHILDS),
    _state("triggers.running", "ENGINE", "registry", "the engine on-demand plans drive (registered by engine.py)",
           "no reset: registered once at import", _KEPT),
    _state("triggers.running", "ON_DEMAND", "singleton", "the poll thread in force (on-demand traces), and its lock",
           "no reset: the scope that starts it stops it on exit", _ONE_PER_PROCESS),
    _state("triggers.watcher", "thread", "thread", "torchstep_prof-on-demand: polls the trigger folder",
           "no reset: stopped by its scope's exit", _NOT_THE_CHILDS),
    _state("live.open_regions", "_LOCAL", "thread-local", "each thread's open regions (live status)",
           "no reset: every region a test opens it closes", "the forking thread's kept"),
    _state("live.open_regions", "_LISTS", "registry", "every thread's list of open regions",
           "no reset: a dead thread's list is dropped when the status thread reads them",
           "only the forking thread's kept, by the module's fork handler"),
    _state("live.open_regions", "_LISTS_LOCK", "lock", "guards _LISTS", _LOCK_TESTS, _NEW_LOCK),
    _state("live.running", "LIVE", "singleton", "the live-status reporter in force (a stall or on-demand scope), and its lock",
           "no reset: the scope that starts it stops it on exit", _ONE_PER_PROCESS),
    _state("live.reporter", "thread", "thread", "torchstep_prof-live: writes this rank's live status",
           "no reset: stopped by its scope's exit", _NOT_THE_CHILDS),
    _state("live.stall", "thread", "thread", "torchstep_prof-stall-cmd: runs a stall's command once",
           "no reset: it ends with its command (time-limited)", _NOT_THE_CHILDS),
    # --- the engine and its users ------------------------------------------------------------
    _state("engine", "ENGINE", "singleton", "the profiler slot, the writer, deferred hooks, exit work",
           "its warn-once keys cleared; the fixture checks it left no trace recording",
           "made inert by Engine.after_fork_in_child: it writes nothing and runs no hook",
           ("call", "ENGINE._warned.clear")),
    _state("engine", "_WRITER_LOCK", "lock", "makes the one writer", _LOCK_TESTS, "kept (held only to make it)"),
    _state("scopes", "_ENTERED", "context variable", "the scopes entered in this context and their managers",
           "no reset: every scope exits", "kept (the forking thread's context)"),
    _state("scopes", "_CODE_CONFIG", "context variable", "the code's config at each depth",
           "no reset: every scope exits", "kept (the forking thread's context)"),
    _state("integrations.ray", "_SUBMITTED", "registry", "Ray references submitted and not yet got (capped)",
           "_SUBMITTED.clear()", "kept (a child makes no Ray calls of the parent's)", ("call", "_SUBMITTED.clear")),
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
