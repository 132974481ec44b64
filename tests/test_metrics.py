"""Region metrics (``tsp.metrics``, the ``metrics`` config section), seen through the endpoint a
user scrapes, the exit summary and the traces: unit tests in this process, plus fresh
interpreters for what only a whole process shows (lazy import, a port in use, the summary)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import re
import socket
import sys
import threading
import urllib.request
import warnings

import pytest

import torchstep_prof as tsp
from torchstep_prof.config.converter import from_dict
from torchstep_prof.config.overrides import apply_overrides
from torchstep_prof.region_metrics.endpoint import endpoint, forget
from torchstep_prof.region_metrics.recorder import CellStats, quantile

from script_helpers import run_script
from trace_helpers import load_trace, range_names, trace_files

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client (the [metrics] extra) is not installed")

LOCAL = {"port": 0, "addr": "127.0.0.1"}  # any free port on loopback: this process's endpoint


@pytest.fixture(scope="module", autouse=True)
def _endpoint():
    """This process's one endpoint, started first with the tests' config (later scopes reuse it)."""
    with tsp.configure(summary=False), tsp.metrics(**LOCAL):
        pass
    assert endpoint() is not None
    yield
    forget()  # later test modules of this process render summaries without metrics lines
    assert endpoint() is None


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the endpoint serves now, over HTTP: (name, sorted labels) -> value."""
    address = endpoint()
    assert address is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{address[1]}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def count(samples, role: str, stage: str) -> float:
    found = [v for (name, labels), v in samples.items()
             if name == "torchstep_prof_region_seconds_count" and ("role", role) in labels and ("stage", stage) in labels]
    return sum(found)


def buckets(samples, role: str, stage: str) -> dict[str, float]:
    return {dict(labels)["le"]: v for (name, labels), v in samples.items()
            if name == "torchstep_prof_region_seconds_bucket" and dict(labels).get("role") == role
            and dict(labels).get("stage") == stage}


# --- configuration -------------------------------------------------------------------------


def test_bad_metrics_config_names_every_key() -> None:
    with pytest.raises(tsp.ConfigError) as caught:
        from_dict({"metrics": {"port": 70000, "addr": "not an address", "buckets": [-1, 0.5]}})
    text = str(caught.value)
    assert "metrics.port: must be a TCP port, an integer from 0 to 65535 (got 70000" in text
    assert "metrics.addr: must be an IP address or a host name" in text and "'not an address'" in text
    assert "metrics.buckets[0]: must be a finite number of seconds > 0 (got -1)" in text
    with pytest.raises(tsp.ConfigError, match=r"metrics.buckets: must be a non-empty list of increasing upper bounds.*got \[0.5, 0.1\]"):
        from_dict({"metrics": {"buckets": [0.5, 0.1]}})
    with pytest.raises(tsp.ConfigError, match=r"metrics.port: must be a TCP port.*got -1"):
        tsp.metrics(port=-1)
    with pytest.raises(tsp.ConfigError, match=r"metrics.port: .*got 'x'"):
        apply_overrides(tsp.ProfilerConfig(), ["metrics.port=x"])


@pytest.mark.parametrize("addr", ["999.1.2.3", "10.0.0.256", "1.2.3", "a..b", "-node", "node_1", "nöde"])
def test_an_address_that_is_not_one_is_a_config_error(addr) -> None:
    with pytest.raises(tsp.ConfigError) as caught:
        tsp.metrics(addr=addr)
    assert str(caught.value) == (
        f"metrics.addr: must be an IP address or a host name to listen on (got {addr!r}; e.g. 0.0.0.0, 127.0.0.1, ::)"
    )


@pytest.mark.parametrize("addr", ["0.0.0.0", "127.0.0.1", "::", "::1", "localhost", "gpu-node7", "node7.cluster.local"])
def test_addresses_and_host_names_are_accepted(addr) -> None:
    assert tsp.MetricsConfig(addr=addr).addr == addr


def test_the_default_port_is_outside_the_exporters_range_for_eight_local_ranks() -> None:
    port = tsp.MetricsConfig().port
    assert port == 18400
    assert not any(9100 <= p <= 9999 for p in range(port, port + 8))  # 9400: dcgm-exporter


def test_metrics_section_from_overrides_files_and_the_run_option(tmp_path) -> None:
    config = apply_overrides(tsp.ProfilerConfig(), ["metrics.port=9400"])
    assert config.metrics == tsp.MetricsConfig(port=9400) and config.metrics.enable
    path = tmp_path / "c.yaml"
    path.write_text("metrics:\n  port: 9500\n  buckets: [0.01, 1]\n")
    assert tsp.load_config(path).metrics == tsp.MetricsConfig(port=9500, buckets=(0.01, 1))
    assert tsp.ProfilerConfig().metrics is None  # off unless asked for
    from torchstep_prof.cli import build_parser
    from torchstep_prof.cli.run_cmd import build_config

    args = build_parser().parse_args(["run", "--steps", "2", "--metrics-port", "9410", "train.py"])
    assert build_config(args).metrics == tsp.MetricsConfig(port=9410)


def test_callbacks_metrics_argument() -> None:
    from torchstep_prof.integrations._driver import build_scopes

    for given, port in ((9411, 9411), (True, 18400), ({"port": 9412, "addr": "127.0.0.1"}, 9412)):
        scopes = build_scopes(None, None, None, None, {"metrics": given})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tsp.MetricsWarning)  # the endpoint is this module's
            with scopes[0]:
                assert tsp.effective_config().metrics.port == port
    with scopes[0].__class__({"metrics": None}):
        assert tsp.effective_config().metrics is None


# --- what is counted -------------------------------------------------------------------------


def test_regions_steps_and_decorated_calls_are_scraped() -> None:
    @tsp.profiled(role="m-deco")
    def work() -> int:
        return 1

    before = scrape()
    with tsp.metrics(**LOCAL):
        for n in range(1, 8):
            with tsp.step(n):
                with tsp.profile_region("m-plain", "update"):
                    work()
        with tsp.profile_region("m-plain", "outside"):  # no step block, no schedule: counted too
            pass
    with tsp.profile_region("m-plain", "update"):  # outside the scope: metrics off, not counted
        pass
    after = scrape()
    assert count(after, "m-plain", "update") == 7
    assert count(after, "m-deco", "work") == 7
    assert count(after, "m-plain", "outside") == 1
    def steps(samples):
        return sum(v for (name, _), v in samples.items() if name == "torchstep_prof_step_seconds_count")

    assert steps(after) - steps(before) == 7
    labels = dict(next(k[1] for k in after if k[0] == "torchstep_prof_region_seconds_count"))
    assert set(labels) == {"role", "stage", "rank", "world_size", "node"}
    assert (labels["rank"], labels["world_size"], labels["node"]) == ("0", "1", socket.gethostname())
    assert buckets(after, "m-plain", "update")["+Inf"] == 7
    assert ("torchstep_prof_traces_written_total", (("node", socket.gethostname()), ("rank", "0"), ("world_size", "1"))) in after


def test_threads_count_each_in_their_own_counters() -> None:
    def work(scoped: bool) -> None:
        if scoped:
            with tsp.metrics(**LOCAL):
                for _ in range(50):
                    with tsp.profile_region("m-thread", "scoped"):
                        pass
        else:
            for _ in range(50):
                with tsp.profile_region("m-thread", "copied"):
                    pass

    with tsp.metrics(**LOCAL):
        threads = [threading.Thread(target=work, args=(True,)) for _ in range(4)]
        # A thread starts outside every scope; one run in a copy of this context is inside it.
        threads += [threading.Thread(target=contextvars.copy_context().run, args=(work, False)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    samples = scrape()
    assert count(samples, "m-thread", "scoped") == 200
    assert count(samples, "m-thread", "copied") == 200


def test_asyncio_tasks_time_their_own_regions() -> None:
    release = asyncio.Event

    async def long(gate) -> None:
        with tsp.profile_region("m-task", "long"):
            await gate.wait()
            await asyncio.sleep(0.3)

    async def short(gate) -> None:
        with tsp.profile_region("m-task", "short"):
            await asyncio.sleep(0)
        gate.set()

    async def main() -> None:
        gate = release()
        # The long ones enter first and stay open while the short ones enter and exit: a start
        # time shared between tasks would give the short ones the long ones' time, or back.
        await asyncio.gather(*(long(gate) for _ in range(3)), *(short(gate) for _ in range(5)))

    with tsp.metrics(port=0, addr="127.0.0.1", buckets=[0.2, 60]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tsp.MetricsWarning)  # the first scope's buckets are kept
            asyncio.run(main())
    samples = scrape()
    assert count(samples, "m-task", "long") == 3 and count(samples, "m-task", "short") == 5
    long_buckets, short_buckets = buckets(samples, "m-task", "long"), buckets(samples, "m-task", "short")
    le_02 = max((le for le in long_buckets if le != "+Inf" and float(le) < 0.3), key=float)
    assert long_buckets[le_02] == 0, long_buckets  # every long task took >= 0.3 s
    assert short_buckets[le_02] == 5, short_buckets  # no short one did


def test_regions_in_a_profiled_trace_still_count_and_profile_the_same(save_dir, tmp_path) -> None:
    def loop(counted: str) -> None:  # the per-process counter of each (role, stage) counts on
        for n in range(1, 5):
            with tsp.step(n):
                with tsp.profile_region("m-trace", "update"):
                    with tsp.profile_region("m-trace", "inner"):  # the nested fast path, untimed
                        pass
        for _ in range(3):  # by the counter: its second entry is step 2
            with tsp.profile_region("m-trace", counted):
                pass

    with tsp.schedule(steps=[2]), tsp.configure(save_path=str(tmp_path / "off"), summary=False):
        loop("counted-off")
    before = scrape()
    with tsp.metrics(**LOCAL), tsp.schedule(steps=[2]), tsp.configure(save_path=str(save_dir)):
        loop("counted")
    tsp.flush()
    after = scrape()
    for stage, n in (("update", 4), ("inner", 4), ("counted", 3)):
        assert count(after, "m-trace", stage) - count(before, "m-trace", stage) == n
    def names(folder):
        return sorted(p.name.split("_pid")[0] for p in trace_files(folder))

    assert names(save_dir) == [n.replace("counted-off", "counted") for n in names(tmp_path / "off")] == [
        "m-trace_counted_step2_rank0-of-1", "m-trace_update_step2_rank0-of-1"]  # fmt: skip
    update = next(p for p in trace_files(save_dir) if "update" in p.name)
    assert "m-trace/inner" in range_names(load_trace(update))


_CASES = itertools.count(1)


@pytest.mark.parametrize(
    ("scope", "steps"),
    [
        (lambda: tsp.schedule(wait=1, active=1, repeat=2), [2, 4]),  # a cycle
        (lambda: tsp.schedule(steps=[3]), [3]),
        (contextlib.ExitStack, []),  # no schedule: nothing profiled
    ],
    ids=["cycle", "list", "no-schedule"],
)
@pytest.mark.parametrize("rank", [0, 1], ids=["rank-selected", "rank-not-selected"])
def test_timed_regions_decide_as_untimed_ones(scope, steps, rank, tmp_path) -> None:
    """A timed region takes another path to the one rule (no cached no): the same traces with
    metrics on as off, by step=, by the counter and inside step blocks."""

    def loop(tag: str) -> None:
        for n in range(1, 6):
            with tsp.step(n), tsp.profile_region("m-rule", f"block-{tag}"):
                pass
            with tsp.profile_region("m-rule", f"given-{tag}", step=n):
                pass
            with tsp.profile_region("m-rule", f"counted-{tag}"):
                pass

    def written(folder) -> list[str]:
        if not folder.exists():
            return []
        return sorted(re.sub(r"-\d+-o(n|ff)_", "_", p.name.split("_rank")[0]) for p in trace_files(folder))

    off, on = tmp_path / "off", tmp_path / "on"
    case = next(_CASES)  # counters count per process: fresh stages for each case
    with scope(), tsp.ranks(rank), tsp.configure(save_path=str(off), summary=False):
        loop(f"{case}-off")
    with tsp.metrics(**LOCAL), scope(), tsp.ranks(rank), tsp.configure(save_path=str(on), summary=False):
        loop(f"{case}-on")
    tsp.flush()
    expected = sorted(f"m-rule_{kind}_step{n}" for kind in ("block", "given", "counted") for n in steps)
    assert written(off) == (expected if rank == 0 else [])
    assert written(on) == written(off)


def test_fused_step_with_threads_in_the_trace(save_dir) -> None:
    def other() -> None:
        with tsp.profile_region("m-fused", "thread"):
            pass

    before = scrape()
    with tsp.metrics(**LOCAL), tsp.schedule(steps=[1]), tsp.configure(discrete=False, save_path=str(save_dir)):
        with tsp.step(1):
            with tsp.profile_region("m-fused", "main"):
                t = threading.Thread(target=contextvars.copy_context().run, args=(other,))
                t.start()
                t.join()
    tsp.flush()
    after = scrape()
    assert count(after, "m-fused", "main") - count(before, "m-fused", "main") == 1
    assert count(after, "m-fused", "thread") - count(before, "m-fused", "thread") == 1
    trace = load_trace(trace_files(save_dir)[0])
    assert {"m-fused/main", "m-fused/thread"} <= set(range_names(trace)) | {
        e.get("name") for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}


def test_quantiles_from_buckets() -> None:
    stats = CellStats(counts=(2, 6, 2, 0), sum_s=1.0, max_s=0.25)
    bounds = [0.01, 0.1, 1.0]
    assert quantile(0.5, stats, bounds) == pytest.approx(0.01 + 0.09 * 3 / 6)
    assert quantile(0.9, stats, bounds) == pytest.approx(0.25)  # capped at the max seen
    assert quantile(0.1, stats, bounds) == pytest.approx(0.005)


# --- whole processes -------------------------------------------------------------------------


def test_import_and_regions_never_import_prometheus_client(tmp_path) -> None:
    done = run_script(
        """
        import sys
        import torchstep_prof as tsp
        with tsp.schedule(steps=[10**9]):
            for n in range(1, 4):
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    pass
        with tsp.profile_region("actor", "update"):
            pass
        tsp.metrics(port=9400)  # made, not entered: nothing is served
        print("loaded:", "prometheus_client" in sys.modules)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "loaded: False" in done.stdout


def test_environment_turns_metrics_on_and_the_summary_has_a_line_per_region(tmp_path) -> None:
    done = run_script(
        """
        import torchstep_prof as tsp
        for n in range(1, 11):
            with tsp.step(n):
                with tsp.profile_region("actor", "update"):
                    pass
                with tsp.profile_region("critic", "value"):
                    pass
        """,
        tmp_path,
        TORCHSTEP_PROF_OVERRIDES="metrics.port=0 metrics.addr=127.0.0.1",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("metrics actor/update: 10 times, p50 ") and " p90 " in line and " max " in line
               for line in lines), done.stdout  # fmt: skip
    assert any(line.startswith("metrics critic/value: 10 times, p50 ") for line in lines), done.stdout
    assert any(line.startswith("metrics step: 10 times, p50 ") for line in lines), done.stdout


def test_a_port_in_use_is_one_warning_and_training_goes_on(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_script(
            f"""
            import warnings
            warnings.simplefilter("error")  # -W error: a warning must still never raise
            import torchstep_prof as tsp
            from torchstep_prof.region_metrics.endpoint import endpoint, forget
            for _ in range(3):
                with tsp.metrics(port={port}, addr="127.0.0.1"):
                    with tsp.step(1), tsp.profile_region("actor", "update"):
                        pass
            print("endpoint:", endpoint())
            """,
            tmp_path,
        )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(f"cannot serve metrics on 127.0.0.1:{port}") == 1, done.stderr
    assert "MetricsWarning" in done.stderr
    assert "endpoint: None" in done.stdout
    assert "metrics actor/update: 3 times" in done.stdout


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_starts_with_none_of_the_parents_times(tmp_path) -> None:
    done = run_script(
        """
        import os
        import torchstep_prof as tsp
        from torchstep_prof.region_metrics import recorder
        with tsp.configure(summary=False), tsp.metrics(port=0, addr="127.0.0.1"):
            for _ in range(5):
                with tsp.profile_region("actor", "update"):
                    pass
            pid = os.fork()
            if pid == 0:
                with tsp.profile_region("actor", "update"):
                    pass
                print("child", recorder.snapshot()[("actor", "update")].count, flush=True)
                os._exit(0)
            os.waitpid(pid, 0)
            print("parent", recorder.snapshot()[("actor", "update")].count, flush=True)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "child 1" in done.stdout and "parent 5" in done.stdout


def test_run_metrics_port_times_every_step_and_its_region_forwards(tmp_path) -> None:
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent / "scripts" / "train_tiny.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "run", "--steps", "2,3", "--region", "Encoder",
         "--metrics-port", "0", "--set", "metrics.addr=127.0.0.1", "--save-path", str(tmp_path / "out"),
         str(script), "--steps", "4"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The --region forwards of every step, not only of the selected ones (docs/zero-code.md).
    assert "metrics Encoder/forward: 4 times, p50 " in done.stdout, done.stdout
    # Every step is timed, boundary to boundary: the 4 optimizer steps (2 and 3 by their blocks).
    assert "metrics step: 4 times, p50 " in done.stdout, done.stdout


def test_lightning_callback_metrics_times_every_step(tmp_path) -> None:
    pytest.importorskip("lightning", reason="lightning (the [lightning] extra) is not installed")
    done = run_script(
        """
        import torch
        import lightning.pytorch as pl
        from torchstep_prof.integrations.lightning import TorchstepProfCallback

        class Tiny(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(8, 1)
            def training_step(self, batch, batch_idx):
                x, y = batch
                return torch.nn.functional.mse_loss(self.layer(x), y)
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        data = torch.utils.data.TensorDataset(torch.randn(24, 8), torch.randn(24, 1))
        trainer = pl.Trainer(
            max_steps=6, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            callbacks=[TorchstepProfCallback(metrics={"port": 0, "addr": "127.0.0.1"})],
        )
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "metrics step: 6 times, p50 " in done.stdout, done.stdout
    assert "metrics trainer/training_step: 6 times, p50 " in done.stdout, done.stdout
