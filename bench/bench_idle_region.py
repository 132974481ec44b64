"""What a region costs when it does not profile (docs/performance.md: within 2x of a bare
class-based context manager).

Cases, each timed side by side with its baseline in the same scopes:

(a) no schedule in force;
(b) a schedule in force, the step not selected;
(c) the step selected, the rank not (``tsp.ranks(5)`` on rank 0).

``with tsp.profile_region(...)`` is compared with a bare class-based context manager (an object
made per ``with``, empty ``__enter__`` / ``__exit__``). A ``@tsp.profiled`` call is compared with
the same plain function called inside that bare context manager: a decorated call is "a region
around each call" (docs/performance.md), so that is the cost it is promised to stay within 2x of. Its ratio to
the bare call and to a do-nothing pass-through decorator is printed as information.

Each of (b) and (c) is measured every way a region learns its step: inside ``step(n)``, after
``begin_step(n)``, with ``step=`` (``profile_region`` only: ``@profiled`` has no such form) and
by the per-(role, stage) counter (no step block), under an explicit list and under a cycle
(``skip_first``/``wait``/``active``). For (c) by the counter every step is selected
(``active=1, repeat=0``), so the rank alone decides. Information only: ``torch.profiler.
record_function`` with no profiler running.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, interleave, loop, ratio_stat, ratio_target, stat  # noqa: E402

LIMIT = 2.0
NEVER = 10**9  # a step number no loop here reaches: "a schedule in force, step not selected"


class Bare:
    """The baseline: a class-based context manager that does nothing."""

    __slots__ = ()

    def __enter__(self) -> "Bare":
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def plain() -> None:
    return None


def passthrough(fn):  # type: ignore[no-untyped-def]
    """The least any argument-forwarding decorator costs."""

    @functools.wraps(fn)
    def run(*args, **kwargs):  # type: ignore[no-untyped-def]
        return fn(*args, **kwargs)

    return run


def _first_steps(tsp) -> None:  # type: ignore[no-untyped-def]
    # The steady state: in the first two step blocks under a schedule, regions also check their
    # labels (once per label); that one-time cost is not what a training loop pays per step.
    for n in (1, 2):
        with tsp.step(n), tsp.profile_region("actor", "compute_log_prob"):
            pass


def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    import torch

    import torchstep_prof as tsp

    number = 20_000
    rounds = 12 if quick else 40
    report = Report("bench_idle_region")

    @tsp.profiled(role="critic")
    def update() -> None:
        return None

    wrapped = passthrough(plain)
    ns = {
        "tsp": tsp,
        "Bare": Bare,
        "plain": plain,
        "update": update,
        "wrapped": wrapped,
        "record_function": torch.profiler.record_function,
    }
    region = loop("with tsp.profile_region('actor', 'compute_log_prob'):\n    pass", number, ns)
    region_step_arg = loop("with tsp.profile_region('actor', 'compute_log_prob', step=3):\n    pass", number, ns)
    bare = loop("with Bare():\n    pass", number, ns)
    call_in_bare = loop("with Bare():\n    plain()", number, ns)
    decorated = loop("update()", number, ns)

    def measure(case: str, what: str, step_arg: bool = False) -> None:
        if step_arg:  # profile_region(..., step=n): @profiled has no such form
            samples = interleave({"bare": bare, "region": region_step_arg}, rounds)
            report.add(stat(f"{case}: profile_region(step=)", samples["region"]))
            report.targets.append(
                ratio_target(f"idle_region_{case}", samples["bare"], samples["region"], LIMIT, f"profile_region vs bare cm, {what}")
            )
            return
        samples = interleave(
            {"bare": bare, "region": region, "call_in_bare": call_in_bare, "profiled": decorated},
            rounds,
        )
        report.add(stat(f"{case}: profile_region", samples["region"]))
        report.add(stat(f"{case}: @profiled call", samples["profiled"]))
        report.targets.append(
            ratio_target(f"idle_region_{case}", samples["bare"], samples["region"], LIMIT, f"profile_region vs bare cm, {what}")
        )
        report.targets.append(
            ratio_target(
                f"idle_profiled_{case}", samples["call_in_bare"], samples["profiled"], LIMIT, f"@profiled call vs call in bare cm, {what}"
            )
        )

    # Baselines, outside every scope.
    base = interleave(
        {
            "empty": loop("pass", number, ns),
            "bare": bare,
            "plain": loop("plain()", number, ns),
            "wrapped": loop("wrapped()", number, ns),
            "call_in_bare": call_in_bare,
        },
        rounds,
    )
    report.add(stat("empty loop iteration", base["empty"]))
    report.add(stat("baseline: with Bare(): pass", base["bare"]))
    report.add(stat("baseline: plain() call", base["plain"]))
    report.add(stat("baseline: pass-through decorator call", base["wrapped"]))
    report.add(stat("baseline: with Bare(): plain()", base["call_in_bare"]))

    # The first region outside every scope reads the environment once: not what is measured.
    with tsp.profile_region("actor", "compute_log_prob"):
        pass

    measure("a_no_schedule", "no schedule in force")
    a_plain = interleave({"plain": loop("plain()", number, ns), "profiled": decorated, "wrapped": loop("wrapped()", number, ns)}, rounds)
    report.add(ratio_stat("a_no_schedule: @profiled / plain() call", a_plain["plain"], a_plain["profiled"], "info, no target"))
    report.add(ratio_stat("a_no_schedule: @profiled / pass-through decorator", a_plain["wrapped"], a_plain["profiled"], "info, no target"))

    # Entering a schedule on a rank that may profile pays torch's one-time start-up (~1 s) here.
    with tsp.configure(summary=False), tsp.schedule(steps=[NEVER]):
        _first_steps(tsp)
        with tsp.step(3):
            measure("b_step_not_selected", "schedule in force, step not selected, inside step(n)")
            b_plain = interleave({"plain": loop("plain()", number, ns), "profiled": decorated}, rounds)
            report.add(ratio_stat("b_step_not_selected: @profiled / plain() call", b_plain["plain"], b_plain["profiled"], "info, no target"))
        measure("b_by_counter", "schedule in force, step not selected, no step block (counter)")
        measure("b_step_arg", "schedule in force, step not selected, step= given", step_arg=True)
        tsp.begin_step(3)
        measure("b_after_begin_step", "schedule in force, step not selected, after begin_step(n)")
        tsp.end_step()

    with tsp.configure(summary=False), tsp.schedule(steps=[1]), tsp.ranks(5):
        _first_steps(tsp)
        with tsp.step(1):
            measure("c_rank_not_selected", "step selected, rank 0 not in ranks(5), inside step(n)")
        tsp.begin_step(1)
        measure("c_after_begin_step", "step selected, rank 0 not in ranks(5), after begin_step(n)")
        tsp.end_step()
    with tsp.configure(summary=False), tsp.schedule(steps=[3]), tsp.ranks(5):
        _first_steps(tsp)
        measure("c_step_arg", "step selected, rank 0 not in ranks(5), step= given", step_arg=True)

    # Cycle schedules (torch.profiler's wait/warmup/active): the same decisions by arithmetic.
    with tsp.configure(summary=False), tsp.schedule(skip_first=NEVER):
        _first_steps(tsp)
        with tsp.step(3):
            measure("b_cycle_step_not_selected", "cycle schedule, step not selected, inside step(n)")
        measure("b_cycle_by_counter", "cycle schedule, step not selected, no step block (counter)")
        measure("b_cycle_step_arg", "cycle schedule, step not selected, step= given", step_arg=True)
    # Every step selected (a cycle of one active step, repeated), so the counter's steps are
    # selected too and only the rank decides.
    with tsp.configure(summary=False), tsp.schedule(active=1, repeat=0), tsp.ranks(5):
        _first_steps(tsp)
        with tsp.step(3):
            measure("c_cycle_rank_not_selected", "cycle schedule, rank 0 not in ranks(5), inside step(n)")
        measure("c_by_counter", "every step selected, rank 0 not in ranks(5), no step block (counter)")
        measure("c_cycle_step_arg", "cycle schedule, rank 0 not in ranks(5), step= given", step_arg=True)

    rf = interleave(
        {"bare": loop("with Bare():\n    pass", 2_000, ns), "record_function": loop("with record_function('x'):\n    pass", 2_000, ns)},
        max(6, rounds // 4),
    )
    report.add(stat("reference: torch record_function, no profiler", rf["record_function"]))
    report.add(ratio_stat("reference: record_function / bare cm", rf["bare"], rf["record_function"], "info, no target"))
    report.notes.append(f"{number} iterations per sample, {rounds} interleaved rounds; ratios are of medians, min/max of per-round ratios")
    return report


if __name__ == "__main__":
    _timing.main(run)
