"""The documentation tells the truth: docstring examples run, and the README and docs/ hold.

Docstring examples that need a training job or files of the reader's (``# doctest: +SKIP``) are
shown, not run; every other one is executed here. The README is the user's guide and the
reference lives in docs/<topic>.md: their links and anchors resolve, their Python snippets parse,
their shell commands are accepted by the real command line, and the claims checked below (error
messages, variables, metric series, scope signatures, the CHANGELOG's version) match the package.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import pkgutil
import re
import shlex
from pathlib import Path

import pytest

import torchstep_prof

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(torchstep_prof.__path__, prefix="torchstep_prof.")
    if not info.name.endswith("__main__")
)
# Integrations import their framework: without it installed, say so instead of failing.
FRAMEWORKS = {
    "torchstep_prof.integrations.lightning": "lightning.pytorch",
    "torchstep_prof.integrations.ray": "ray",
    "torchstep_prof.integrations.transformers": "transformers",
}


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name, tmp_path, monkeypatch):
    if module_name in FRAMEWORKS:
        pytest.importorskip(FRAMEWORKS[module_name], reason=f"{FRAMEWORKS[module_name]} is not installed")
    monkeypatch.chdir(tmp_path)  # an example that writes outputs/ writes it here
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {module_name} failed (see output above)"


# --- the README and docs/ ----------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
PAGE_IDS = [str(p.relative_to(ROOT)) for p in PAGES]
README_MAX_LINES = 420

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _blocks(path: Path, lang: str) -> list[str]:
    return [body for kind, body in _FENCE.findall(path.read_text()) if kind == lang]


def _prose(path: Path) -> str:
    """The page without its code blocks (a `#` or `](` inside code is not markdown)."""
    return _FENCE.sub("", path.read_text())


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", _prose(path), re.M)}


def test_readme_stays_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move reference material to docs/"


def test_readme_links_every_docs_page_and_each_exists():
    linked = {t.split("#")[0] for t in _LINK.findall(_prose(README)) if t.startswith("docs/") and ".md" in t}
    missing = sorted(t for t in linked if not (ROOT / t).is_file())
    assert not missing, f"README links to docs that do not exist: {missing}"
    unlinked = sorted(str(p.relative_to(ROOT)) for p in DOCS if str(p.relative_to(ROOT)) not in linked)
    assert not unlinked, f"docs pages the README never links to: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_relative_links_and_anchors_resolve(page: Path):
    bad = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not bad, f"{page.name}: " + "; ".join(bad)


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_each_docs_page_opens_with_its_purpose(page: Path):
    head = page.read_text().split("\n")[:4]
    assert head[0].startswith("# ") and head[1] == "", f"{page.name} must open with '# Title' and a blank line"
    assert head[2] and not head[2].startswith(("#", "`", "|", "-")), f"{page.name}: line 3 must say the page's purpose"
    assert head[3] == "", f"{page.name}: the purpose is one line, followed by a blank line"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_python_snippets_are_python(page: Path):
    for i, block in enumerate(_blocks(page, "python")):
        try:
            ast.parse(block)
        except SyntaxError as exc:  # pragma: no cover - the assertion below reports it
            pytest.fail(f"{page.name}: python block {i + 1} does not parse: {exc}\n{block}")


def _commands(page: Path) -> list[list[str]]:
    """Every `torchstep-prof ...` / `python -m torchstep_prof ...` line of the page's bash blocks
    and of the `$ ...` lines of its plain blocks (a console session shown with its output)."""
    found = []
    shown = ["\n".join(line[2:] for line in b.splitlines() if line.startswith("$ ")) for b in _blocks(page, "")]
    for block in _blocks(page, "bash") + shown:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for k, word in enumerate(words):
                if word.endswith("torchstep-prof"):
                    found.append(words[k + 1 :])
                    break
                if word == "-m" and words[k + 1 : k + 2] == ["torchstep_prof"]:
                    found.append(words[k + 2 :])
                    break
    return found


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_shell_commands_are_accepted_by_the_command_line(page: Path):
    from torchstep_prof.cli import build_parser
    from torchstep_prof.cli.run_cmd import build_config

    for argv in _commands(page):
        if argv == ["--version"]:
            continue
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page.name}: `torchstep-prof {shlex.join(argv)}` is not a valid command line")
        if args.command == "run":
            build_config(args)  # a bad value is a ConfigError naming it


def test_readme_shows_every_command_and_docs_cli_lists_each():
    from torchstep_prof.cli import _SUBCOMMAND_MODULES

    names = {m.removesuffix("_cmd") for m in _SUBCOMMAND_MODULES}
    shown = {argv[0] for argv in _commands(README) if argv}
    assert names <= shown, f"README shows no example of {sorted(names - shown)}"
    table = (ROOT / "docs" / "cli.md").read_text()
    assert not sorted(n for n in names if not re.search(rf"^\| `{n}[ `]", table, re.M)), (
        "docs/cli.md's table lists every command"
    )


def _error_block(page: Path, first_line: str) -> str:
    for block in _blocks(page, "text") + _blocks(page, ""):
        if first_line in block:
            return block
    raise AssertionError(f"{page.name} has no block showing {first_line!r}")


def test_config_error_examples_are_the_real_messages():
    import torchstep_prof as tsp

    with pytest.raises(tsp.ConfigError) as excinfo:
        tsp.configure(gzip="yes", sav_path="x", schedule={"step": [1]})
    shown = _error_block(README, 'tsp.configure(gzip="yes"').split("\n", 1)[1].strip()
    assert shown == f"ConfigError: {excinfo.value}"
    with pytest.raises(tsp.ConfigError) as excinfo:
        tsp.from_dict({"contents": ["gpu"], "schedule": {"wait": -1}, "schedul": 1})
    assert _error_block(ROOT / "docs" / "configuration.md", "contents: 'gpu'").strip() == str(excinfo.value)


def _package_source() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "torchstep_prof").rglob("*.py"))


def test_environment_variables_and_metric_names_are_the_packages():
    source = _package_source()
    text = "\n".join(p.read_text() for p in PAGES)
    variables = set(re.findall(r"\bTORCHSTEP_PROF_[A-Z_]*[A-Z]\b", text))
    assert "TORCHSTEP_PROF_TRACES_FILE" in variables
    unread = sorted(v for v in variables if f'"{v}"' not in source)
    assert not unread, f"documented variables the package never names: {unread}"
    series = {
        re.sub(r"_(bucket|count|sum)$", "", s)
        for s in re.findall(r"\btorchstep_prof_[a-z_]+_(?:seconds|total)\w*", text)
    }
    assert "torchstep_prof_region_seconds" in series
    names = re.sub(r"_total\b", "", source)
    missing = sorted(s for s in series if s.removesuffix("_total") not in names)
    assert not missing, f"documented metric series the package does not serve: {missing}"


_SCOPE_ROW = re.compile(r"^\| `(\w+)\(([^`]*)\)` \|", re.M)


@pytest.mark.parametrize(
    "page", [README, ROOT / "docs" / "scopes-and-regions.md"], ids=["README.md", "scopes-and-regions.md"]
)
def test_scope_tables_show_the_real_signatures(page: Path):
    import torchstep_prof as tsp

    rows = _SCOPE_ROW.findall(page.read_text())
    assert {name for name, _ in rows} >= {"schedule", "ranks", "contents", "on_finish", "metrics", "configure"}
    for name, params in rows:
        real = list(inspect.signature(getattr(tsp, name)).parameters)
        shown = [p.strip().lstrip("*").split("=")[0] for p in params.split(",")]
        shown = [p for p in shown if p and p != "..."]
        assert set(shown) <= set(real), f"{page.name}: {name}({params}) vs {real}"


def test_changelog_is_keep_a_changelog_with_this_version_released():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert versions[0] == ("Unreleased", ""), "an [Unreleased] section on top"
    released = versions[1:]
    assert released and all(date for _, date in released), "each released version has a date"
    assert released[0][0] == torchstep_prof.__version__, (
        f"the newest released version {released[0][0]} is the package's __version__ {torchstep_prof.__version__}"
    )
    headings = set(re.findall(r"^### (.+)$", text, re.M))
    assert headings <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, headings
    long = [
        e.splitlines()[0]
        for e in re.split(r"^- ", text, flags=re.M)[1:]
        if e.split("\n\n")[0].rstrip("\n").count("\n") > 1
    ]
    assert not long, f"entries are one line, two at most: {long}"
