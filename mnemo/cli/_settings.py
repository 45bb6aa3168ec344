"""Which store and which models a command uses: flags, then environment (`MNEMO_STORE`, ...),
then a TOML config file (`--config`, `$MNEMO_CONFIG`, `./mnemo.toml`,
`$XDG_CONFIG_HOME/mnemo/config.toml`), then the defaults (README's "Command line")."""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from mnemo.adapters.uri import with_settings
from mnemo.cli._database import CliError
from mnemo.config import Config
from mnemo.storage.ports import is_postgres

MODEL_KEYS = ("temperature", "llm_timeout", "extraction_timeout")
FILE_KEYS = ("store", "llm", "embedder", *MODEL_KEYS)

def _option(*flags: str, help: str, **more: Any) -> Any:
    return typer.Option(*flags, help=help, show_default=False, **more)


# The options a command that opens models takes, in the order its help lists them.
MODEL_OPTIONS = {
    "store": Annotated[str | None, _option("--store", "--db", help=(
        "The store: a SQLite file or a postgresql:// URL (env MNEMO_STORE; default memory.db)."))],
    "llm": Annotated[str | None, _option("--llm", help=(
        "The LLM: offline, openai:MODEL, anthropic:MODEL, openai-compatible:MODEL@URL (env "
        "MNEMO_LLM; default: each repo's own)."))],
    "embedder": Annotated[str | None, _option("--embedder", help=(
        "The embedder: minilm, e5-small-q4, hash[:DIM], openai:MODEL[@URL] (env MNEMO_EMBEDDER; "
        "default: each repo's own)."))],
    "temperature": Annotated[str | None, _option("--temperature", help=(
        "The LLM's sampling temperature: a number >= 0, or server for the server's own (env "
        "MNEMO_TEMPERATURE; default: the LLM URI's, else 0; small local models do better above "
        "0)."))],
    "llm_timeout": Annotated[float | None, _option("--llm-timeout", help=(
        "Seconds one LLM request may take (env MNEMO_LLM_TIMEOUT; default: the LLM URI's, else "
        "60)."))],
    "extraction_timeout": Annotated[float | None, _option("--extraction-timeout", help=(
        "Seconds an extraction, and each conversation-memory model call, may take (env "
        "MNEMO_EXTRACTION_TIMEOUT; default 60)."))],
    "config": Annotated[Path | None, _option("--config", dir_okay=False, help=(
        "A TOML file with store, llm and embedder (env MNEMO_CONFIG; default ./mnemo.toml or "
        "~/.config/mnemo/config.toml)."))],
}


@dataclass(frozen=True, slots=True)
class Settings:
    """The chosen store and model URIs (None: not chosen), the model settings, and where each
    came from. `temperature` is a number's text or "server"."""

    store: str
    llm: str | None = None
    embedder: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    temperature: str | None = None
    llm_timeout: float | None = None
    extraction_timeout: float | None = None

    @property
    def llm_uri(self) -> str | None:
        """The chosen LLM's URI with the temperature and timeout among its settings (None: no
        LLM); CliError when a flag set them without an LLM."""
        tuned = {"temperature": self.temperature, "timeout": self.llm_timeout}
        given = {name: value for name, value in tuned.items() if value is not None}
        if self.llm is None:
            flagged = [
                flag for flag in ("--temperature", "--llm-timeout")
                if flag in self.sources.values()]
            if flagged:
                raise CliError(
                    f"{' and '.join(flagged)} tune the LLM chosen with --llm (or MNEMO_LLM, or "
                    "llm in the config file); none is chosen, and each repo's recorded model "
                    "keeps its own settings")
            return None
        return with_settings(self.llm, **given)

    @property
    def config(self) -> Config | None:
        """The `Config` of the command's `Memory` (None: the defaults)."""
        if self.extraction_timeout is None:
            return None
        return Config(extraction_timeout=self.extraction_timeout)


def config_file(given: Path | None, env: Mapping[str, str], cwd: Path) -> tuple[Path | None, bool]:
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
    """The settings in a config file (CliError for an unreadable or invalid file or key)."""
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise CliError(f"no config file at {path}") from None
    except OSError as exc:
        raise CliError(f"cannot read the config file {path}: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"the config file {path} is not valid TOML: {exc}") from exc
    except RecursionError as exc:
        raise CliError(f"the config file {path} nests too deep to read") from exc
    out: dict[str, str] = {}
    for key, value in data.items():
        if key not in FILE_KEYS:
            hint = " (keys come from OPENAI_API_KEY / ANTHROPIC_API_KEY)" if "key" in key else ""
            raise CliError(
                f"unknown setting {key!r} in {path} (known: {', '.join(FILE_KEYS)}){hint}")
        if key in MODEL_KEYS and isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            wanted = "a number or a string" if key in MODEL_KEYS else "a non-blank string"
            raise CliError(f"{key} in {path} must be {wanted}, got {value!r}")
        out[key] = value.strip()
    if "store" in out and not is_postgres(out["store"]):
        out["store"] = str(path.parent / Path(out["store"]).expanduser())
    return out


def resolve(*, store: str | None = None, llm: str | None = None, embedder: str | None = None,
            config: Path | None = None, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, temperature: str | None = None,
            llm_timeout: float | None = None, extraction_timeout: float | None = None) -> Settings:
    """The settings from flags, `env`, the config file and the defaults; CliError for a missing
    or malformed config file or a bad model setting, naming where it came from."""
    env = os.environ if env is None else env
    path, asked = config_file(config, env, cwd or Path.cwd())
    from_file = read_config(path) if path is not None and (asked or path.is_file()) else {}
    chosen: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    flags: dict[str, str | None] = {
        "store": store, "llm": llm, "embedder": embedder, "temperature": temperature,
        "llm_timeout": None if llm_timeout is None else repr(llm_timeout),
        "extraction_timeout": None if extraction_timeout is None else repr(extraction_timeout)}
    for key, flag in flags.items():
        value, source = flag, "--" + key.replace("_", "-")
        for name in (f"MNEMO_{key.upper()}", *(("MNEMO_DB",) if key == "store" else ())):
            if value is None and env.get(name):
                value, source = env[name], name
        if value is None and key in from_file:
            value, source = from_file[key], str(path)
        chosen[key], sources[key] = value, source if value is not None else "default"
    if chosen["store"] is not None and not chosen["store"].strip():
        raise CliError(f"the store from {sources['store']} is blank: name a SQLite file or a"
                       " postgresql:// URL")
    return Settings(
        store=chosen["store"] or "memory.db", llm=chosen["llm"], embedder=chosen["embedder"],
        sources=sources, temperature=_temperature(chosen["temperature"], sources["temperature"]),
        llm_timeout=_seconds(chosen["llm_timeout"], "llm_timeout", sources),
        extraction_timeout=_seconds(chosen["extraction_timeout"], "extraction_timeout", sources))


def _temperature(value: str | None, source: str) -> str | None:
    if value is None or value.strip().lower() == "server":
        return None if value is None else "server"
    number = _number(value, 0, f"the temperature from {source} must be a number >= 0 or server")
    return f"{number:g}"


def _seconds(value: str | None, key: str, sources: Mapping[str, str]) -> float | None:
    if value is None:
        return None
    return _number(value, math.ulp(0), f"{key} from {sources[key]} must be a number of "
                                       "seconds > 0")


def _number(value: str, least: float, rule: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number >= least):
        raise CliError(f"{rule}, got {value!r}")
    return number
