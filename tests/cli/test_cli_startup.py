"""What a `mnemo` command loads: `main` imports only the module of the command asked for
(`mnemo.cli.COMMANDS`), and a command that does not need a heavy library (a schema validator,
an HTTP client, the ONNX runtime, a server) does not import it. Checked without timing: by the
modules each command's module imports when it is imported, read from the source, and (slow) by
the modules loaded at the end of a real `mnemo repos` / `mnemo recall` in a fresh process."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import mnemo
import mnemo.cli
from mnemo.adapters.hashing import HashEmbedder
from mnemo.cli import COMMANDS, command_of

PACKAGE = Path(mnemo.__file__).parent

# Libraries a read command has no use for: httpx serves the HTTP model adapters and
# `mnemo doctor`'s probes; onnxruntime and tokenizers embed (imported on the first
# embed); the others serve `mnemo mcp` and `mnemo ui`.
HEAVY = ("httpx", "onnxruntime", "tokenizers", "mcp", "starlette", "uvicorn")
# What a command's module may not import when imported, by module (`recall` embeds the query,
# but imports the runtime only when it does).
NOT_AT_IMPORT = {"commands": HEAVY, "history": HEAVY, "manage": HEAVY, "migrate": HEAVY}


def _module_path(name: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _run_at_import(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when a module is imported: not those in functions or
    classes, nor under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            test = node.test
            checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
            )
            if not checking:
                found += _run_at_import(node.body)
            found += _run_at_import(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse,
                          node.finalbody):
                found += _run_at_import(block)
        elif isinstance(node, ast.With):
            found += _run_at_import(node.body)
    return found


def loaded_at_import(module: str) -> set[str]:
    """Every module importing `module` loads, as the source says: mnemo's modules (with the
    packages above each) and the top-level names of the libraries they import."""
    seen: set[str] = set()
    libraries: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            prefix = ".".join(parts[:depth])
            if prefix in seen:
                continue
            seen.add(prefix)
            path = _module_path(prefix)
            if path is None:
                continue
            package = prefix if path.name == "__init__.py" else prefix.rpartition(".")[0]
            for node in _run_at_import(ast.parse(path.read_text(encoding="utf-8")).body):
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                else:
                    base = node.module or ""
                    if node.level:
                        kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                        base = ".".join([*kept, *([node.module] if node.module else [])])
                    targets = [base] + [
                        f"{base}.{alias.name}" for alias in node.names
                        if _module_path(f"{base}.{alias.name}") is not None
                    ]
                for target in targets:
                    if target.split(".")[0] == "mnemo":
                        todo.append(target)
                    else:
                        libraries.add(target.split(".")[0])
    return seen | libraries


def test_the_registry_names_every_command_in_the_order_of_the_help() -> None:
    """`COMMANDS` holds every command the modules register (groups too), in the order they
    are registered, each with the module that registers it: what `main` imports for it."""
    app = mnemo.cli.application()
    registered = [
        (info.name or info.callback.__name__, info.callback.__module__)
        for info in app.registered_commands
        if info.callback is not None
    ] + [
        (info.name, info.typer_instance.registered_commands[0].callback.__module__)
        for info in app.registered_groups
        if info.typer_instance is not None and info.typer_instance.registered_commands
        and info.typer_instance.registered_commands[0].callback is not None
    ]
    order = {module: i for i, module in enumerate(dict.fromkeys(COMMANDS.values()))}
    registered.sort(key=lambda pair: order.get(pair[1].rpartition(".")[2], len(order)))
    assert registered == [(name, f"mnemo.cli.{module}") for name, module in COMMANDS.items()]


def test_the_command_is_the_first_word_that_is_not_an_option() -> None:
    """`command_of` skips the root options (`-v`, `--verbose`, `--help`) before the command,
    and finds none in `mnemo --help` or a bare `mnemo`."""
    assert command_of(["-v", "recall", "ops", "why?", "--store", "x.db"]) == "recall"
    assert command_of(["repos", "--help"]) == "repos"
    assert command_of(["--help"]) is None
    assert command_of([]) is None


def test_a_command_imports_only_its_own_module() -> None:
    """Importing the module of `repos`, `recall`, `history` or `migrate` loads no other
    command's module (`doctor` and its probes among them)."""
    for command in ("repos", "recall", "history", "migrate"):
        module = f"mnemo.cli.{COMMANDS[command]}"
        others = {f"mnemo.cli.{m}" for m in COMMANDS.values()} - {module}
        assert loaded_at_import(module) & others == set(), command


@pytest.mark.parametrize("module", sorted(NOT_AT_IMPORT))
def test_a_command_module_imports_no_heavy_library(module: str) -> None:
    """The module of the read commands imports (at import, through every mnemo module it
    loads) none of the libraries only other commands or the first embed need."""
    assert loaded_at_import(f"mnemo.cli.{module}") & set(NOT_AT_IMPORT[module]) == set()


def test_the_reading_of_the_source_sees_what_doctor_imports() -> None:
    """The check above can fail: `mnemo doctor`'s module does import httpx (its server
    probes), and the command line's shared module the store's library."""
    assert "httpx" in loaded_at_import("mnemo.cli.doctor")
    assert {"sqlite_utils", "mnemo.storage.sqlite"} <= loaded_at_import("mnemo.cli._common")


_RUN_AND_LIST = (
    "import json, sys\n"
    "from mnemo.cli import main\n"
    "sys.argv = ['mnemo', *sys.argv[1:]]\n"
    "try:\n"
    "    main()\n"
    "except SystemExit as exit:\n"
    "    assert not exit.code, exit.code\n"
    "print('MODULES', json.dumps(sorted(sys.modules)))\n"
)


def _loaded_by(*args: str, cwd: Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_LIST, *args], cwd=cwd, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.rpartition("MODULES ")[2]))


async def _store(path: Path) -> None:
    async with mnemo.Memory(path, embedder=HashEmbedder()) as mem:
        await mem.open_repo("ops")
        steps = [mnemo.Step("gunicorn listens on port 8001.", "Bind it to 127.0.0.1:8000.")]
        await mem.ingest("ops", mnemo.Trajectory("Fix the blog", steps), source_id="s1")


@pytest.mark.slow
def test_repos_and_recall_load_no_heavy_library(tmp_path: Path) -> None:
    """A real `mnemo repos` and `mnemo recall` (on a repo of the hashed embedder), run to the
    end in a fresh interpreter, leave none of the heavy libraries loaded, nor `mnemo doctor`'s
    module."""
    store = tmp_path / "m.db"
    anyio.run(_store, store)
    for args in (
        ["repos", "--store", str(store)],
        ["recall", "ops", "which port?", "--store", str(store)],
    ):
        loaded = _loaded_by(*args, cwd=tmp_path)
        assert {m.split(".")[0] for m in loaded} & set(HEAVY) == set(), args
        assert "mnemo.cli.doctor" not in loaded
        assert f"mnemo.cli.{COMMANDS[args[0]]}" in loaded
