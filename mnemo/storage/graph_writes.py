"""`SqlGraphWrites`: the SQL of the graph's writes, once for both backends, each inside the
caller's transaction under the repo's lock; erasures end with the backend's `SCRUB`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from mnemo.graph import erasure
from mnemo.graph.commit import KNOWLEDGE, CommitPlan
from mnemo.graph.erasure import Inherited, Plan, Scope, Shared
from mnemo.graph.maintenance import ROUTES
from mnemo.graph.model import Vector, now_utc, times
from mnemo.graph.ports import SideWrite
from mnemo.graph.scope import indexed, pairs
from mnemo.storage.graph_rows import COMMIT_COLUMNS
from mnemo.storage.row import Row, json_object
from mnemo.storage.sessions import SqlSessions
from mnemo.storage.sql import Dialect, Statements

_ROUTES = ", ".join(f"'{kind}'" for kind in ROUTES)
# A commit's record, `seq` the repo's last plus one (the caller holds the repo's lock).
_RECORD = (
    f"INSERT INTO commits({COMMIT_COLUMNS}) SELECT ?, ?, coalesce(max(seq), 0) + 1, ?, ?, ?, ?,"
    " ?, ?, ?, ?, NULL, ? FROM commits WHERE repo = ?"
)


class SqlGraphWrites(Dialect):
    # The column of `nodes` that a link's ends name.
    KEY = "rowid"
    LINK = (
        "src = (SELECT rowid FROM nodes WHERE id = ?) AND dst = (SELECT rowid FROM nodes"
        " WHERE id = ?) AND type = ?"
    )
    # Adds a link of (src, dst, type) or, one already there, counts one more commit for it.
    ADD_LINK = (
        "INSERT INTO links(src, dst, type) VALUES ((SELECT rowid FROM nodes WHERE id = ?),"
        " (SELECT rowid FROM nodes WHERE id = ?), ?) ON CONFLICT DO UPDATE SET refs = refs + 1"
    )
    # How many of (src, dst, type, repo) `ADD_LINK` takes.
    LINK_PARAMS = 3
    ADD_VECTOR = (
        "INSERT INTO vectors(node, vec) SELECT rowid, ? FROM nodes WHERE id = ?"
        " ON CONFLICT DO NOTHING"
    )
    VECTOR_OF = "node = (SELECT rowid FROM nodes WHERE id = ?)"
    SET_INTENT = "json_set(data, '$.intent', ?)"
    ZEROS = "zeroblob(length(subgoal_vec))"
    # The statements that end an erasure (the lexical index's slots wipe at a new epoch).
    SCRUB: tuple[str, ...] = ()
    SESSIONS: type[SqlSessions] = SqlSessions

    def _record(self, values: list[Any], packed: bool) -> object:
        """A list of a commit's record as stored (`packed`: one that grows with the commit)."""
        return self._json(values)

    @staticmethod
    def _receipt(text: str) -> object:
        return text

    @staticmethod
    def _loads(value: Any) -> Any:
        """A JSON column's value as read (None for NULL)."""
        return value

    async def write_commit(self, sql: Statements, plan: CommitPlan,
                           also: Sequence[SideWrite]) -> None:
        """See `CommitTarget.write_commit`: the rows only (the caller follows the vectors)."""
        repo, created = plan.repo, self._time(plan.created_at)
        metadata = self._json(dict(plan.metadata) if plan.metadata else None)
        await sql.run_many(
            "INSERT INTO nodes(id, repo, type, text, data, key, source_id, created_at,"
            " recorded_at, valid_from, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            [(n.id, repo, n.type.value, text, self._json(n.data), n.key, n.source_id, created,
              *map(self._time, times(n, plan.created_at)), metadata)
             for n, text, _ in plan.nodes],
        )
        await sql.run_many(
            "INSERT INTO node_scopes(repo, key, value, node) SELECT ?, ?, ?, rowid FROM nodes"
            " WHERE id = ? ON CONFLICT DO NOTHING",
            [(repo, key, indexed(value), n.id) for n, _, _ in plan.nodes
             for key, value in pairs(plan.metadata)],
        )
        await sql.run_many(self.ADD_VECTOR,
                           [(self._vector(vector), n.id) for n, _, vector in plan.nodes])
        await self._joined(sql, plan)  # before the rewordings
        for node_id, (text, vector) in plan.rewordings.items():
            await sql.run("UPDATE nodes SET text = ? WHERE id = ?", (text, node_id))
            await self._revector(sql, node_id, vector)
        await sql.run_many(self.ADD_LINK, [(k.src, k.dst, k.type.value, repo)[:self.LINK_PARAMS]
                                           for k in plan.links])
        await sql.run(
            "INSERT INTO applied_changesets(id, repo, receipt, applied_at) VALUES (?, ?, ?, ?)",
            (plan.changeset_id, repo, self._receipt(plan.receipt.to_json()), created),
        )
        await sql.run(_RECORD, (
            plan.changeset_id, repo, created, plan.session_id, plan.source_id,
            self._record([n.id for n, _, _ in plan.nodes], True),
            self._record([[k.src, k.dst, k.type.value] for k in plan.links], True),
            self._record([node_id for node_id, _ in plan.retired], False),
            self._record(sorted(plan.rewordings), False),
            self._record(sorted(plan.joined), False), None, repo,
        ))
        await sql.run_many(
            "UPDATE nodes SET retired_at = ?, valid_to = ? WHERE repo = ? AND id = ?",
            [(created, self._time(until or plan.created_at), repo, node_id)
             for node_id, until in plan.retired],
        )
        await self.SESSIONS.side_writes(sql, also)

    async def _joined(self, sql: Statements, plan: CommitPlan) -> None:
        """Adds the commit's contribution to each node it joined (`graph.erasure`)."""
        for node_id, brought in plan.joined.items():
            text, data, source, owners = cast(Row, await sql.row(
                "SELECT text, data, source_id, owners FROM nodes WHERE id = ?", (node_id,)))
            now = erasure.Contribution(text, json_object(self._loads(data)), source)
            await sql.run("UPDATE nodes SET owners = ? WHERE id = ?", (self._json(erasure.joined(
                self._loads(owners), now, plan.changeset_id, brought)), node_id))

    async def _revector(self, sql: Statements, node_id: str, vector: Vector) -> None:
        await sql.run(f"UPDATE vectors SET vec = ? WHERE {self.VECTOR_OF}",
                      (self._vector(vector), node_id))

    async def _scrub(self, sql: Statements) -> None:
        for statement in self.SCRUB:
            await sql.run(statement)

    async def delete_nodes(self, sql: Statements, repo: str, ids: list[str]) -> list[str]:
        """See `GraphStore.delete_nodes`: returns those of `ids` that were rows. A source whose
        SOURCE node goes is no longer ingested: its payload ingests anew."""
        rows = await sql.rows(
            f"DELETE FROM nodes WHERE repo = ? AND id{self.ANY} RETURNING id, type, source_id",
            (repo, self._list(ids)))
        sources = [str(s) for _, kind, s in rows if kind == "source" and s is not None]
        if sources:
            await sql.run(f"DELETE FROM ingests WHERE repo = ? AND source_id{self.ANY}",
                          (repo, self._list(sources)))
        if rows:
            await self._scrub(sql)
        return [str(i) for i, _, _ in rows]

    async def _scope(self, sql: Statements, repo: str, key: str, one: bool) -> Scope:
        """The work of the source `key`'s commits (with `one`: of the commit `key`, to revert)."""
        params: tuple[str, ...] = (repo, key) if one else (repo, key, key, key)
        where = " AND id = ? AND reverted_by IS NULL" if one else (
            " AND reverts IS NULL AND (source_id = ? OR session_id = ? OR id IN (SELECT"
            " committed_in FROM steps WHERE episode_id = ? AND committed_in IS NOT NULL))")
        scope = Scope([], [], set(), set())
        ids = self._loads
        for commit_id, nodes, words, joined, links, retired, reverted_by in await sql.rows(
                "SELECT id, nodes, reworded, joined, links, retired, reverted_by FROM commits"
                f" WHERE repo = ?{where}", params):
            scope.records.append(str(commit_id))
            if reverted_by is not None:  # its work went with its revert
                continue
            scope.commits.append(str(commit_id))
            scope.added.update(map(str, ids(nodes)))
            scope.reworded.update(map(str, ids(words)))
            scope.joined.update(map(str, ids(joined)))
            scope.links.extend((str(s), str(d), str(t)) for s, d, t in ids(links))
            scope.retired.extend(map(str, ids(retired)))
        return scope

    async def inherited(self, sql: Statements, repo: str, key: str, one: bool) -> Inherited:
        """What withdrawing the source `key`'s commits (with `one`, the commit `key`) re-words."""
        scope = await self._scope(sql, repo, key, one)
        intents = sorted({str(i) for (i,) in await sql.rows(
            "SELECT id FROM nodes WHERE repo = ? AND type = 'intent'"
            f" AND (source_id = ? OR id{self.ANY})", (repo, key, self._list(sorted(scope.added)))
        )} | scope.reworded)
        procedures = [(str(i), str(n), self._loads(data), owner) for i, n, data, owner in
                      await sql.rows(
            f"SELECT i.id, n.id, n.data, n.source_id FROM nodes i JOIN links l ON l.src ="
            f" i.{self.KEY} JOIN nodes n ON n.{self.KEY} = l.dst WHERE i.id{self.ANY}"
            " AND l.type = 'hierarchical' AND n.type = 'procedural' ORDER BY n.created_at, n.rowid",
            (self._list(intents),))]
        rows = await sql.rows(
            "SELECT id, text, data, source_id, owners FROM nodes WHERE repo = ? AND type IN"
            f" ('semantic', 'procedural') AND (source_id = ? OR id{self.ANY}) ORDER BY id",
            (repo, key, self._list(sorted(scope.added | scope.joined))))
        shared: list[Shared] = [
            (str(i), erasure.Contribution(str(text), json_object(self._loads(data)), source),
             self._loads(owners), str(i) in scope.added or source == key)
            for i, text, data, source, owners in rows]
        return Inherited(intents, procedures, shared, frozenset(scope.commits))

    async def _withdraw(
        self, sql: Statements, repo: str, key: str, scope: Scope, plan: Plan
    ) -> list[str]:
        """Takes `scope`'s commits' work off the graph per `plan`; the ids of the nodes gone."""
        mine = {str(i): str(kind) for i, kind in await sql.rows(
            f"SELECT id, type FROM nodes WHERE repo = ? AND (source_id = ? OR id{self.ANY})",
            (repo, key, self._list(sorted(scope.added))))}
        own = sorted(i for i, kind in mine.items() if kind not in (*ROUTES, *KNOWLEDGE))
        own += sorted(i for i, (left, _) in plan.shared.items() if left is None) + plan.dropped
        routes = {i for i, kind in mine.items() if kind in ROUTES} | set(plan.intents)
        await sql.run_many(f"UPDATE links SET refs = refs - 1 WHERE {self.LINK}", scope.links)
        await sql.run_many(f"DELETE FROM links WHERE {self.LINK} AND refs <= 0", scope.links)
        ends = sorted({end for src, dst, _ in scope.links for end in (src, dst)})
        listed = self._list(own)
        routes.update(str(i) for (i,) in await sql.rows(
            f"SELECT id FROM nodes WHERE repo = ? AND id{self.ANY} AND type IN ({_ROUTES})"
            f" UNION SELECT n.id FROM nodes d JOIN links l ON l.dst = d.{self.KEY} JOIN nodes n"
            f" ON n.{self.KEY} = l.src WHERE d.id{self.ANY} AND n.type IN ({_ROUTES})"
            f" UNION SELECT n.id FROM nodes d JOIN links l ON l.src = d.{self.KEY} JOIN nodes n"
            f" ON n.{self.KEY} = l.dst WHERE d.id{self.ANY} AND n.type IN ({_ROUTES})",
            (repo, self._list(ends), listed, listed)))
        await sql.run(f"DELETE FROM nodes WHERE id{self.ANY}", (listed,))
        for intent_id, (heir, vector) in plan.heirs.items():
            await sql.run(
                f"UPDATE nodes SET text = ?, data = {self.SET_INTENT}, source_id = ?"
                " WHERE repo = ? AND id = ?",
                (heir.text, heir.text, heir.source_id, repo, intent_id))
            await self._revector(sql, intent_id, vector)
        for node_id, (left, made) in plan.shared.items():
            if left is not None:
                await sql.run(
                    "UPDATE nodes SET text = ?, data = ?, source_id = ?, owners = ? WHERE id = ?",
                    (left.heir.text, self._json(left.heir.data), left.heir.source_id,
                     self._json(left.owners), node_id))
                if made is not None:
                    await self._revector(sql, node_id, made)
        orphans = [str(i) for (i,) in await sql.rows(
            f"DELETE FROM nodes WHERE id{self.ANY} AND NOT EXISTS (SELECT 1 FROM links l"
            f" WHERE l.src = nodes.{self.KEY} OR l.dst = nodes.{self.KEY}) RETURNING id",
            (self._list(sorted(routes - set(own))),))]
        await sql.run(
            "UPDATE nodes SET retired_at = NULL, valid_to = NULL"
            f" WHERE repo = ? AND id{self.ANY}", (repo, self._list(scope.retired)))
        return own + orphans

    async def withdraw(
        self, sql: Statements, repo: str, key: str, also: Sequence[SideWrite], plan: Plan,
        revert_id: str | None,
    ) -> list[str]:
        """See `GraphStore.withdraw` (`revert_id` for a revert): the ids of the nodes that went;
        a forget erases the source's stored work too (`_erase_work`)."""
        scope = await self._scope(sql, repo, key, revert_id is not None)
        gone = await self._withdraw(sql, repo, key, scope, plan)
        if revert_id is not None:
            # The revert's record; an ingested source's id is free again.
            empty = (self._record([], True),) * 2 + (self._record([], False),) * 3
            await sql.run(_RECORD, (revert_id, repo, self._time(now_utc().isoformat()), None,
                                    None, *empty, key, repo))
            await sql.run("UPDATE commits SET reverted_by = ? WHERE id = ?", (revert_id, key))
            await sql.run("DELETE FROM ingests WHERE repo = ? AND changeset_id = ?", (repo, key))
            return gone
        # A node still used elsewhere stays, but no longer names the source.
        await sql.run(
            "UPDATE nodes SET source_id = NULL WHERE repo = ? AND source_id = ?", (repo, key))
        records = self._list(scope.records)
        await self._unnamed(sql, repo, records)
        await sql.run(f"DELETE FROM commits WHERE repo = ? AND (id{self.ANY} OR reverts{self.ANY})",
                      (repo, records, records))
        await self._erase_work(sql, repo, key, scope.records)
        await self.SESSIONS.side_writes(sql, also)
        if gone or plan.heirs or plan.shared or scope.records:
            await self._scrub(sql)
        return gone

    async def _unnamed(self, sql: Statements, repo: str, records: object) -> None:
        """Leaves no id of a node these commits made in a maintenance record's `removed`."""
        made = {node_id for (nodes,) in await sql.rows(
            f"SELECT nodes FROM commits WHERE repo = ? AND id{self.ANY}", (repo, records))
            for node_id in self._loads(nodes)}
        for commit_id, removed in await sql.rows(
                "SELECT id, removed FROM commits WHERE repo = ? AND maintenance IS NOT NULL",
                (repo,)):
            ids = self._loads(removed)
            kept = [node_id for node_id in ids if node_id not in made]
            if len(kept) < len(ids):
                await sql.run("UPDATE commits SET removed = ? WHERE id = ?",
                              (self._record(kept, False), commit_id))

    async def _erase_work(self, sql: Statements, repo: str, key: str,
                           commits: list[str]) -> None:
        """Erases a forgotten source's stored work: a session of the repo goes whole (its row,
        episodes, steps, kept replies, operations and changeset); an episode goes whole once
        finished or its session ended (an open one with its session's changeset and
        operations); an open one's committed steps keep their index but lose words, metadata
        and vector."""
        rows = await sql.rows(  # locked first (not the sessions): a reply being kept is in
            "SELECT e.id, e.status, e.session_id, (SELECT s.ended FROM sessions s WHERE s.id ="
            " e.session_id) FROM episodes e WHERE e.session_id IN (SELECT id FROM sessions"
            f" WHERE repo = ?) AND (e.session_id = ? OR e.id = ?){self.LOCK}", (repo, key, key))
        episodes = [(str(e), status != "open" or session == key or bool(ended))
                    for e, status, session, ended in rows]
        # What a forgotten session, or an ended one of its open episode, left goes with it:
        # its changeset, and its operations' words.
        left = [str(session) for e, status, session, ended in rows
                if e == key and status == "open" and ended]
        over = self._list([e for e, whole in episodes if whole])
        for table in ("steps", "task_results"):
            await sql.run(f"DELETE FROM {table} WHERE episode_id{self.ANY}", (over,))
        await sql.run(f"DELETE FROM episodes WHERE id{self.ANY}", (over,))
        await sql.run(
            "UPDATE steps SET observation = '', action = '', state_summary = '', subgoal = '',"
            f" metadata = NULL, subgoal_vec = {self.ZEROS} WHERE episode_id{self.ANY}"
            f" AND committed_in{self.ANY}",
            (self._list([e for e, whole in episodes if not whole]), self._list(commits)))
        if await sql.run("DELETE FROM sessions WHERE id = ? AND repo = ?", (key, repo)):
            left.append(key)
        if left:  # an answered operation keeps its result for the Memory that accepted it
            ended = (self._list(left),)
            await sql.run(f"DELETE FROM changesets WHERE session_id{self.ANY}", ended)
            await sql.run(f"DELETE FROM ops WHERE session_id{self.ANY} AND result IS NULL", ended)
            await sql.run(f"UPDATE ops SET args = ? WHERE session_id{self.ANY}",
                          (self._json([]), *ended))
