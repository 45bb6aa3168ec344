"""Which store and which models a command uses: flags, then environment, then a config file,
then the defaults (the order most command-line tools follow).

| setting  | flag                  | environment                     | file key   | default     |
| -------- | --------------------- | ------------------------------- | ---------- | ----------- |
| store    | `--store` (`--db`)    | `MNEMO_STORE` (`MNEMO_DB`)      | `store`    | `memory.db` |
| LLM      | `--llm`               | `MNEMO_LLM`                     | `llm`      | (see below) |
| embedder | `--embedder`          | `MNEMO_EMBEDDER`                | `embedder` | (see below) |

The config file is TOML: `--config PATH`, else `$MNEMO_CONFIG`, else `./mnemo.toml`, else
`$XDG_CONFIG_HOME/mnemo/config.toml` (`~/.config/mnemo/config.toml`); a relative `store` in it
is relative to the file. It holds no keys: those come from the providers' usual variables
(`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`). With no model chosen anywhere, each repo runs the
models it recorded, and a new repo the defaults (`offline`, the embedded embedder).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from mnemo.cli._database import CliError
from mnemo.storage.ports import has_postgres_driver, is_postgres

DEFAULT_STORE = "memory.db"
FILE_KEYS = ("store", "llm", "embedder")
_ENV = {
    "store": ("MNEMO_STORE", "MNEMO_DB"),
    "llm": ("MNEMO_LLM",),
    "embedder": ("MNEMO_EMBEDDER",),
}

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store", "--db",
        help="The store: a SQLite file or a postgresql:// URL (env MNEMO_STORE; default "
             "memory.db).",
        show_default=False,
    ),
]
LlmOpt = Annotated[
    str | None,
    typer.Option(
        "--llm",
        help="The LLM: offline, openai:MODEL, anthropic:MODEL, openai-compatible:MODEL@URL "
             "(env MNEMO_LLM; default: each repo's own).",
        show_default=False,
    ),
]
EmbedderOpt = Annotated[
    str | None,
    typer.Option(
        "--embedder",
        help="The embedder: minilm, e5-small-q4, hash[:DIM], openai:MODEL[@URL] "
             "(env MNEMO_EMBEDDER; "
             "default: each repo's own).",
        show_default=False,
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="A TOML file with store, llm and embedder (env MNEMO_CONFIG; default ./mnemo.toml "
             "or ~/.config/mnemo/config.toml).",
        dir_okay=False, show_default=False,
    ),
]


@dataclass(frozen=True, slots=True)
class Settings:
    """The chosen store and model URIs (None: not chosen), and where each came from."""

    store: str
    llm: str | None = None
    embedder: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_url(self) -> bool:
        """Whether the store is a PostgreSQL URL rather than a SQLite file."""
        return is_postgres(self.store)

    @property
    def path(self) -> Path:
        """The SQLite file of the store."""
        return Path(self.store)


def config_file(
    given: Path | None, env: Mapping[str, str], cwd: Path
) -> tuple[Path | None, bool]:
    """The config file to read, and whether it was asked for (then it must exist)."""
    if given is not None:
        return given, True
    if env.get("MNEMO_CONFIG"):
        return Path(env["MNEMO_CONFIG"]), True
    local = cwd / "mnemo.toml"
    if local.is_file():
        return local, False
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    user = base / "mnemo" / "config.toml"
    return (user, False) if user.is_file() else (None, False)


def read_config(path: Path) -> dict[str, str]:
    """The settings in a config file.

    Raises:
        CliError: an unreadable file, invalid TOML, an unknown key or a value not a string.
    """
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise CliError(f"no config file at {path}") from None
    except OSError as exc:
        raise CliError(f"cannot read the config file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"the config file {path} is not valid TOML: {exc}") from exc
    out: dict[str, str] = {}
    for key, value in data.items():
        if key not in FILE_KEYS:
            hint = " (keys come from OPENAI_API_KEY / ANTHROPIC_API_KEY)" if "key" in key else ""
            raise CliError(
                f"unknown setting {key!r} in {path} (known: {', '.join(FILE_KEYS)}){hint}"
            )
        if not isinstance(value, str) or not value.strip():
            raise CliError(f"{key} in {path} must be a non-blank string, got {value!r}")
        out[key] = value.strip()
    if "store" in out and not is_postgres(out["store"]):
        out["store"] = str(path.parent / Path(out["store"]).expanduser())
    return out


def resolve(
    *,
    store: str | None = None,
    llm: str | None = None,
    embedder: str | None = None,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """The settings from flags (the arguments), `env`, the config file and the defaults.

    Raises:
        CliError: a config file that was named but is missing, or is malformed.
    """
    env = os.environ if env is None else env
    path, asked = config_file(config, env, cwd or Path.cwd())
    from_file = read_config(path) if path is not None and (asked or path.is_file()) else {}
    chosen: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for key, flag in (("store", store), ("llm", llm), ("embedder", embedder)):
        value, source = flag, f"--{key}"
        for name in _ENV[key]:
            if value is None and env.get(name):
                value, source = env[name], name
        if value is None and key in from_file:
            value, source = from_file[key], str(path)
        chosen[key], sources[key] = value, source if value is not None else "default"
    return Settings(
        store=chosen["store"] or DEFAULT_STORE,
        llm=chosen["llm"],
        embedder=chosen["embedder"],
        sources=sources,
    )


def check_backend(settings: Settings) -> None:
    """Checks that this installation can open the store's backend.

    Raises:
        CliError: a PostgreSQL URL where mnemo's PostgreSQL backend is not installed.
    """
    if settings.is_url and not has_postgres_driver():
        raise CliError(
            "this mnemo has no PostgreSQL driver, so it cannot open a postgresql:// store: "
            "pip install 'mnemo-agent[postgres]', or pass a SQLite file with --store"
        )
