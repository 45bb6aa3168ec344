"""`SqlMaintenance`: the SQL of graph maintenance (`graph.maintenance` decides), once for both
backends; each method runs inside the caller's transaction under the repo's lock. A node's
links, vector and search entry go with it (ON DELETE CASCADE); ids come back in rowid order."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from mnemo.config import Config
from mnemo.graph import maintenance
from mnemo.graph.maintenance import ConsolidationReport, DecayReport, ValidationReport
from mnemo.graph.model import NodeType, node_value, now_utc
from mnemo.storage.graph_base import GraphBase
from mnemo.storage.graph_writes import SqlGraphWrites
from mnemo.storage.sql import Statements, moment, number


def _group(value: object) -> str | None:
    """A trajectory or episode id from a node's data, as SQLite's json_extract gives it."""
    if value is None:
        return None
    return str(int(value)) if isinstance(value, bool) else str(value)


class SqlMaintenance(SqlGraphWrites):
    # The columns of a new link: its repo (PostgreSQL's links keep it) and its ends.
    LINKS = "links(src, dst, type)"
    FALSE, TRUE = "0", "1"
    HAS_VECTOR = "v.node = n.rowid"
    # A link with an end gone (one parameter: the repo).
    DANGLING = ""
    # `.format(alias, name)`: the data field `name` of the node `alias` ("e." or "").
    FIELD = "json_extract({}data, '$.{}')"
    # `.format(node)`: what a new link copied from the row `node` gives before its ends.
    REPO = ""

    # How many of the repo's vectors are not of `dim` numbers.
    _bad_vectors: Callable[[Statements, str, int], Awaitable[int]]
    # Rebuilds the repo's search entries if they disagree with its nodes; whether it did.
    _search_rebuilt: Callable[[Statements, str], Awaitable[bool]]

    async def unconsolidated(self, sql: Statements, repo: str) -> set[str]:
        return {row[0] for row in await sql.rows(
            "SELECT id FROM nodes WHERE repo = ? AND type = 'semantic'"
            f" AND consolidated = {self.FALSE}", (repo,),
        )}

    async def merge_duplicates(self, sql: Statements, repo: str, pairs: list[tuple[str, str]],
                               examined: list[str]) -> tuple[list[str], ConsolidationReport]:
        """Folds each group of `merge_groups(pairs)` into its survivor, deletes the members and
        the tags left unlinked, and marks `examined` as consolidated; the ids deleted."""
        involved = sorted({node_id for pair in pairs for node_id in pair})
        # By id: (key, last access); the rows as `merge_groups` reads them. Locked: a recall
        # counting a member's access waits for this transaction.
        keys: dict[str, tuple[Any, Any]] = {}
        rows: dict[str, maintenance.MergeRow] = {}
        for node_id, rowid, key, data, count, last, source, text in await sql.rows(
            f"SELECT id, rowid, {self.KEY}, data{self.TEXT}, access_count, last_access,"
            f" source_id, text FROM nodes WHERE repo = ? AND id{self.ANY}"
            f" ORDER BY rowid{self.LOCK}", (repo, self._list(involved)),
        ):
            keys[node_id] = (key, last)
            rows[node_id] = (int(rowid), json.loads(data), int(count), source, str(text))
        moved = 0
        merged: list[str] = []
        for survivor, members in maintenance.merge_groups(pairs, rows).items():
            _, data, count, _, _ = rows[survivor]
            last = keys[survivor][1]
            for member in members:
                moved += await self._move_links(sql, keys[member][0], keys[survivor][0])
                _, other, other_count, _, _ = rows[member]
                data = maintenance.merged_data(data, other, member)
                count += other_count
                last = max(filter(None, (last, keys[member][1])), key=moment, default=None)
                merged.append(member)
            await sql.run(
                "UPDATE nodes SET data = ?, access_count = ?, last_access = ? WHERE id = ?",
                (self._json(data), count, last, survivor),
            )
        await self._delete(sql, merged)
        tags = await self._orphans(sql, repo, (NodeType.TAG,))
        await self._delete(sql, tags)
        await self._recorded(sql, repo, "consolidate", merged + tags)
        if examined:
            await sql.run(f"UPDATE nodes SET consolidated = {self.TRUE}"
                          f" WHERE repo = ? AND id{self.ANY}", (repo, self._list(examined)))
        return merged + tags, ConsolidationReport(len(examined), len(merged), moved, len(tags))

    async def _move_links(self, sql: Statements, member: object, survivor: object) -> int:
        """Re-points the member's links to the survivor (duplicates and links between the two
        dropped); returns how many were added."""
        moved = 0
        for end, other in (("src", "dst"), ("dst", "src")):
            ends = "?, l.dst" if end == "src" else "l.src, ?"
            back = "r.src = l.dst AND r.dst = ?" if end == "src" else "r.src = ? AND r.dst = l.src"
            moved += await sql.run(
                f"INSERT INTO {self.LINKS} SELECT {self.REPO.format('l')}{ends}, l.type"
                f" FROM links l WHERE l.{end} = ? AND l.{other} <> ? AND NOT EXISTS (SELECT 1"
                f" FROM links r WHERE {back} AND r.type = l.type) ON CONFLICT DO NOTHING",
                (survivor, member, survivor, survivor),
            )
        return moved

    async def decay_sweep(self, sql: Statements, repo: str, config: Config,
                          now: datetime) -> tuple[list[str], DecayReport]:
        """`GraphMaintenance.decay_sweep` by `node_value`; the ids deleted, memories first."""
        kinds = [kind.value for kind in maintenance.VALUED]
        examined, doomed = await self._below_threshold(
            sql, f"repo = ? AND type{self.ANY}", (repo, self._list(kinds)), config, now
        )
        # The scan took no locks: the candidates are locked and valued again.
        if doomed and self.LOCK:
            _, doomed = await self._below_threshold(
                sql, f"id{self.ANY}", (self._list(doomed),), config, now, lock=True
            )
        await self._delete(sql, doomed)
        pruned = await self._orphans(sql, repo, maintenance.ROUTES)
        await self._delete(sql, pruned)
        await self._recorded(sql, repo, "decay", doomed + pruned)
        return doomed + pruned, DecayReport(examined, len(doomed), len(pruned))

    async def _below_threshold(self, sql: Statements, where: str, params: tuple[object, ...],
                               config: Config, now: datetime, *,
                               lock: bool = False) -> tuple[int, list[str]]:
        """How many nodes `where` selects, and the ids (in rowid order) of those whose
        `node_value` at `now` is below `config.decay_threshold`."""
        rows = await sql.rows(
            "SELECT id, type, created_at, last_access, access_count,"
            f" {self.FIELD.format('', 'reward')}, {self.FIELD.format('', 'return_score')},"
            f" {self.FIELD.format('', 'confidence')} FROM nodes WHERE {where} ORDER BY rowid"
            + (self.LOCK if lock else ""),
            params,
        )
        below = [
            node_id
            for node_id, kind, created, last, count, step_reward, score, confidence in rows
            if node_value(
                NodeType(kind),
                {"reward": step_reward, "return_score": score, "confidence": confidence},
                created_at=moment(created), last_access=None if last is None else moment(last),
                access_count=int(count or 0), now=now, config=config,
            ) < config.decay_threshold
        ]
        return len(rows), below

    async def validate(self, sql: Statements, repo: str, dim: int) -> ValidationReport:
        """Counts and repairs what `mnemo.graph.maintenance.validate_episodic` describes."""
        episodic = await number(
            sql, "SELECT count(*) FROM nodes WHERE repo = ? AND type = 'episodic'", repo
        )
        unlinked: list[list[tuple[str, str | None]]] = []
        restored = 0
        # (kind, link, data field naming the group, prefix of the group's node) of the two
        # links restored: a step's subgoal (by trajectory), a step's source (by episode).
        for kind, link, field, prefix in (("subgoal", "hierarchical", "trajectory_id", "subgoal_"),
                                          ("source", "provenance", "episode_id", "source_")):
            steps = [(node_id, _group(group)) for node_id, group in await sql.rows(
                f"SELECT e.id, {self.FIELD.format('e.', field)} FROM nodes e"
                f" WHERE e.repo = ? AND e.type = 'episodic' AND NOT {self._linked_to(kind, link)}"
                " ORDER BY e.rowid",
                (repo,),
            )]
            unlinked.append(steps)
            if steps:
                restored += await self._relink(sql, repo, steps, kind, link, field, prefix)
        dangling = await sql.run(f"DELETE FROM links WHERE {self.DANGLING}", (repo,))
        await self._recorded(sql, repo, "validate_episodic", [], changed=bool(restored or dangling))
        missing_vectors = await number(
            sql,
            "SELECT count(*) FROM nodes n WHERE n.repo = ?"
            f" AND NOT EXISTS (SELECT 1 FROM vectors v WHERE {self.HAS_VECTOR})",
            repo,
        )
        bad_vectors = await self._bad_vectors(sql, repo, dim)
        rebuilt = await self._search_rebuilt(sql, repo)
        return ValidationReport(episodic, len(unlinked[0]), len(unlinked[1]), restored,
                                dangling, missing_vectors, bad_vectors, rebuilt)

    def _linked_to(self, kind: str, link: str) -> str:
        return "(" + " OR ".join(
            f"EXISTS (SELECT 1 FROM links l JOIN nodes o ON o.{self.KEY} = l.{end}"
            f" WHERE l.{other} = e.{self.KEY} AND l.type = '{link}' AND o.type = '{kind}')"
            for end, other in (("src", "dst"), ("dst", "src"))) + ")"

    async def _relink(self, sql: Statements, repo: str, steps: list[tuple[str, str | None]],
                      kind: str, link: str, field: str, prefix: str) -> int:
        """Links each step to its trajectory's subgoal (episode's source): the one a sibling
        is linked to, else the node named `prefix` + the group."""
        key = self.KEY
        owners: dict[str, str] = {}
        for group, owner in await sql.rows(
            f"SELECT {self.FIELD.format('e.', field)}, o.id FROM nodes e"
            f" JOIN links l ON (l.dst = e.{key} OR l.src = e.{key}) AND l.type = ?"
            f" JOIN nodes o ON o.{key} = (CASE WHEN l.dst = e.{key} THEN l.src ELSE l.dst END)"
            " WHERE e.repo = ? AND e.type = 'episodic' AND o.type = ? ORDER BY e.rowid, o.rowid",
            (link, repo, kind),
        ):
            name = _group(group)
            if name is not None:
                owners.setdefault(name, owner)
        existing = {row[0] for row in await sql.rows(
            f"SELECT id FROM nodes WHERE repo = ? AND type = ? AND id{self.ANY}",
            (repo, kind, self._list(maintenance.wanted(steps, owners, prefix))),
        )}
        restored = 0
        for src, dst in maintenance.relinks(steps, owners, existing, prefix,
                                            to_step=kind == "subgoal"):
            restored += await sql.run(
                f"INSERT INTO {self.LINKS} SELECT {self.REPO.format('a')}a.{key},"
                f" b.{key}, ? FROM nodes a, nodes b WHERE a.repo = ? AND a.id = ?"
                " AND b.repo = ? AND b.id = ? ON CONFLICT DO NOTHING",
                (link, repo, src, repo, dst),
            )
        return restored

    async def _orphans(self, sql: Statements, repo: str,
                       kinds: Sequence[NodeType]) -> list[str]:
        return [row[0] for row in await sql.rows(
            f"SELECT n.id FROM nodes n WHERE n.repo = ? AND n.type{self.ANY}"
            f" AND NOT EXISTS (SELECT 1 FROM links l WHERE l.src = n.{self.KEY})"
            f" AND NOT EXISTS (SELECT 1 FROM links l WHERE l.dst = n.{self.KEY})"
            " ORDER BY n.rowid",
            (repo, self._list([kind.value for kind in kinds])),
        )]

    async def _recorded(self, sql: Statements, repo: str, operation: str, removed: list[str],
                        *, changed: bool = False) -> None:
        """The history's record of a maintenance that `removed` these nodes or else `changed`
        the graph (ids, never text); none for one that changed nothing."""
        if removed or changed:
            none = self._record([], False)
            await sql.run(
                "INSERT INTO commits(id, repo, seq, committed_at, nodes, links, retired, reworded,"
                " maintenance, removed) SELECT ?, ?, coalesce(max(seq), 0) + 1, ?, ?, ?, ?, ?, ?,"
                " ? FROM commits WHERE repo = ?",
                (f"maintenance_{uuid.uuid4().hex}", repo, self._time(now_utc().isoformat()),
                 self._record([], True), self._record([], True), none, none, operation,
                 self._record(removed, False), repo))

    async def _delete(self, sql: Statements, node_ids: list[str]) -> None:
        if node_ids:
            await sql.run(f"DELETE FROM nodes WHERE id{self.ANY}", (self._list(node_ids),))


class MaintainedGraph(GraphBase):
    """`graph.ports.GraphMaintenance`: the backend's `MAINTENANCE` run by its driver."""

    MAINTENANCE: SqlMaintenance

    async def unconsolidated(self, repo: str) -> set[str]:
        return await self._driver.read(lambda sql: self.MAINTENANCE.unconsolidated(sql, repo))

    async def merge_duplicates(
        self, repo: str, pairs: list[tuple[str, str]], examined: list[str]
    ) -> ConsolidationReport:
        deleted, report = await self._driver.write(
            lambda sql: self.MAINTENANCE.merge_duplicates(sql, repo, pairs, examined)
        )
        self._vectors.forget(repo, deleted)
        return report

    async def decay_sweep(self, repo: str, config: Config, *, now: datetime) -> DecayReport:
        deleted, report = await self._driver.write(
            lambda sql: self.MAINTENANCE.decay_sweep(sql, repo, config, now)
        )
        self._vectors.forget(repo, deleted)
        return report

    async def validate(self, repo: str, dim: int) -> ValidationReport:
        return await self._driver.write(lambda sql: self.MAINTENANCE.validate(sql, repo, dim))
