"""Every route of the web app, through httpx against the ASGI app (no server, no browser)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote, unquote

import httpx
import pytest

import mnemo
from mnemo.ui.app import DEFAULT_BUDGET, LIST_LIMIT, create_app
from tests.conversation._support import count_log_reads
from tests.ui.conftest import BASE, REPO, THREAD, Sample, dump


def _links(html: str) -> list[str]:
    return [h.replace("&amp;", "&") for h in re.findall(r'(?:href|src)="([^"#]+)', html)]


async def _node_ids(memory: mnemo.Memory, types: Sequence[mnemo.NodeType]) -> list[str]:
    return [n.id for n in await memory.get_nodes_by_type(REPO, types)]


async def test_index_lists_repos_sessions_and_threads(client: httpx.AsyncClient) -> None:
    """The home page links each repo's graph and playground, sessions and threads."""
    page = await client.get("/")
    assert page.status_code == 200
    assert "read-only" in page.text
    links = _links(page.text)
    assert f"/graph?repo={REPO}" in links
    assert f"/recall?repo={REPO}" in links
    assert "2 live sessions" in page.text
    assert "1 thread<" in page.text


async def test_graph_page_lists_nodes_tags_and_intents(
    client: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """The graph page shows the newest facts, each tag and each intent as node links."""
    page = await client.get("/graph", params={"repo": REPO})
    assert page.status_code == 200
    for node_id in await _node_ids(
        memory, [mnemo.NodeType.SEMANTIC, mnemo.NodeType.TAG, mnemo.NodeType.INTENT]
    ):
        assert f"/node?repo={REPO}&id={node_id}" in _links(page.text)
    episodic = await client.get("/graph", params={"repo": REPO, "type": "episodic"})
    assert "Bind gunicorn to 127.0.0.1:8000" in episodic.text


async def test_graph_search_finds_nodes_by_text(client: httpx.AsyncClient) -> None:
    """A search lists the nodes whose text holds the words; none for an unknown word."""
    page = await client.get("/graph", params={"repo": REPO, "q": "certbot"})
    results = page.text.split('id="results"')[1]
    assert "certbot" in results
    assert "matching “certbot”" in results
    none = await client.get("/graph", params={"repo": REPO, "q": "zeppelin"})
    assert "0 nodes matching" in none.text


async def test_fact_page_shows_links_and_provenance_to_its_session_steps(
    client: httpx.AsyncClient, memory: mnemo.Memory, sample: Sample
) -> None:
    """A fact's page lists its links by type and the steps it came from, linked to the
    session page at the step."""
    facts = await memory.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    fact = next(f for f in facts if "gunicorn" in f.text)
    page = await client.get("/node", params={"repo": REPO, "id": fact.id})
    assert page.status_code == 200
    provenance = page.text.split('id="provenance"')[1].split("</section>")[0]
    assert "nginx returns 502" in provenance
    steps = await memory.get_linked_nodes(REPO, [fact.id], mnemo.LinkType.PROVENANCE)
    step_id = steps[0].data["step_id"]
    assert f"/session?id={sample.committed_session}#step-{step_id}" in provenance.replace(
        "&amp;", "&"
    )
    links = page.text.split('id="links"')[1]
    assert "provenance (" in links
    assert "membership (" in links


async def test_ingested_step_is_marked_as_ingested(
    client: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """A fact from an ingest leads to its step, which no session stored."""
    facts = await memory.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    fact = next(f for f in facts if "vegetarian" in f.text)
    page = await client.get("/node", params={"repo": REPO, "id": fact.id})
    provenance = page.text.split('id="provenance"')[1].split("</section>")[0]
    assert "Dana is vegetarian" in provenance
    assert "ingested" in provenance
    assert "/session?" not in provenance


async def test_a_source_page_lists_its_steps_as_links_not_as_its_provenance(
    client: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """A source's PROVENANCE links end at the steps that came from it: its page lists them
    among its links, never under "the steps it came from" (as `mnemo show` does)."""
    [source, *_] = await memory.get_nodes_by_type(REPO, [mnemo.NodeType.SOURCE])
    page = await client.get("/node", params={"repo": REPO, "id": source.id})
    assert page.status_code == 200
    assert 'id="provenance"' not in page.text
    assert "provenance (" in page.text.split('id="links"')[1]


async def test_tag_and_intent_pages_list_their_facts_and_procedures(
    client: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """Facts by tag and procedures by intent: a routing node's page lists what it leads to."""
    for kind, member in ((mnemo.NodeType.TAG, mnemo.LinkType.MEMBERSHIP),
                         (mnemo.NodeType.INTENT, mnemo.LinkType.HIERARCHICAL)):
        route = (await memory.get_nodes_by_type(REPO, [kind]))[0]
        led = await memory.get_linked_nodes(REPO, [route.id], member)
        page = await client.get("/node", params={"repo": REPO, "id": route.id})
        members = page.text.split('id="members"')[1].split("</section>")[0]
        for node in led:
            assert f"/node?repo={REPO}&amp;id={node.id}" in members


async def test_recall_playground_shows_phase_hop_and_score(
    client: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """A query returns the same memories as mem.recall, each with score, phase and hop."""
    page = await client.get("/recall", params={"repo": REPO, "q": "which port for gunicorn?"})
    assert page.status_code == 200
    expected = await memory.recall(REPO, "which port for gunicorn?", reinforce=False)
    rows = re.findall(
        r'<td class="score">([\d.]+)</td>\s*<td class="phase">(\w+)</td>\s*'
        r'<td class="hop">(\d+)</td>\s*<td><a class="node-link" '
        r'href="/node\?repo=ops&amp;id=([^"&]+)',
        page.text,
    )
    # A step's id holds ':' ("episodic_<episode>:<index>"), percent-encoded in the link.
    assert [(score, phase, hop, unquote(node)) for score, phase, hop, node in rows] == [
        (f"{m.score:.3f}", m.phase, str(m.hop), m.node.id) for m in expected.memories
    ]
    assert rows


async def test_recall_playground_filters_types_and_k(client: httpx.AsyncClient) -> None:
    """types and k narrow the playground's recall like recall's own arguments."""
    page = await client.get(
        "/recall", params={"repo": REPO, "q": "nginx gunicorn certbot", "k": 1,
                           "types": "episodic"}
    )
    hits = re.findall(r'<tr class="hit">.*?type-(\w+)', page.text, re.S)
    assert hits == ["episodic"]


async def test_bad_recall_input_is_a_400_page_that_says_why(client: httpx.AsyncClient) -> None:
    """A k out of range or an unknown type is a 400 with the reason, not a crash."""
    page = await client.get("/recall", params={"repo": REPO, "q": "x", "k": "0"})
    assert page.status_code == 400
    assert "k must be between 1 and 50" in page.text
    page = await client.get("/recall", params={"repo": REPO, "q": "x", "types": "bogus"})
    assert page.status_code == 400
    assert "types must be node types" in page.text


async def test_sessions_page_shows_each_state(client: httpx.AsyncClient, sample: Sample) -> None:
    """The sessions page lists live sessions with their state, goal and steps."""
    page = await client.get("/sessions")
    assert f"/session?id={sample.live_session}" in _links(page.text)
    assert "state-collecting" in page.text
    assert "state-idle" in page.text
    assert "Tune postgres" in page.text


async def test_session_page_shows_episodes_trajectories_and_steps(
    client: httpx.AsyncClient, sample: Sample
) -> None:
    """A session page shows its state, each episode's trajectories and steps by id."""
    page = await client.get("/session", params={"id": sample.committed_session})
    assert page.status_code == 200
    assert "Deploy the blog" in page.text
    assert "committed" in page.text
    assert page.text.count('class="step"') == 2
    assert "Trajectory 1" in page.text
    live = await client.get("/session", params={"id": sample.live_session})
    assert "state-collecting" in live.text
    assert "pgbouncer" in live.text


async def test_threads_and_thread_page_show_boundary_snapshots_and_goal_pins(
    client: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """The thread page shows the viewport boundary, the snapshot, the pin and every
    message marked by where it stands."""
    threads = await client.get("/threads")
    assert f"/thread?id={quote(THREAD, safe='')}" in _links(threads.text)
    page = await client.get("/thread", params={"id": THREAD, "budget": 300})
    assert page.status_code == 200
    viewport = await memory.viewport(THREAD, token_budget=300)
    assert viewport.boundary_seq > 0
    assert f"boundary at seq <b>{viewport.boundary_seq}</b>" in page.text
    assert page.text.count('class="message ') == 24
    assert page.text.count('class="message evicted"') == viewport.boundary_seq - 1  # 1 pin
    snapshots = page.text.split('id="snapshots"')[1].split("</ul>")[0]
    assert f"seq 0..{viewport.boundary_seq - 1}" in snapshots
    everything = await memory.viewport(THREAD, token_budget=10**6)
    assert [m.seq for m in everything.pinned] == [0]
    pins = page.text.split('id="pins"')[1].split("</ul>")[0]
    assert "Never run the orders_stage migration" in pins
    assert '<li class="message pinned" id="seq-0">' in page.text


@pytest.mark.parametrize("popped", [False, True])
async def test_long_thread_page_shows_one_page_and_links_the_others(
    client: httpx.AsyncClient, memory: mnemo.Memory, popped: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread longer than a page shows its newest `LIST_LIMIT` messages, reading no more of
    the thread than its page; the earlier and later links reach every other message, a page at
    a time, pages ending at the newest (also after a pop, whose seq is not reused)."""
    conv = memory.conversation()
    read = count_log_reads(monkeypatch)
    await conv.append(
        "long", [{"role": "user", "content": f"note {i}"} for i in range(2 * LIST_LIMIT + 5)])
    if popped:
        await conv.pop("long")
        await conv.append("long", [{"role": "user", "content": "again"}])
    address: str | None = "/thread?id=long"
    seen: list[int] = []
    while address is not None:
        page = await client.get(address)
        shown = [int(n) for n in re.findall(r'class="message [a-z]+" id="seq-(\d+)"', page.text)]
        assert 0 < len(shown) <= LIST_LIMIT
        seen = shown + seen
        assert max(read) <= LIST_LIMIT
        read.clear()
        earlier = re.search(r'id="earlier" href="([^"]+)"', page.text)
        address = earlier.group(1).replace("&amp;", "&") if earlier else None
    assert seen == [m.seq for m in await conv.raw("long")]
    if popped:
        return
    first = await client.get("/thread", params={"id": "long", "start": 0})
    assert "note 4 <" in first.text
    assert "note 5 <" not in first.text
    later = re.search(r'id="later" href="([^"]+)"', first.text)
    assert later is not None
    assert later.group(1).replace("&amp;", "&") == (
        f"/thread?id=long&budget={DEFAULT_BUDGET}&start=5")


@pytest.mark.parametrize(
    ("path", "params", "status", "says"),
    [
        ("/graph", {"repo": "nope"}, 404, "nope"),
        ("/graph", {}, 400, "repo"),
        ("/node", {"repo": REPO, "id": "node_missing"}, 404, "node_missing"),
        ("/session", {"id": "session_missing"}, 404, "session_missing"),
        ("/thread", {"id": "no-thread"}, 404, "no-thread"),
        ("/thread", {"id": THREAD, "budget": "lots"}, 400, "budget"),
    ],
)
async def test_unknown_things_are_error_pages(
    client: httpx.AsyncClient, path: str, params: dict[str, str], status: int, says: str
) -> None:
    """Unknown repos, nodes, sessions and threads are 404 pages; bad parameters 400."""
    page = await client.get(path, params=params)
    assert page.status_code == status
    assert says in page.text


async def _crawl(client: httpx.AsyncClient) -> set[str]:
    """Every address reached by following links from /, a search and a recall, each
    checked to answer 200; the addresses."""
    seen: set[str] = set()
    queue = ["/", f"/recall?repo={REPO}&q=gunicorn+port", f"/graph?repo={REPO}&q=nginx"]
    while queue:
        url = queue.pop()
        if url in seen:
            continue
        seen.add(url)
        page = await client.get(url)
        assert page.status_code == 200, url
        if page.headers["content-type"].startswith("text/html"):
            queue.extend(link for link in _links(page.text) if link.startswith("/"))
    return seen


async def test_every_link_of_every_page_works_and_nothing_is_written(
    client: httpx.AsyncClient, sample: Sample
) -> None:
    """Crawling every page from / (a recall included) gets no error and changes no row."""
    before = dump(sample.db)
    seen = await _crawl(client)
    assert len(seen) > 30
    assert "/static/htmx.min.js" in seen
    assert dump(sample.db) == before


async def test_with_writes_allowed_a_posted_recall_counts_accesses_and_a_get_does_not(
    writer: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """With --allow-writes, the playground's POST counts its results as accesses, as an
    agent's recall does; its GET still counts nothing (no GET writes)."""
    query = {"repo": REPO, "q": "gunicorn port"}
    looked = await writer.get("/recall", params=query)
    assert "writes allowed" in looked.text
    assert 'id="recall-count"' in looked.text
    ids = re.findall(r'class="hit">.*?id=(\w+)', looked.text, re.S)
    assert ids
    stats = await memory._graph.access_stats(REPO, ids)
    assert all(count == 0 for count, _ in stats.values())
    counted = await writer.post("/recall", data=query)
    assert counted.status_code == 200
    assert "counted as accesses" in counted.text
    assert re.findall(r'class="hit">.*?id=(\w+)', counted.text, re.S) == ids
    stats = await memory._graph.access_stats(REPO, ids)
    assert all(count == 1 for count, _ in stats.values())


async def test_read_only_refuses_a_counted_recall(
    client: httpx.AsyncClient, sample: Sample
) -> None:
    """Without --allow-writes the playground offers no counting button, and a POST to it is
    a 403 that writes nothing."""
    page = await client.get("/recall", params={"repo": REPO, "q": "gunicorn port"})
    assert 'id="recall-count"' not in page.text
    before = dump(sample.db)
    refused = await client.post(
        "/recall", data={"repo": REPO, "q": "gunicorn port"}, headers={"origin": BASE}
    )
    assert refused.status_code == 403
    assert "--allow-writes" in refused.text
    assert dump(sample.db) == before


async def test_a_crawl_with_writes_allowed_writes_nothing(
    writer: httpx.AsyncClient, sample: Sample
) -> None:
    """Every GET of every page, with --allow-writes on, leaves every row as it was."""
    before = dump(sample.db)
    seen = await _crawl(writer)
    assert f"/history?repo={REPO}" in seen
    assert any(url.startswith("/commit?") for url in seen)
    assert dump(sample.db) == before


def test_create_app_takes_one_view() -> None:
    """create_app refuses neither or both of a view and a view factory."""
    with pytest.raises(mnemo.InvalidInputError):
        create_app()


async def test_recall_and_search_take_a_scope(client: httpx.AsyncClient) -> None:
    """The playground's and the graph search's `where` keep to the scope (Dana's ingest);
    a malformed one is a 400 page that says why."""
    dana = await client.get("/recall", params={"repo": REPO, "q": "restaurants gunicorn",
                                               "where": "user_id=dana"})
    table = dana.text.split('id="recalled"')[1].split("</table>")[0]
    assert "vegetarian" in table
    assert "gunicorn" not in table
    assert 'value="user_id=dana"' in dana.text
    nobody = await client.get("/recall", params={"repo": REPO, "q": "restaurants",
                                                 "where": "user_id=bob"})
    assert "Nothing recalled." in nobody.text
    found = await client.get("/graph", params={"repo": REPO, "q": "nginx vegetarian",
                                               "where": "user_id=dana"})
    listed = found.text.split('class="nodes"')[1].split("</ul>")[0]
    assert "vegetarian" in listed
    assert "nginx" not in listed
    bad = await client.get("/recall", params={"repo": REPO, "q": "x", "where": "user_id"})
    assert bad.status_code == 400
    assert "KEY=VALUE" in bad.text
