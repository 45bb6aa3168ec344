"""Ids as a person reads and types them: a table shows the shortest unique prefix of an id's
digits (8 at least), and a command takes the whole id or any prefix that names one id."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from mnemo.cli._database import CliError
from mnemo.errors import names_id, split_id

MIN_DIGITS = 8


def short_ids(shown: Iterable[str], known: Iterable[str] = (), *,
              kind: bool = False) -> dict[str, str]:
    """Each shown id as its kind (with `kind`), the shortest unique prefix of its digits
    (at least `MIN_DIGITS`) and its step index."""
    shown = list(shown)
    others = {*shown, *known}
    out: dict[str, str] = {}
    for ident in shown:
        prefix, digits, index = split_id(ident)
        start = prefix if kind else ""
        for cut in range(min(MIN_DIGITS, len(digits)), len(digits) + 1):
            short = start + digits[:cut] + index
            if not any(other != ident and names_id(short, other) for other in others):
                break
        else:
            short = ident
        out[ident] = short
    return out


def resolve_id(given: str, candidates: Sequence[str], what: str) -> str:
    """The one candidate `given` names, the whole id winning over prefixes; CliError for none,
    several or a blank `given`."""
    return resolve_in_repos(given, {"": candidates}, what)[1]


def resolve_in_repos(given: str, candidates: Mapping[str, Sequence[str]],
                     what: str) -> tuple[str, str]:
    """The one (repo, id) among each repo's candidates that `given` names, as `resolve_id`."""
    given = given.strip()
    if not given:
        raise CliError(f"no {what} id given")
    found = sorted({(repo, c) for repo, ids in candidates.items() for c in ids
                    if c == given or names_id(given, c)})
    found = [(repo, c) for repo, c in found if c == given] or found
    if len(found) == 1:
        return found[0]
    repos = [repo for repo in candidates if repo]
    if not found:
        where = f" in repo {repos[0]!r}" if len(repos) == 1 else ""
        raise CliError(f"no {what} {given!r}{where}")
    short = short_ids([c for _, c in found], kind=True)
    listed = ", ".join(short[c] + (f" ({repo})" if len(repos) > 1 else "")
                       for repo, c in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    raise CliError(f"{what} id {given!r} is ambiguous: {listed}{more}; give more of it")
