"""Ids as a person reads and types them: shown short, as git shows commit hashes, and taken
back by any unique prefix.

mnemo's ids are a kind and 32 hex digits (`session_58a4e06e...`, `changeset_...`, `msg_...`):
41 characters, cut over several lines in a table at 80 columns. A table shows each id as the
shortest prefix of its digits, 8 at least, that no other id it knows shares (its column's
title names the kind); a command takes the whole id, or any prefix of it (with or without the
kind) that names one id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mnemo.cli._database import CliError

MIN_DIGITS = 8


def _split(ident: str) -> tuple[str, str]:
    kind, sep, digits = ident.rpartition("_")
    return (f"{kind}{sep}", digits) if sep else ("", ident)


def short_ids(
    shown: Iterable[str], known: Iterable[str] = (), *, kind: bool = True
) -> dict[str, str]:
    """Each shown id as its kind (unless `kind` is False: a column's title names it) and the
    shortest prefix of its digits (at least `MIN_DIGITS`) that no other id of `shown` or
    `known` starts with."""
    shown = list(shown)
    others = {*shown, *known}
    out: dict[str, str] = {}
    for ident in shown:
        prefix, digits = _split(ident)
        cut = MIN_DIGITS
        while cut < len(digits) and any(
            other != ident and other.startswith(prefix + digits[:cut]) for other in others
        ):
            cut += 1
        out[ident] = (prefix if kind else "") + digits[:cut]
    return out


def matches(given: str, ident: str) -> bool:
    """Whether `given` names `ident`: a prefix of it, or of its digits."""
    return ident.startswith(given) or _split(ident)[1].startswith(given)


def resolve_id(given: str, candidates: Sequence[str], what: str) -> str:
    """The one candidate that `given` names (`matches`); the whole id wins over prefixes.

    Raises:
        CliError: no candidate, or several (naming a few), or a blank `given`.
    """
    given = given.strip()
    if not given:
        raise CliError(f"no {what} id given")
    if given in candidates:
        return given
    found = sorted({c for c in candidates if matches(given, c)})
    if len(found) == 1:
        return found[0]
    if not found:
        raise CliError(f"no {what} {given!r}")
    listed = ", ".join(short_ids(found[:5]).values())
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    raise CliError(f"{what} id {given!r} is ambiguous: {listed}{more}; give more of it")
