"""The documentation site stays true to the code.

* Every hook spec is documented on the hook reference page, and that page's examples are working plugins.
* The tutorial's code blocks are the tutorial plugin's files, section for section (readable in the Markdown
  source too), covering all of its module.
* The shell commands and Python examples of every page run as written, offline, against small random
  checkpoints (commands that need the Hub, a GPU, an installation step or the bundled model are skipped,
  each for a stated reason).
* The plugin directory lists every built-in implementation, and the attention-mask figures show the row
  counts the pages state.
* CI's strict docs build (``.ci/docs-build``) fails on a warning.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from specframe import compose, hookspecs
from specframe.cli import main as cli_main
from specframe.errors import CheckpointError, ConfigError, PlanError
from specframe.models.named import NAMED_MODELS
from specframe.plugins import (
    KINDS,
    PluginHost,
    get_host,
    product_class,
    register_plugin,
    reset_host,
    unregister_plugin,
)
from specframe.testing.plugins import torch_threads

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HOOKS_PAGE = DOCS / "plugins" / "hooks.md"
TUTORIAL = DOCS / "plugins" / "tutorial.md"
DIRECTORY = DOCS / "plugins" / "directory.md"
TUTORIAL_PLUGIN = ROOT / "plugins" / "specframe-adaptive-packed"
DOCS_BUILD = ROOT / ".ci" / "docs-build"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
# A pymdownx.snippets block: --8<-- on a line, then one "path" or "path:section" per line, then --8<--.
SNIPPET = re.compile(r"^--8<--\n(?P<body>.*?)\n--8<--$", re.M | re.S)
# A tutorial code block copied from the plugin: a comment naming "path" or "path:section", then the fence.
COPIED = re.compile(r"^<!-- code: (?P<source>\S+) -->\n```\w*\n(?P<body>.*?)\n```$", re.M | re.S)
# Shell lines that are documented but not run here, by how they start, with the reason.
NOT_RUN_PREFIXES = {
    "python3 -m venv": "creates an environment and installs packages",
    "pip install": "installs packages",
    ". .venv/bin/activate": "needs the set-up command's environment",
    "python -m pytest": "runs a test suite",
    "curl ": "talks to a running server (specframe serve; its tests use the real OpenAI client)",
}
UNCLASSIFIED = "is not a command this test knows how to treat"
# Pages written by other parts of the project (generated from runs): their commands run when they can, but
# a command this test does not know is left alone rather than failing the suite.
OWNED_ELSEWHERE = {"benchmarks.md", "models/bundled.md"}
RUN_SUBCOMMANDS = {"plugins", "generate", "bench"}


def distribution(pyproject: Path) -> tuple[str, str, str]:
    """(distribution name, entry-point name, module) of a plugin's pyproject.toml (tomllib needs 3.11)."""
    text = pyproject.read_text(encoding="utf-8")
    name = re.search(r'^name = "([^"]+)"', text, re.M).group(1)
    entry = re.search(r'^\[project\.entry-points\.specframe\]\n(\w+) = "([\w.]+)"', text, re.M)
    return name, entry.group(1), entry.group(2)


def pages() -> list[Path]:
    """Every hand-written Markdown page (generated pages and owned-elsewhere pages included if present)."""
    return sorted(DOCS.rglob("*.md"))


def code_blocks(page: Path, language: str) -> list[str]:
    """The bodies of the fenced code blocks of ``language`` on ``page``, dedented, in page order."""
    blocks = []
    for match in FENCE.finditer(page.read_text(encoding="utf-8")):
        if match.group("lang") == language:
            indent = match.group("indent")
            blocks.append("".join(line.removeprefix(indent) for line in match.group("body").splitlines(True)))
    return blocks


def test_every_code_fence_stands_on_a_line_of_its_own():
    # A closing fence with text after it is no fence: the rest of the page would render as code, and the
    # block parser above would still find the block.
    for page in [*pages(), ROOT / "README.md"]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            fence = line.lstrip()
            if fence.startswith("```"):
                assert re.fullmatch(r"```[\w-]*", fence), f"{page.name}:{number}: {line!r} is not a bare fence"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread; several threads on a busy machine are many times slower."""
    with torch_threads(1):
        yield


# -- the hook reference ----------------------------------------------------------------------------------


def hook_specs() -> dict[str, str]:
    """Hook name -> its docstring, for every hook spec in specframe.hookspecs."""
    return {
        name: value.__doc__ or ""
        for name, value in vars(hookspecs).items()
        if callable(value) and hasattr(value, "specframe_spec")
    }


def test_every_hook_spec_is_documented_on_the_hook_reference_page():
    page = HOOKS_PAGE.read_text(encoding="utf-8")
    specs = hook_specs()
    assert set(specs) == {hook for hook, _ in KINDS.values()}
    for name, doc in specs.items():
        assert f"## `{name}`" in page, f"hook {name} has no section on {HOOKS_PAGE.relative_to(ROOT)}"
        assert f"{name}(register)" in page, f"the section of {name} does not show its signature"
        calls = re.findall(r"``(register\([^`]*\))``", doc)
        assert calls, f"the docstring of {name} does not show its register(...) call"
        for call in calls:
            assert call in page, f"{name}: the page does not show {call} as the hook spec states it"
    documented = set(re.findall(r"^## `(register_\w+)`", page, re.M))
    assert documented <= set(specs), f"the page documents hooks that do not exist: {documented - set(specs)}"


def _example_plugins() -> list[types.SimpleNamespace]:
    plugins = []
    for number, block in enumerate(code_blocks(HOOKS_PAGE, "python")):
        namespace: dict[str, object] = {"__name__": f"hooks_example_{number}"}
        exec(compile(block, f"{HOOKS_PAGE.name}[python block {number}]", "exec"), namespace)
        hooks = {name: namespace[name] for name in hook_specs() if name in namespace}
        plugins.append(types.SimpleNamespace(**hooks))
    return plugins


@pytest.fixture
def example_host():
    """A fresh process-wide host holding the hook reference's example plugins."""
    host = reset_host(load_entry_points=False)
    for number, plugin in enumerate(_example_plugins()):
        assert host.register(plugin, name=f"hooks-example-{number}", distribution="docs"), host.failures
    yield host
    reset_host(load_entry_points=False)


def test_hook_reference_examples_are_working_plugins(example_host, tmp_path):
    from decoding_helpers import generate, tiny_model
    from specframe import load_model
    from specframe.testing.models import write_random_checkpoint

    registry = example_host.registry()
    assert registry.failures == []
    names = {(e.kind, e.name) for e in registry.entries() if e.distribution == "docs"}
    assert names == {
        ("model_backend", "my-nemotron"),
        ("mask_builder", "my-nemotron"),
        ("mask_builder", "my-setdlm"),
        ("order_policy", "right-to-left"),
        ("acceptance_rule", "top20"),
        ("acceptance_rule", "min-p"),
        ("acceptance_rule", "argmax"),
        ("schedule", "verify-only"),
        ("command", "hello"),
    }
    # Every example rule declares whether it is exact and whether it samples, as the page asks of a rule.
    docs_rules = [e for e in registry.entries("acceptance_rule") if e.distribution == "docs"]
    rules = {e.name: e.describe()["exact"] for e in docs_rules}
    assert rules == {"top20": True, "min-p": True, "argmax": True}
    samples = {e.name: vars(product_class(e.factory)).get("stochastic") for e in docs_rules}
    assert samples["argmax"] is False and samples["min-p"] is True
    prompt = [3, 1, 4, 1, 5]
    setdlm = tiny_model("setdlm", tmp_path / "setdlm", vocab=24, seed=2)
    nemotron = tiny_model("nemotron-labs-diffusion", tmp_path / "nemotron", vocab=24, seed=2)
    for model in (setdlm, nemotron):
        reference = generate(model, "ar", prompt, 12).output_ids
        assert generate(model, "verify-only", prompt, 12).output_ids == reference
        for schedule in ("packed", "linear", "quadratic"):  # the from-scratch rule is greedy decoding
            assert generate(model, schedule, prompt, 12, acceptance="argmax").output_ids == reference, schedule
    reference = generate(setdlm, "ar", prompt, 12).output_ids
    # An order chooses the any-order conditionals, so the output need not equal left to right: it runs,
    # and a left-to-right-only family refuses it.
    assert len(generate(setdlm, "packed", prompt, 12, order="right-to-left").output_ids) == 12
    with pytest.raises(ConfigError, match="left to right only"):
        generate(nemotron, "packed", prompt, 12, order="right-to-left")
    assert generate(setdlm, "packed", prompt, 12, acceptance="top20", seed=1).metrics.nfe > 0
    # The model-backend example: a checkpoint with its own model_type loads as the new family.
    folder = write_random_checkpoint("nemotron-labs-diffusion", tmp_path / "mine", seed=2, model_type="my_nemotron")
    mine = load_model(folder, dtype="float64")
    assert mine.family == "my-nemotron"
    assert generate(mine, "packed", prompt, 12).output_ids == generate(mine, "ar", prompt, 12).output_ids
    # The mask-builder example: SetDLM's layout under another family name, with a row budget.
    setdlm.family = "my-setdlm"
    assert generate(setdlm, "packed", prompt, 12, width=4).output_ids == reference
    with pytest.raises(PlanError, match="budget of 64"):
        generate(setdlm, "quadratic", prompt, 12, width=8)


def test_the_min_p_example_samples_exactly_the_ar_min_p_distribution(example_host):
    from sampling_models import NEMOTRON, SETDLM, TableModel, exact_distribution, gof_pvalue, sample_counts
    from specframe.acceptance.rejection import SamplingWarp

    prompt, length = [0, 1, 2], 4
    for family, seed in ((NEMOTRON, 3), (SETDLM, 5)):
        model = TableModel(family, seed=seed)
        acceptance = {"name": "min-p", "min_p": 0.5}
        decoder = compose(
            {"model": model, "schedule": "packed", "acceptance": acceptance, "width": 3, "max_new_tokens": length}
        )
        exact = exact_distribution(model, prompt, length, decoder.rule.warp)
        assert len(exact) < len(exact_distribution(model, prompt, length, SamplingWarp()))  # min-p truncates
        counts = sample_counts(lambda s, d=decoder: d.generate(prompt_ids=prompt, seed=s).output_ids, 2000)
        assert gof_pvalue(counts, exact) > 1e-5, family


# -- the tutorial ----------------------------------------------------------------------------------------


def snippet_sections(path: Path) -> dict[str, list[str]]:
    """Section name -> its lines, for the ``--8<-- [start:name]`` / ``[end:name]`` markers of ``path``."""
    sections: dict[str, list[str]] = {}
    open_sections: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        marker = re.search(r"--8<-- \[(start|end):([\w-]+)\]", line)
        if marker:
            kind, name = marker.groups()
            if kind == "start":
                assert name not in sections, f"{path}: section {name} opened twice"
                sections[name] = []
                open_sections.append(name)
            else:
                assert open_sections and open_sections[-1] == name, f"{path}: section {name} closed out of order"
                open_sections.pop()
            continue
        for name in open_sections:
            sections[name].append(line)
    assert not open_sections, f"{path}: sections {open_sections} are never closed"
    return sections


def test_tutorial_code_is_the_plugins_and_covers_its_module():
    page = TUTORIAL.read_text(encoding="utf-8")
    copies = [(match.group("source"), match.group("body")) for match in COPIED.finditer(page)]
    assert copies, "the tutorial shows no code of the plugin"
    assert "--8<--\n" not in page, "a snippet include shows nothing in the Markdown source: copy the code"
    module = TUTORIAL_PLUGIN / "src" / "specframe_adaptive_packed" / "__init__.py"
    shown: list[str] = []
    for source, body in copies:
        path, _, section = source.partition(":")
        file = ROOT / path
        assert file.is_file(), f"the tutorial copies {path}, which does not exist"
        assert file.is_relative_to(TUTORIAL_PLUGIN), f"the tutorial copies {path} from outside the plugin"
        if section:
            sections = snippet_sections(file)
            assert section in sections, f"{path} has no snippet section {section!r}"
            lines = sections[section]
        else:
            lines = [line for line in file.read_text(encoding="utf-8").splitlines() if "--8<--" not in line]
        expected = textwrap.dedent("\n".join(lines)).strip("\n")
        assert body == expected, f"the tutorial's copy of {source} differs from the file: copy it again"
        if file == module:
            shown += lines
    code = [line for line in module.read_text(encoding="utf-8").splitlines() if "--8<--" not in line]
    hidden = [line for line in code if line.strip() and line not in shown]
    assert not hidden, f"lines of the plugin module that the tutorial does not show: {hidden}"
    # No code block of the tutorial is typed by hand except the ones that are not plugin code.
    copied = {body for _, body in copies}
    for block in code_blocks(TUTORIAL, "python"):
        assert block.rstrip("\n") in copied or "compose(" in block, f"hand-written Python in the tutorial:\n{block}"


def test_tutorial_entry_and_directory_match_the_plugin_package():
    name, entry_name, module_name = distribution(TUTORIAL_PLUGIN / "pyproject.toml")
    shown = json.loads(code_blocks(TUTORIAL, "json")[0])
    assert {k: shown[k] for k in ("kind", "name", "plugin", "distribution")} == {
        "kind": "schedule",
        "name": "adaptive-packed",
        "plugin": entry_name,
        "distribution": name,
    }
    assert shown["exact"] is True and shown["family"] is None
    module = importlib.import_module(module_name) if importlib.util.find_spec(module_name) else None
    if module is not None:
        host = PluginHost(load_entry_points=False)
        assert host.register(module, name=entry_name, distribution=name)
        entry = host.registry().get("schedule", "adaptive-packed")
        assert entry.describe() == shown


# -- shell commands and Python examples ------------------------------------------------------------------


def shell_commands() -> list[tuple[str, str]]:
    """(page, command line) for every line of every ``bash`` block."""
    found = []
    for page in pages():
        for block in code_blocks(page, "bash"):
            for line in block.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    found.append((page.relative_to(DOCS).as_posix(), line.strip()))
    return found


def python_examples() -> list[tuple[str, int, str]]:
    """(page, number, code) for every ``python`` block of our pages and the README (a new user's first code),
    except the hook reference, includes and copies of the tutorial plugin's code (tested with the plugin)."""
    found = []
    for page in [*pages(), ROOT / "README.md"]:
        name = page.relative_to(DOCS).as_posix() if page.is_relative_to(DOCS) else page.name
        if page == HOOKS_PAGE or name in OWNED_ELSEWHERE:
            continue
        copied = {match.group("body") for match in COPIED.finditer(page.read_text(encoding="utf-8"))}
        for number, block in enumerate(code_blocks(page, "python")):
            if not SNIPPET.search(block) and block.rstrip("\n") not in copied:
                found.append((name, number, block))
    return found


def _bundled_model_installed() -> bool:
    from specframe.models.hub import bundled_model

    try:
        bundled_model()
    except CheckpointError:
        return False
    return True


def why_not_run(command: str) -> str | None:
    """Why a documented command is not run here, or ``None`` if it is."""
    for prefix, reason in NOT_RUN_PREFIXES.items():
        if command.startswith(prefix):
            return reason
    words = shlex.split(command)
    if words[0] == "specframe" and (len(words) < 2 or words[1] not in RUN_SUBCOMMANDS):
        return "runs a subcommand other than plugins, generate and bench"
    if words[0] == "python" and len(words) > 1 and words[1].startswith("scripts/"):
        if words[1] != "scripts/make_random_checkpoints.py":
            return "runs a repository script other than the checkpoint writer"
    if words[0] == "specframe" or words[:2] == ["python", "scripts/make_random_checkpoints.py"]:
        if any(word.startswith("nvidia/") for word in words):
            return "downloads from the Hub"
        if "--device" in words and words[words.index("--device") + 1].startswith("cuda"):
            return "needs a GPU"
        if words[1] in ("generate", "bench") and "--model" not in words and not _bundled_model_installed():
            return "needs the bundled model, which this installation lacks"
        if "--model" in words and words[words.index("--model") + 1] in NAMED_MODELS:
            return "uses a named model, which `specframe pull` downloads first"
        if "--model" in words and words[words.index("--model") + 1].startswith("/"):
            return "names a checkpoint folder of the machine the page was written on"
        if words[1] == "bench" and ("--limit" not in words or int(words[words.index("--limit") + 1]) > 4):
            return "is a full or long benchmark run (too slow for the test suite)"
        if any(mark in command for mark in ("<", "...", "|", "&&", "$")):
            return "is a template or a pipeline"
        return None
    return UNCLASSIFIED


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with the random checkpoints the pages call tiny/ and the tutorial plugin registered."""
    from specframe.testing.models import write_random_checkpoint

    folder = tmp_path_factory.mktemp("docs-run")
    for family in ("nemotron-labs-diffusion", "setdlm"):
        write_random_checkpoint(family, folder / "tiny" / family, seed=0)
    # Any other folder a page makes with the checkpoint script exists before any test needs it.
    for _, command in shell_commands():
        words = shlex.split(command)
        if words[:2] == ["python", "scripts/make_random_checkpoints.py"] and words[2] != "tiny":
            run_script(words[1:], folder)
    return folder


def run_script(argv: list[str], cwd: Path) -> None:
    """Run a repository script in this process, as ``python argv...`` would from ``cwd``."""
    saved_argv, saved_cwd = sys.argv, Path.cwd()
    sys.argv = argv
    try:
        import os

        os.chdir(cwd)
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(ROOT / argv[0]), run_name="__main__")
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)


@pytest.fixture
def tutorial_plugin():
    """The tutorial plugin registered in this process (the test run does not load entry points)."""
    spec = importlib.util.find_spec("specframe_adaptive_packed")
    if spec is None:
        pytest.skip("specframe-adaptive-packed is not installed (pip install ./plugins/specframe-adaptive-packed)")
    module = importlib.import_module("specframe_adaptive_packed")
    host = get_host()
    if host.pm.is_registered(module):
        yield
        return
    register_plugin(module, "adaptive_packed")
    yield
    unregister_plugin("adaptive_packed")


def test_every_documented_command_is_classified():
    commands = shell_commands()
    unknown = [
        f"{page}: {command}"
        for page, command in commands
        if why_not_run(command) == UNCLASSIFIED and page not in OWNED_ELSEWHERE
    ]
    assert not unknown, f"add these to NOT_RUN_PREFIXES or make them runnable: {unknown}"
    ran = {command.split()[1] for _, command in commands if why_not_run(command) is None}
    assert {"plugins", "generate", "bench", "scripts/make_random_checkpoints.py"} <= ran
    assert any("--model tiny/" in command for _, command in commands if why_not_run(command) is None)


@pytest.mark.parametrize(
    "page,command", [c for c in shell_commands() if why_not_run(c[1]) is None], ids=lambda value: str(value)[:60]
)
def test_documented_command_runs(page, command, workdir, tutorial_plugin, monkeypatch, capsys):
    words = shlex.split(command)
    if words[0] == "python":
        run_script(words[1:], workdir)
        return
    monkeypatch.chdir(workdir)
    status = cli_main(words[1:])
    captured = capsys.readouterr()
    assert status == 0, f"{page}: `{command}` failed: {captured.err}"
    if "--json" in words or words[1] == "plugins":
        json.loads(captured.out)


@pytest.mark.parametrize("page,number,code", python_examples(), ids=lambda value: str(value)[:40])
def test_documented_python_example_runs(page, number, code, workdir, tutorial_plugin, monkeypatch, capsys):
    if "nvidia/" in code or '"cuda' in code or "<checkpoint>" in code:
        pytest.skip("needs the Hub or a GPU")
    monkeypatch.chdir(workdir)
    exec(compile(code, f"{page}[python block {number}]", "exec"), {"__name__": f"docs_example_{number}"})


# -- the directory and the figures ----------------------------------------------------------------------


def test_the_plugin_directory_lists_every_builtin_and_every_example_distribution():
    page = DIRECTORY.read_text(encoding="utf-8")
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:3]) for line in page.splitlines()}
    registry = PluginHost(load_entry_points=False).registry()
    for entry in registry.entries():
        label = KINDS[entry.kind][1]
        assert (label, f"`{entry.name}`", f"`{entry.plugin}`") in rows, f"{label} {entry.name} is not listed"
    for pyproject in sorted((ROOT / "plugins").glob("*/pyproject.toml")):
        name = distribution(pyproject)[0]
        assert f"### `{name}`" in page, f"example distribution {name} is not listed"


def test_the_mask_figures_show_the_row_counts_the_pages_state():
    figures = runpy.run_path(str(DOCS / "gen_mask_figures.py"), run_name="docs_figures")
    width = figures["WIDTH"]
    rows = {(case.family, case.slug): case.call.num_rows for case in figures["cases"]()}
    nemotron, setdlm = "nemotron-labs-diffusion", "setdlm"
    pending, window = 1, width  # the steady-state figures have one pending token and a full window
    assert rows[nemotron, "packed"] == 2 * (width + 1)
    assert rows[nemotron, "quadratic"] == (width + 1) * (width + 2)
    assert rows[nemotron, "linear-draft"] == rows[nemotron, "linear-verify"] == width + 1
    assert rows[nemotron, "ar"] == 1
    assert rows[setdlm, "packed"] == pending + 3 * window
    assert rows[setdlm, "quadratic"] == pending + 2 * window + window**2
    assert rows[setdlm, "linear-draft"] == pending + window
    assert rows[setdlm, "linear-verify"] == pending + 2 * window
    assert rows[setdlm, "ar"] == pending + 1
    rendered = figures["render"](next(iter(figures["cases"]())))
    assert rendered.startswith(b"\x89PNG")


# -- CI's docs build ------------------------------------------------------------------------------------------


def test_ci_runs_the_docs_build_that_is_tested_here():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert ".ci/docs-build" in commands, ".ci/run must build the docs with .ci/docs-build"
    assert not [line for line in commands if "mkdocs" in line], (
        ".ci/run must not call mkdocs except through .ci/docs-build"
    )


def _docs_build(project: Path) -> subprocess.CompletedProcess:
    """``.ci/docs-build`` on the one-page mkdocs project in ``project``, with this interpreter's scripts first."""
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    command = [str(DOCS_BUILD), "--config-file", str(project / "mkdocs.yml"), "--site-dir", str(project / "site")]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("planted", [False, True], ids=["clean", "broken-link"])
def test_the_ci_docs_build_fails_on_a_warning(tmp_path, planted):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    (tmp_path / "docs").mkdir()
    (tmp_path / "mkdocs.yml").write_text("site_name: planted\nnav:\n  - Home: index.md\n", encoding="utf-8")
    link = "[a page that is not there](missing.md)" if planted else "no links"
    (tmp_path / "docs" / "index.md").write_text(f"# Home\n\n{link}\n", encoding="utf-8")
    build = _docs_build(tmp_path)
    output = build.stdout + build.stderr
    if planted:  # the project itself does not say strict: the flag in .ci/docs-build must do it, and loudly
        assert build.returncode != 0, f"a warning did not fail the strict build:\n{output}"
        assert "missing.md" in output, f"the failing build does not show the warning:\n{output}"
    else:
        assert build.returncode == 0, f"the clean one-page project does not build:\n{output}"
