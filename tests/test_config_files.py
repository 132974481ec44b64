"""load_config / dump_config: JSON, YAML and TOML round trips, and errors naming file and place."""

from __future__ import annotations

import json
import shutil
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings

from strategies import configs
from torchstep_prof.config.model import FinishHookConfig, ProfilerConfig, ScheduleConfig
from torchstep_prof.config.files import dump_config, format_config, load_config, parse_yaml
from torchstep_prof.config.converter import to_dict
from torchstep_prof.errors import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

EXTENSIONS = [".json", ".yaml", ".yml", ".toml"]
ALLOWED = "allowed: .json, .yaml, .yml, .toml"


@pytest.mark.parametrize("ext", EXTENSIONS)
@settings(max_examples=60, deadline=None)
@given(cfg=configs())
def test_file_round_trip(ext: str, cfg: ProfilerConfig) -> None:
    # A fresh directory per example: hypothesis runs many examples per pytest fixture.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"profile{ext}"
        dump_config(cfg, path)
        assert load_config(path) == cfg
        assert os.listdir(tmp) == [path.name]  # no temporary file left behind


@settings(max_examples=60, deadline=None)
@given(configs())
def test_toml_text_is_what_tomllib_reads(cfg: ProfilerConfig) -> None:
    data = tomllib.loads(format_config(cfg, "toml"))
    # TOML has no null: exactly the None fields are left out.
    expected = {k: v for k, v in to_dict(cfg).items() if v is not None}
    for section in ("schedule", "finish_hook"):
        if section in expected:
            expected[section] = {k: v for k, v in expected[section].items() if v is not None}
    assert data == expected


def test_toml_layout_and_defaults_filled_on_load(tmp_path: Path) -> None:
    cfg = ProfilerConfig(ranks=(0, 2), schedule=ScheduleConfig(steps=(1, 3)),
                         finish_hook=FinishHookConfig(cmd='upload "$X"\n', timeout_s=1e-3))
    text = format_config(cfg, "toml")
    assert text.splitlines()[:9] == [
        "enable = true",
        'save_path = "outputs/profile"',
        "discrete = true",
        "gzip = false",
        "summary = true",
        "ranks = [0, 2]",
        "all_ranks = false",
        'contents = []',
        "",
    ]
    assert "[schedule]\nsteps = [1, 3]\n" in text
    assert '[finish_hook]\ncmd = "upload \\"$X\\"\\n"\n' in text
    assert "process_role" not in text and "timeout_s = 0.001" in text
    path = tmp_path / "c.toml"
    path.write_text("[finish_hook]\ncmd = 'x'\n")
    assert load_config(path) == ProfilerConfig(finish_hook=FinishHookConfig(cmd="x"))


def test_yaml_looks_like_the_spec() -> None:
    text = format_config(ProfilerConfig(schedule=ScheduleConfig(steps=(1, 3))), "yaml")
    assert text.startswith("enable: true\nsave_path: outputs/profile\n")
    assert "ranks: [0]\n" in text and "contents: []\n" in text and "process_role: null\n" in text
    assert "schedule:\n  steps: [1, 3]\n  skip_first: 0\n" in text
    assert "\nfinish_hook: null\n" in text and text.endswith("on_demand: null\nmetrics: null\nauto_trace: null\nstall: null\nspans: null\n")
    assert yaml.safe_load(text) == to_dict(ProfilerConfig(schedule=ScheduleConfig(steps=(1, 3))))


def test_json_is_plain_json(tmp_path: Path) -> None:
    dump_config(ProfilerConfig(), tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text()) == to_dict(ProfilerConfig())


def test_yaml_reads_exponent_numbers_and_empty_files(tmp_path: Path) -> None:
    assert parse_yaml("a: 1e-3\nb: 2E5\nc: e5\nd: 1_0") == {"a": 0.001, "b": 200000.0, "c": "e5", "d": 10}
    path = tmp_path / "c.yaml"
    path.write_text("finish_hook:\n  cmd: x\n  timeout_s: 1e-3\n")
    assert load_config(path).finish_hook.timeout_s == 0.001
    path.write_text("# every default\n")
    assert load_config(path) == ProfilerConfig()


def test_extension_case_does_not_matter(tmp_path: Path) -> None:
    dump_config(ProfilerConfig(gzip=True), tmp_path / "C.YAML")
    assert load_config(tmp_path / "C.YAML").gzip is True


def test_dump_to_unknown_format_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"c\.ini: unknown config file format"):
        dump_config(ProfilerConfig(), tmp_path / "c.ini")
    assert list(tmp_path.iterdir()) == []


# (file name, its bytes or None for a directory, every line of the ConfigError)
BAD_FILES = [
    ("c.ini", b"a=1", [f"c.ini: unknown config file format (got '.ini'; {ALLOWED})"]),
    ("config", b"{}", [f"config: unknown config file format (got no extension; {ALLOWED})"]),
    ("c.json", b'{\n  "ranks": [0,\n}\n', ["c.json: invalid JSON at line 3, column 1: Expecting value"]),
    ("c.json", b"", ["c.json: invalid JSON at line 1, column 1: Expecting value"]),
    (
        "c.yaml",
        b"ranks: [0, 1\nschedule:\n  steps: [1]\n",
        ["c.yaml: invalid YAML at line 2, column 9: expected ',' or ']', but got ':' (while parsing a flow sequence)"],
    ),
    (
        "c.yml",
        b"schedule:\n\tsteps: [1]\n",
        ["c.yml: invalid YAML at line 2, column 1: found character '\\t' that cannot start any token "
         "(while scanning for the next token)"],
    ),
    ("c.toml", b"ranks = [0,\nschedule = 1\n", ["c.toml: invalid TOML: Invalid value (at line 2, column 1)"]),
    ("c.toml", b"gzip = true\ngzip = false\n", ["c.toml: invalid TOML: Cannot overwrite a value (at line 2, column 13)"]),
    ("c.yaml", b"- 1\n- 2\n", ["c.yaml: must hold a mapping of keys to values at the top level (got [1, 2])"]),
    ("c.json", b"3", ["c.json: must hold a mapping of keys to values at the top level (got 3)"]),
    ("c.yaml", b"save_path: caf\xe9\n", ["c.yaml: is not UTF-8 text (invalid continuation byte at byte 14)"]),
    ("c.yaml", None, ["c.yaml: cannot be read (Is a directory)"]),
    (
        "c.toml",
        b'gzip = "yes"\nshedule = 1\n[schedule]\nwait = -1\n',
        ["gzip: must be true or false (got 'yes')", "schedule.wait: must be >= 0 (got -1)",
         "shedule: unknown key (did you mean 'schedule'?)"],
    ),
    (
        "c.json",
        b'{"finish_hook": {"cmd": ["up", 3], "per_nod": true}}',
        ["finish_hook.cmd[1]: must be a string (got 3)", "finish_hook.per_nod: unknown key (did you mean 'per_node'?)"],
    ),
    # A key given twice is an error (YAML and JSON parsers keep the last silently), reported with
    # the problems of the values kept.
    (
        "c.yaml",
        b"gzip: true\nschedule:\n  steps: [1]\n  steps: [-2]\ngzip: false\n",
        ["schedule.steps: duplicate key at line 4, column 3 (first at line 3); a key may appear once",
         "gzip: duplicate key at line 5, column 1 (first at line 1); a key may appear once",
         "schedule.steps[0]: must be >= 0 (got -2)"],
    ),
    (
        "c.yml",
        b"finish_hook: {cmd: [up], cmd: x}\n",
        ["finish_hook.cmd: duplicate key at line 1, column 26 (first at line 1); a key may appear once"],
    ),
    (
        "c.json",
        b'{"ranks": [0], "schedule": {"wait": 1, "wait": 2}, "ranks": [1]}',
        ["ranks: duplicate key (given more than once in one object); a key may appear once",
         "schedule.wait: duplicate key (given more than once in one object); a key may appear once"],
    ),
    # Non-finite numbers, however spelled, are errors under their key path.
    (
        "c.yaml",
        b"schedule: {wait: 1e400, active: .inf}\nranks: [.nan]\nfinish_hook: {cmd: x, timeout_s: -.inf}\n",
        ["ranks[0]: must be a finite number (got nan)", "schedule.wait: must be a finite number (got inf)",
         "schedule.active: must be a finite number (got inf)",
         "finish_hook.timeout_s: must be a finite number (got -inf)"],
    ),
    (
        "c.json",
        b'{"schedule": {"wait": 1e400}, "finish_hook": {"cmd": "x", "node_wait_s": NaN, "timeout_s": Infinity}}',
        ["schedule.wait: must be a finite number (got inf)", "finish_hook.node_wait_s: must be a finite number (got nan)",
         "finish_hook.timeout_s: must be a finite number (got inf)"],
    ),
    (
        "c.toml",
        b'[schedule]\nwait = 1e400\n[finish_hook]\ncmd = "x"\ntimeout_s = inf\nnode_wait_s = nan\n',
        ["schedule.wait: must be a finite number (got inf)", "finish_hook.node_wait_s: must be a finite number (got nan)",
         "finish_hook.timeout_s: must be a finite number (got inf)"],
    ),
]


@pytest.mark.parametrize(("name", "content", "expected"), BAD_FILES, ids=[f"{n}-{c!r:.30}" for n, c, _ in BAD_FILES])
def test_bad_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, content: bytes | None,
                   expected: list[str]) -> None:
    monkeypatch.chdir(tmp_path)  # relative names, so the messages are exact
    if content is None:
        Path(name).mkdir()
    else:
        Path(name).write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(name)
    assert [str(p) for p in info.value.problems] == expected


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config("missing.toml")
    assert str(info.value) == "missing.toml: cannot be read (No such file or directory)"


def test_a_path_that_cannot_be_read_as_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("c.yaml").mkdir()  # unreadable as a file even for root, unlike a chmod 0 file
    with pytest.raises(ConfigError) as info:
        load_config("c.yaml")
    assert str(info.value) == "c.yaml: cannot be read (Is a directory)"


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="needs a non-root user: root reads a file whose permissions forbid it (the directory case above runs)",
)
def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("c.yaml").write_text("gzip: true\n")
    Path("c.yaml").chmod(0)
    with pytest.raises(ConfigError) as info:
        load_config("c.yaml")
    assert str(info.value) == "c.yaml: cannot be read (Permission denied)"


@pytest.mark.parametrize(
    "text",
    ["\x85", "a\u2028b", "\x7f", "\x00", "café", "😀", '"\\', "line\nbreak\r", " lead", "yes", "null",
     "1e3", "0x10", "~", "2024-01-01", "[1]", "a: b", "# c", "'q'"],
)
@pytest.mark.parametrize("ext", [".json", ".yaml", ".toml"])
def test_tricky_strings_survive_every_format(tmp_path: Path, ext: str, text: str) -> None:
    # Not in save_path: that refuses '"', '\\' and control characters (test_save_path_characters).
    cfg = ProfilerConfig(process_role=f"r{text}", finish_hook=FinishHookConfig(cmd=["run", text], relocate=(text,)))
    dump_config(cfg, tmp_path / f"c{ext}")
    assert load_config(tmp_path / f"c{ext}") == cfg


# --- hostile files: an alias bomb, a huge file, a FIFO in a config file's place -----------------

# 310 bytes that would expand to 9**7 (4.8 million) strings in the checks that walk the document.
ALIAS_BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
    for prev, name in zip([None, "a", "b", "c", "d", "e", "f"], "abcdefg")
)


def test_a_yaml_alias_bomb_is_refused_at_its_first_alias_in_little_memory(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    script = (
        "import torchstep_prof as tsp\n"
        f"try:\n    tsp.load_config({str(path)!r})\nexcept tsp.ConfigError as exc:\n    print(exc)\n"
    )
    # 300 MiB of address space: the expansion alone takes more.
    done = subprocess.run(
        ["prlimit", f"--as={300 * 1024 * 1024}", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TORCHSTEP_PROF_SUMMARY": "0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"{path}: invalid YAML at line 2, column 8: alias *a refused: "
        "a config file may not use YAML aliases (write the value out)"
    )


def test_an_alias_in_an_override_is_refused_and_an_anchor_alone_is_fine() -> None:
    from torchstep_prof.config.overrides import apply_overrides

    with pytest.raises(ConfigError, match=r"alias \*a refused"):
        apply_overrides(ProfilerConfig(), ["ranks=[*a]"])
    assert apply_overrides(ProfilerConfig(), ["ranks=&a [1]"]).ranks == (1,)


def test_a_config_file_over_the_size_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("big.yaml").write_text("# padding\n" * 200_000)  # 2 MB of comments: a valid, empty YAML file
    with pytest.raises(ConfigError) as info:
        load_config("big.yaml")
    assert str(info.value) == "big.yaml: is larger than 1024 KiB, the most a config file may hold"


def test_a_fifo_in_a_config_files_place_is_refused_without_waiting(tmp_path: Path) -> None:
    import threading

    os.mkfifo(tmp_path / "c.yaml")  # no writer ever opens it: reading would wait for ever
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_config(tmp_path / "c.yaml")
        except BaseException as exc:  # the ConfigError expected, or anything else, reported below
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "load_config waited on the FIFO"
    assert isinstance(outcome[0], ConfigError)
    assert str(outcome[0]) == f"{tmp_path / 'c.yaml'}: is not a regular file (a FIFO, socket or device is never read)"


@pytest.mark.skipif(
    not (hasattr(os, "geteuid") and os.geteuid() == 0) or not shutil.which("setpriv"),
    reason="needs root and setpriv to act as a second user (nobody) planting the FIFO",
)
def test_a_fifo_another_user_planted_as_the_jobs_config_file_is_an_error_not_a_hang(tmp_path: Path) -> None:
    # A folder other users may write, as a cluster's shared folders are (tmp_path's parents are
    # root's alone, so it lives in the system's temporary folder).
    shared = Path(tempfile.mkdtemp(prefix="tsp-shared-"))
    shared.chmod(0o1777)
    try:
        _planted_fifo_is_refused(shared, tmp_path)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _planted_fifo_is_refused(shared: Path, tmp_path: Path) -> None:
    import subprocess

    from script_helpers import run_script

    planted = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "mkfifo", str(shared / "profile.yaml")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert planted.returncode == 0, planted.stderr
    done = run_script(
        """
        import torchstep_prof as tsp
        try:
            with tsp.step(1):
                pass
        except tsp.ConfigError as exc:
            print("refused:", exc)
        """,
        tmp_path,
        timeout=120,  # a read of the FIFO would wait here for ever
        TORCHSTEP_PROF_CONFIG=str(shared / "profile.yaml"),
    )
    assert done.returncode == 0, done.stderr
    assert "is not a regular file (a FIFO, socket or device is never read)" in done.stdout, done.stdout + done.stderr
