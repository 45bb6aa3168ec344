"""`RecallCache`: the rows recall reads of a SQLite file's nodes (a node, its access stats and
every link touching it), kept between recalls while nothing else changed the file, so that
a recall of a small repo answers its hops and its best candidates' read from memory, without
a query or a hop to the connection's thread.

**When it holds.** Each look at the node log (a recall's, at its start: `SqliteVectors`'s
`on_look`) and each fill reads the file's *stamp* on the connection's thread: SQLite's
`data_version`, which moves when another connection (a process, another Memory, the command
line) commits; the connection's own `total_changes`, less the access counts it wrote for
recalls (which this cache writes into itself when they are posted); and how many of those
writes were refused. Before each use the cache compares the latest stamp read (`seen`) with
the one its rows were read at, and empties itself when they differ: a recall uses rows read
since the last write anyone committed before its look, as when it read them itself. A write
of this Memory's own (a commit, a session's step) empties it too.

**What it returns** is what `recall_reads.node_context` and `recall_reads.typed_links` return
for the same ids, in the same order (the order of SQLite's plans for those statements: by id
for the asked nodes of a hop, by rowid for links; `tests/storage/test_recall_cache.py`
holds the two to the same answers), built afresh at each read: a caller gets nodes of its
own, as from the file.

**Bounded**: at most `LIMIT` nodes, emptied when full; used only for repos of fewer than
`ann.IN_TURN_BELOW` vectors, the small ones (a large repo's recalls rarely read a node
twice).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.model import NODE_TYPES, LinkType, Node, NodeType
from mnemo.graph.ports import Neighbor, NodeContext, TypedLink
from mnemo.storage.graph_base import seen_from_asked
from mnemo.storage.row import Row
from mnemo.storage.sqlite.database import chunks
from mnemo.storage.sqlite.rows import NODE_COLUMNS, NODE_WIDTH, node

# The statements' chunks (`recall_reads._CHUNK`): an answer is built chunk by chunk as theirs.
CHUNK = 400
LIMIT = 20_000

ALL = "*"  # `Entry.links` when every link of the node was read

# (data_version, own changes but the access counts, refused access counts): see the module's
# doc.
Stamp = tuple[int, int, int]


@dataclass(slots=True)
class Entry:
    """A node as read: its repo, rowid and row (`rows.NODE_COLUMNS`), its access stats, and
    the links touching it that were read (`links`: `ALL` of them, those of one type, or None):
    `out` (dst rowid, link type, dst id, dst type) in (dst rowid, type) order, `into` (link
    type, src rowid, src id, src type) in (type, src rowid) order. A node's links are read
    when a read needs them, as it needs them: every link of a hop's nodes, and the links of
    one type of the best candidates of some types (a route may have hundreds)."""

    repo: str
    rowid: int
    row: Row
    count: int
    last: str | None
    links: str | None = None
    out: list[tuple[int, str, str, str]] = field(default_factory=list)
    into: list[tuple[str, int, str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Filled:
    """What a fill read: the stamp it read at, how many access-count writes had run then,
    the repo, and each asked id's entry (None for a node not in the repo)."""

    stamp: Stamp
    done: int
    repo: str
    entries: dict[str, Entry | None]


class RecallCache:
    """One SQLite connection's cache of recall's rows. `look`, `View.fill` and the counts of
    access-count writes (`written`, `refused`) run on the connection's thread; the rest on
    the event loop."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._absent: set[tuple[str, str]] = set()  # (repo, id) of nodes not there
        self._stamp: Stamp | None = None
        self._posted = 0  # access-count writes posted (event loop)
        # Written on the connection's thread, read on the loop.
        self.seen: Stamp | None = None
        self._own = 0  # rows the access-count writes changed
        self._refused = 0
        self._done = 0  # access-count writes run

    # ---- on the connection's thread --------------------------------------------------------

    def look(self, db: SqliteUtilsDatabase) -> None:
        """Reads the file's stamp (a look at the node log, on the connection's thread)."""
        self.seen = self._read_stamp(db)

    def _read_stamp(self, db: SqliteUtilsDatabase) -> Stamp:
        conn = db.conn
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        return (int(version), int(conn.total_changes) - self._own, self._refused)

    def written(self, changes: int) -> None:
        """An access-count write ran and changed `changes` rows."""
        self._own += changes
        self._done += 1

    def refused(self) -> None:
        """An access-count write was refused (its counts, written here, are wrong)."""
        self._refused += 1
        self._done += 1

    def _fill(
        self, db: SqliteUtilsDatabase, repo: str, ids: Sequence[str],
        kinds: Collection[NodeType] | None, link: LinkType | None,
    ) -> Filled:
        stamp = self._read_stamp(db)
        self.seen = stamp
        return Filled(stamp, self._done, repo, _read(db, repo, ids, kinds, link))

    # ---- on the event loop -----------------------------------------------------------------

    def valid(self) -> None:
        """Empties the cache unless its rows were read at the latest stamp seen."""
        if self.seen != self._stamp:
            self._entries.clear()
            self._absent.clear()
            self._stamp = self.seen

    def view(self) -> View:
        """A read's view of the cache (`View`)."""
        return View(self)

    def keep(self, filled: Filled) -> bool:
        """Keeps a fill's rows when they were read at the latest stamp seen, with every
        access-count write posted before already run; whether it did."""
        self.valid()
        if filled.stamp != self._stamp or filled.done != self._posted:
            return False
        if len(self._entries) + len(self._absent) + len(filled.entries) > LIMIT:
            self._entries.clear()
            self._absent.clear()
        for node_id, entry in filled.entries.items():
            if entry is None:
                self._absent.add((filled.repo, node_id))
            else:
                self._entries[node_id] = entry
        return True

    def posted(self, repo: str, ids: Iterable[str], stamp: str) -> None:
        """An access-count write was posted: its counts are the cache's at once."""
        self._posted += 1
        for node_id in ids:
            entry = self._entries.get(node_id)
            if entry is not None and entry.repo == repo:
                entry.count += 1
                entry.last = stamp


class View:
    """The rows one read answers from: the cache's, taken as they are asked for (a cache
    emptied meanwhile changes nothing here), and those it reads for what the cache misses
    (`fill`, on the connection's thread; `filled` for the cache to keep)."""

    def __init__(self, cache: RecallCache) -> None:
        self._cache = cache
        self.entries: dict[str, Entry | None] = {}
        self.filled: list[Filled] = []

    def take(
        self, repo: str, ids: Iterable[str], kinds: Collection[NodeType] | None = None,
        link: LinkType | None = None,
    ) -> list[str]:
        """Takes the cache's rows of `ids` in `repo`, with the links of type `link` (None:
        every link) of those of the types `kinds` (None: of all); returns those it misses."""
        live, absent, entries = self._cache._entries, self._cache._absent, self.entries
        missing = []
        for node_id in ids:
            entry: Entry | None
            if node_id in entries:
                entry = entries[node_id]
            else:
                entry = live.get(node_id)
                if entry is None or entry.repo != repo:
                    if (repo, node_id) not in absent:
                        missing.append(node_id)
                        continue
                    entry = None
            if entry is not None and entry.links != ALL and (
                    link is None or entry.links != link.value) and (
                    kinds is None or NODE_TYPES[entry.row[1]] in kinds):
                missing.append(node_id)
                continue
            entries[node_id] = entry
        return missing

    def fill(
        self, db: SqliteUtilsDatabase, repo: str, ids: Sequence[str],
        kinds: Collection[NodeType] | None = None, link: LinkType | None = None,
    ) -> None:
        """`take`, and reads what the cache misses (on the connection's thread)."""
        missing = self.take(repo, dict.fromkeys(ids), kinds, link)
        if missing:
            filled = self._cache._fill(db, repo, missing, kinds, link)
            self.filled.append(filled)
            self.entries.update(filled.entries)

    def read(
        self, db: SqliteUtilsDatabase, repo: str, node_ids: Sequence[str],
        linked: Iterable[NodeType], link_type: LinkType,
    ) -> NodeContext:
        """`fill`, then `node_context` (on the connection's thread)."""
        kinds = list(linked)
        self.fill(db, repo, node_ids, kinds, link_type)
        return self.node_context(repo, node_ids, kinds, link_type)

    def node_context(
        self, repo: str, node_ids: Sequence[str], linked: Iterable[NodeType], link_type: LinkType
    ) -> NodeContext:
        """`recall_reads.node_context(..., then=None)` from the view (which holds `node_ids`)."""
        return node_context(self.entries, repo, node_ids, linked, link_type)

    def typed_links(self, repo: str, ids: list[str]) -> list[TypedLink]:
        """`recall_reads.typed_links` from the view (which holds `ids`)."""
        return typed_links(self.entries, repo, ids)


def node_context(
    entries: Mapping[str, Entry | None], repo: str, node_ids: Sequence[str],
    linked: Iterable[NodeType], link_type: LinkType,
) -> NodeContext:
    """`recall_reads.node_context(..., then=None)` from `entries` (which hold `node_ids`)."""
    ids = list(dict.fromkeys(node_ids))
    kinds = {NodeType(t) for t in linked}
    found: dict[str, Node] = {}
    stats: dict[str, tuple[int, datetime | None]] = {}
    order: list[str] = []  # the statement's rows: by id within each chunk asked
    for chunk in chunks(ids, CHUNK):
        for node_id in sorted(i for i in set(chunk) if _here(entries.get(i), repo)):
            entry = _entry(entries, node_id)
            found[node_id] = node(entry.row)
            stats[node_id] = (entry.count,
                              datetime.fromisoformat(entry.last) if entry.last else None)
            order.append(node_id)
    origins = [i for i in order if found[i].type in kinds]
    name = link_type.value
    links: list[Neighbor] = []
    for part in chunks(origins, CHUNK):
        # The statement reads the asked ends by rowid: each half in rowid order.
        by_rowid = sorted(part, key=lambda i: _entry(entries, i).rowid)
        for node_id in by_rowid:
            links += [Neighbor(node_id, other, link_type)
                      for _, kind, other, _ in _entry(entries, node_id).out if kind == name]
        for node_id in by_rowid:
            links += [Neighbor(node_id, other, link_type)
                      for kind, _, other, _ in _entry(entries, node_id).into if kind == name]
    return NodeContext([found[i] for i in ids if i in found], stats, list(dict.fromkeys(links)))


def typed_links(entries: Mapping[str, Entry | None], repo: str, ids: list[str]
                ) -> list[TypedLink]:
    """`recall_reads.typed_links` from `entries` (which hold `ids`)."""
    found: list[TypedLink] = []
    for chunk in chunks(ids, CHUNK):
        asked = sorted(i for i in set(chunk) if _here(entries.get(i), repo))
        rowids = {_entry(entries, i).rowid for i in asked}
        rows: list[tuple[str, str, str, str, str]] = []
        for node_id in asked:
            entry = _entry(entries, node_id)
            kind = entry.row[1]
            rows += [(node_id, kind, other, other_kind, link)
                     for _, link, other, other_kind in entry.out]
        for node_id in asked:
            entry = _entry(entries, node_id)
            kind = entry.row[1]
            rows += [(other, other_kind, node_id, kind, link)
                     for link, src, other, other_kind in entry.into if src not in rowids]
        found += seen_from_asked(rows, set(chunk))
    return found


def _here(entry: Entry | None, repo: str) -> bool:
    return entry is not None and entry.repo == repo


def _entry(entries: Mapping[str, Entry | None], node_id: str) -> Entry:
    entry = entries[node_id]
    assert entry is not None
    return entry


def _read(
    db: SqliteUtilsDatabase, repo: str, ids: Sequence[str], kinds: Collection[NodeType] | None,
    link: LinkType | None,
) -> dict[str, Entry | None]:
    """The rows of `ids` in `repo` (None for an id not there), with the links of type `link`
    (None: every link) of those of the types `kinds` (None: of all)."""
    conn = db.conn
    entries: dict[str, Entry | None] = dict.fromkeys(ids)
    by_rowid: dict[int, Entry] = {}
    for chunk in chunks(list(ids), CHUNK):
        marks = ",".join("?" * len(chunk))
        for rowid, *row in conn.execute(
            f"SELECT rowid, {NODE_COLUMNS}, access_count, last_access FROM nodes"
            f" WHERE repo = ? AND id IN ({marks})",
            [repo, *chunk],
        ):
            entry = Entry(repo, rowid, tuple(row[:NODE_WIDTH]), row[NODE_WIDTH],
                          row[NODE_WIDTH + 1])
            entries[row[0]] = entry
            if kinds is None or NODE_TYPES[row[1]] in kinds:
                entry.links = ALL if link is None else link.value
                by_rowid[rowid] = entry
    of_type = "" if link is None else " AND l.type = ?"
    typed = [] if link is None else [link.value]
    for part in chunks(list(by_rowid), CHUNK):
        marks = ",".join("?" * len(part))
        for src, dst, kind, other, other_kind in conn.execute(
            f"SELECT l.src, l.dst, l.type, b.id, b.type FROM links l"
            f" JOIN nodes b ON b.rowid = l.dst WHERE l.src IN ({marks}){of_type}",
            [*part, *typed],
        ):
            by_rowid[src].out.append((dst, kind, other, other_kind))
        for dst, src, kind, other, other_kind in conn.execute(
            f"SELECT l.dst, l.src, l.type, a.id, a.type FROM links l"
            f" JOIN nodes a ON a.rowid = l.src WHERE l.dst IN ({marks}){of_type}",
            [*part, *typed],
        ):
            by_rowid[dst].into.append((kind, src, other, other_kind))
    for entry in by_rowid.values():
        entry.out.sort(key=lambda link: (link[0], link[1]))
        entry.into.sort(key=lambda link: (link[0], link[1]))
    return entries

