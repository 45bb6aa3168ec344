"""The distribution mnemo is installed as, and its version.

The import name is `mnemo`; the distribution on PyPI is `mnemo-agent` (`mnemo` there is an
unrelated project): `pip install "mnemo-agent[postgres]"`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "mnemo-agent"


def installed_version() -> str:
    """The installed distribution's version ("unknown" when running from a bare source
    tree)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"
