"""The history pages through httpx against the ASGI app: a repo's commits newest first, what
one changed, and a revert only with --allow-writes, from the app's own page."""

from __future__ import annotations

import re
from dataclasses import replace

import httpx
import pytest

import mnemo
from mnemo.graph.history import CommitDiff
from mnemo.ui.app import create_app
from mnemo.ui.source import MemorySource
from tests.ui.conftest import BASE, REPO, Sample, client_of, dump


def _commit_links(html: str) -> list[str]:
    return [unescape_amp(h) for h in re.findall(r'class="commit-link" href="([^"]+)"', html)]


def unescape_amp(text: str) -> str:
    return text.replace("&amp;", "&")


async def test_history_lists_commits_newest_first(
    client: httpx.AsyncClient, memory: mnemo.Memory, sample: Sample
) -> None:
    """The history page lists every commit newest first, each linked to its diff, with the
    goal it served, its session or source and its counts."""
    commits = await memory.history(REPO)
    page = await client.get("/history", params={"repo": REPO})
    assert page.status_code == 200
    assert _commit_links(page.text) == [f"/commit?repo={REPO}&id={c.id}" for c in commits]
    assert [c.source_id for c in commits] == ["chat-1", None]
    rows = page.text.split('class="commit"')[1:]
    assert "source <code" in rows[0]
    assert "chat-1" in rows[0]
    assert f"/session?id={sample.committed_session}" in unescape_amp(rows[1])
    goals = [re.findall(r'<span class="goal">([^<]+)</span>', row) for row in rows]
    assert goals == [["Plan the Lisbon trip"], ["Deploy the blog"]]
    counts = re.findall(r'data-label="nodes">(\d+)</td>\s*<td class="num" data-label="links">'
                        r'(\d+)</td>\s*<td class="num" data-label="retired">(\d+)</td>',
                        page.text)
    assert counts == [(str(c.node_count), str(c.link_count), str(c.retired_count))
                      for c in commits]
    assert "--allow-writes" in page.text


async def test_history_pages_by_limit(client: httpx.AsyncClient) -> None:
    """limit keeps the newest commits and offers more; a bad limit is a 400."""
    page = await client.get("/history", params={"repo": REPO, "limit": 1})
    assert len(_commit_links(page.text)) == 1
    assert 'id="more"' in page.text
    assert f"/history?repo={REPO}&limit=2" in unescape_amp(page.text)
    for bad in ("0", "1001", "x"):
        refused = await client.get("/history", params={"repo": REPO, "limit": bad})
        assert refused.status_code == 400


async def test_a_commit_page_shows_what_it_added(
    client: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """A commit's page lists the nodes it added by type and each link it added with the
    texts of both ends and its type; no revert form without --allow-writes."""
    session_commit = (await memory.history(REPO))[-1]
    diff = await memory.commit_diff(REPO, session_commit.id)
    page = await client.get("/commit", params={"repo": REPO, "id": session_commit.id})
    assert page.status_code == 200
    added = page.text.split('id="added"')[1].split("</section>")[0]
    for node in diff.nodes:
        assert f"id={node.id}".replace(":", "%3A") in added
    assert f"Nodes added ({len(diff.nodes)})" in added
    rows = re.findall(r'<tr class="link">(.*?)</tr>', page.text, re.S)
    assert len(rows) == len(diff.links) == session_commit.link_count
    membership = next(r for r in rows if "link-membership" in r)
    assert "type-tag" in membership.split("link-type")[0]
    assert "type-semantic" in membership.split("link-type")[1]
    assert "None: this commit contradicted no earlier fact." in page.text
    assert 'id="revert"' not in page.text
    assert '<span class="goal" id="goal">Deploy the blog</span>' in page.text


async def test_a_commit_page_shows_retired_facts_and_erased_nodes(memory: mnemo.Memory) -> None:
    """The facts a commit retired are listed struck through; nodes it added that are gone
    are counted."""
    commit = (await memory.history(REPO))[-1]
    real = await memory.commit_diff(REPO, commit.id)
    facts = [n for n in real.nodes if n.type is mnemo.NodeType.SEMANTIC]

    class Retiring(MemorySource):
        async def commit_diff(self, repo: str, commit_id: str) -> CommitDiff:
            return CommitDiff(replace(commit, retired=(facts[0].id,)), real.nodes[1:],
                              real.links, [facts[0]])

    async with client_of(create_app(Retiring(memory))) as c:
        page = await c.get("/commit", params={"repo": REPO, "id": commit.id})
    retired = page.text.split('id="retired"')[1].split("</section>")[0]
    assert "Facts retired (1)" in retired
    assert '<li class="retired">' in retired
    assert facts[0].text[:40] in retired
    assert "1 node it added is no longer in the graph" in page.text


@pytest.mark.parametrize(
    ("params", "status"),
    [({"repo": REPO, "id": "changeset_nope"}, 400), ({"repo": REPO}, 400),
     ({"repo": "nope", "id": "x"}, 404)],
)
async def test_unknown_commits_are_error_pages(
    client: httpx.AsyncClient, params: dict[str, str], status: int
) -> None:
    """An unknown commit or repo, or no id, is an error page that says which."""
    page = await client.get("/commit", params=params)
    assert page.status_code == status
    assert "Error" in page.text


async def test_read_only_offers_no_revert_and_refuses_one(
    client: httpx.AsyncClient, memory: mnemo.Memory, sample: Sample
) -> None:
    """Without --allow-writes a POST to /revert is a 403 and the commit stays; a GET of
    /revert is not a way to write either (405)."""
    newest = (await memory.history(REPO))[0]
    before = dump(sample.db)
    refused = await client.post(
        "/revert", data={"repo": REPO, "id": newest.id, "confirm": "yes"},
        headers={"origin": BASE},
    )
    assert refused.status_code == 403
    assert "--allow-writes" in refused.text
    got = await client.get("/revert", params={"repo": REPO, "id": newest.id, "confirm": "yes"})
    assert got.status_code == 405
    assert dump(sample.db) == before


async def test_a_revert_from_the_commit_page_undoes_it(
    writer: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """With --allow-writes, the commit page's form reverts the commit: its nodes go, the
    history lists the revert and the commit marked reverted, and the history page says so;
    the commit's page names its revert and offers no form."""
    newest = (await memory.history(REPO))[0]
    page = await writer.get("/commit", params={"repo": REPO, "id": newest.id})
    form = page.text.split('id="revert"')[1].split("</form>")[0]
    assert 'action="/revert" method="post"' in form
    assert f'name="id" value="{newest.id}"' in form
    unconfirmed = await writer.post("/revert", data={"repo": REPO, "id": newest.id})
    assert unconfirmed.status_code == 400
    assert newest.id in [c.id for c in await memory.history(REPO)]
    done = await writer.post("/revert", data={"repo": REPO, "id": newest.id, "confirm": "yes"})
    assert done.status_code == 303
    assert done.headers["location"] == f"/history?repo={REPO}&reverted={newest.id}"
    revert, reverted, *_ = await memory.history(REPO)
    assert (revert.reverts, reverted.id, reverted.reverted_by) == (newest.id, newest.id,
                                                                   revert.id)
    assert await memory.get_node(REPO, newest.node_ids[0]) is None
    shown = await writer.get(done.headers["location"])
    assert f"Reverted commit <code>{newest.id}</code>" in shown.text
    rows = shown.text.split('class="commit"')[1:]
    assert "revert of" in rows[0]
    assert "(reverted)" in rows[1]
    page = await writer.get("/commit", params={"repo": REPO, "id": newest.id})
    assert "Reverted by <a" in page.text
    assert 'id="revert"' not in page.text


async def test_a_revert_that_later_work_built_on_is_a_409(
    writer: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """Reverting a commit whose fact a later ingest retired is refused with the reason
    (409), and nothing changes."""
    await memory.ingest(
        REPO,
        mnemo.Trajectory("Fix the blog again", [
            mnemo.Step("Nginx returns 502: gunicorn listens on port 8000.", "ok")]),
        source_id="chat-2",
    )
    log = await memory.history(REPO)
    session_commit = next(c for c in log if c.session_id)
    assert log[0].retired
    page = await writer.post(
        "/revert", data={"repo": REPO, "id": session_commit.id, "confirm": "yes"}
    )
    assert page.status_code == 409
    assert "cannot be reverted" in page.text
    assert log[0].id in page.text
    assert [c.id for c in await memory.history(REPO)] == [c.id for c in log]


async def test_a_revert_form_is_bounded(writer: httpx.AsyncClient) -> None:
    """A form of another type, too large or with too many fields is a 400."""
    for kwargs in ({"json": {"repo": REPO}},
                   {"data": {"repo": REPO, "id": "x" * 20_000, "confirm": "yes"}},
                   {"data": {f"f{i}": "1" for i in range(40)}}):
        page = await writer.post("/revert", **kwargs)  # type: ignore[arg-type]
        assert page.status_code == 400
