"""The distribution mnemo is installed as (`pymnemo`), and its version."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, packages_distributions, version

DISTRIBUTION = "pymnemo"


def installed_version() -> str:
    """The installed distribution's version ("unknown" from a bare source tree)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def foreign_distributions() -> list[str]:
    """Other installed distributions that also ship a top-level `mnemo` package (PyPI's
    `mnemo` and `mnemo-agent` do): their files overwrite mnemo's, or mnemo's theirs."""
    owners = packages_distributions().get("mnemo", [])
    return sorted({name for name in owners if name.lower() != DISTRIBUTION})
