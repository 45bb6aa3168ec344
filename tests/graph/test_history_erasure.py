"""Erasure reaches history: after `forget` and `purge`, no row of any table
holds a byte of what was erased, commit records included; on each backend."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import mnemo
from tests.backends import is_sqlite, sql
from tests.conftest import REPO
from tests.conversation._support import user


async def holding(mem: mnemo.Memory, text: str) -> dict[str, int]:
    """How many rows of each table hold `text` in any column: SQLite's columns cast to text
    (its full-text indexes through MATCH: their shadow tables store words prefix-compressed),
    PostgreSQL's rows as text (every column, search vectors' lexemes included)."""
    found: dict[str, int] = {}
    if is_sqlite(mem):
        tables = [name for (name,) in await sql(
            mem, "SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            if "_fts" in table:
                continue
            columns = [row[1] for row in await sql(mem, f"PRAGMA table_info([{table}])")]
            where = " OR ".join(f"instr(CAST([{c}] AS TEXT), ?) > 0" for c in columns)
            (n,), = await sql(mem, f"SELECT count(*) FROM [{table}] WHERE {where}",
                              *[text] * len(columns))
            if n:
                found[table] = int(n)
        for index in ("nodes_fts", "messages_fts"):
            (n,), = await sql(
                mem, f"SELECT count(*) FROM {index} WHERE {index} MATCH ?", f'"{text}"')
            if n:
                found[index] = int(n)
        return found
    tables = [name for (name,) in await sql(
        mem, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    for table in tables:
        (n,), = await sql(
            mem, f'SELECT count(*) FROM "{table}" t WHERE t::text ILIKE ?', f"%{text}%")
        if n:
            found[table] = int(n)
    return found


async def test_forget_and_purge_leave_no_byte_in_history(mem: mnemo.Memory) -> None:
    """A marker in an ingested source (its id and text) and in a thread is in the commit
    history before; after forget and purge no row holds it, while the history of what was not
    erased (a session's commit, another ingest) is still listed."""
    marker = f"zq{uuid.uuid4().hex}qz"
    sid = await mem.start_session("explore the house", repo=REPO)
    await mem.append(sid, "walk north", "go north")
    kept = await mem.close_and_commit(sid)
    assert kept is not None
    source = f"doc-{marker}"
    await mem.ingest(REPO, mnemo.Trajectory(f"learn about {marker}", [
        mnemo.Step(f"The {marker} service listens on port 8080.", f"Restart {marker}."),
    ]), source_id=source)
    await mem.ingest(REPO, mnemo.Trajectory("water the plants", [
        mnemo.Step("The tomatoes need water daily.", "Water them."),
    ]), source_id="garden")
    conv = mem.conversation()
    await conv.save(f"thread-{marker}", [user(f"remember {marker} please")])
    assert [c.source_id for c in await mem.history(REPO)] == ["garden", source, None]
    before = await holding(mem, marker)
    assert {"commits", "nodes", "messages"} <= set(before), before

    assert await mem.forget(REPO, source) > 0
    await conv.purge(f"thread-{marker}")

    assert await holding(mem, marker) == {}
    history = await mem.history(REPO)
    assert [(c.source_id, c.session_id) for c in history] == [("garden", None), (None, sid)]
    assert history[-1].id == kept.changeset_id
    for commit in history:
        assert marker not in repr(await mem.commit_diff(REPO, commit.id))


async def test_a_shared_tag_no_longer_names_a_forgotten_source(mem: mnemo.Memory) -> None:
    """A tag two sources share survives forgetting the one that created it, without that
    source's id (the user's text) on its row."""
    marker = f"zq{uuid.uuid4().hex}qz"
    for source in (f"doc-{marker}", "garden"):
        await mem.ingest(REPO, mnemo.Trajectory("plants", [
            mnemo.Step(f"The tomatoes of {source} need water.", "Water them."),
        ]), source_id=source)
    await mem.forget(REPO, f"doc-{marker}")
    assert await mem.get_nodes_by_type(REPO, [mnemo.NodeType.TAG])
    assert await holding(mem, marker) == {}


async def test_a_forgotten_source_leaves_no_node_id_in_a_maintenance_record(
    mem: mnemo.Memory
) -> None:
    """A decay that removed a source's nodes keeps their ids until the source is forgotten:
    then its record names none of them (a source's ids are hashes of its name)."""
    await mem.open_repo(REPO)
    receipts = [await mem.ingest(REPO, mnemo.Trajectory(goal, [mnemo.Step(text, "Note.")]),
                                 source_id=source)
                for source, goal, text in [("alice-medical", "Visit", "Alice saw Dr Ruiz."),
                                           ("bob", "Trip", "Bob flew to Oslo.")]]
    decayed = await mem.decay(REPO, now=datetime(2200, 1, 1, tzinfo=UTC))
    [record] = [c for c in await mem.history(REPO) if c.maintenance == "decay"]
    assert len(record.removed) == decayed.deleted + decayed.pruned
    assert {*receipts[0].node_ids, *receipts[1].node_ids} <= set(record.removed)
    await mem.forget(REPO, "alice-medical")
    [after] = [c for c in await mem.history(REPO) if c.maintenance == "decay"]
    assert not set(receipts[0].node_ids) & set(after.removed)
    assert set(after.removed) == set(record.removed) - set(receipts[0].node_ids)
    assert set(receipts[1].node_ids) <= set(after.removed)
