"""Keyword search over messages and drill-down: safe queries, ranking, filters, views."""

from __future__ import annotations

import unicodedata
from datetime import timedelta

import anyio.from_thread
import pytest
from hypothesis import given, settings, strategies as st

import mnemo
from mnemo.conversation.search import hit_snippet, recency_weight
from mnemo.graph.model import now_utc
from mnemo.storage.sqlite.graph import match_expression as fts_match
from mnemo.text import MAX_QUERY_TERMS, query_words
from tests.conversation._support import (
    ManualClock,
    OfflineFake,
    assistant,
    tool_call,
    tool_result,
    user,
)
from tests.fakes import FakeEmbedder


def match_expression(query: str) -> str:
    """The FTS5 MATCH expression SQLite searches for a user query."""
    return fts_match(query_words(query))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("nginx proxy", '"nginx" OR "proxy"'),
        ("nginx AND proxy", '"nginx" OR "AND" OR "proxy"'),
        ("nginx AND NOT apache", '"nginx" OR "AND" OR "NOT" OR "apache"'),
        ("AND OR NOT", '"AND" OR "OR" OR "NOT"'),
        ('say "hi" NEAR(a b) col:x^*', '"say" OR "hi" OR "NEAR" OR "a" OR "b" OR "col" OR "x"'),
        ("and or not", '"and" OR "or" OR "not"'),
        ("*** ((( )))", ""),
        ("", ""),
    ],
)
def test_match_expression(query: str, expected: str) -> None:
    """Every word is quoted and OR-combined; AND, OR and NOT are words like any other."""
    assert match_expression(query) == expected


def test_recency_weight() -> None:
    """Recency halves a score at most: 1 now, 0.75 after 30 days, towards 0.5 later."""
    assert recency_weight(0) == 1.0
    assert recency_weight(-5) == 1.0
    assert recency_weight(30 * 86_400) == pytest.approx(0.75)
    assert 0.5 <= recency_weight(3650 * 86_400) < 0.5001


async def test_search_stems_and_snippets(cmem: mnemo.Memory) -> None:
    """Porter stemming matches word forms; hits carry ids, seqs and ~300-char snippets."""
    conv = cmem.conversation()
    long_tail = " ".join(["filler"] * 200)
    await conv.save("t", [user("How do I configure the reverse proxy?"),
                          assistant(f"Configuring proxies: {long_tail} the upstream block.")])
    hits = await cmem.search_messages("configured proxies")
    assert {(h.thread_id, h.seq) for h in hits} == {("t", 0), ("t", 1)}
    assert all(h.rank > 0 for h in hits)
    assert all(len(h.snippet) <= 300 for h in hits)
    raw = await conv.raw("t")
    assert {h.message_id for h in hits} == {m.id for m in raw}


async def test_a_snippet_is_the_message_when_it_fits_else_shows_the_word(
    cmem: mnemo.Memory,
) -> None:
    """The snippet is made from the text alike on both backends: the whole message when it
    fits, else from a little before the first query word (a two-letter word too), which long
    words before it never push out of the snippet."""
    conv = cmem.conversation()
    told = "old thread 7: the kafka broker k7 password rotation happens weekly " + "ok " * 60
    await conv.save("old", [user(told)])
    assert len(told.strip()) < 300
    [hit] = await cmem.search_messages("kafka rotation", thread_id="old")
    assert hit.snippet == told.strip()
    await conv.save("long", [user("x " * 200 + told)])
    [hit] = await cmem.search_messages("kafka broker", thread_id="long")
    assert hit.snippet.startswith("...x x x x old thread 7: the kafka broker")
    url = "https://example.com/" + "y" * 60
    await conv.save("urls", [user(" ".join([url] * 8) + " the kafka broker" + " z" * 200)])
    [hit] = await cmem.search_messages("kafka", thread_id="urls")
    assert "kafka broker" in hit.snippet
    assert len(hit.snippet) <= 300
    await conv.save("db", [user("word " * 100 + "then the db fell over" + " word" * 100)])
    [hit] = await cmem.search_messages("db", thread_id="db")
    assert "db fell over" in hit.snippet


@pytest.mark.parametrize(("text", "query", "shown"), [
    ("x " * 200 + "snake_case_name here", "name", "snake_case_name here"),
    ("x " * 200 + "rename it, then name it", "name", "rename it, then name it"),
    ("x " * 200 + "Le Café ouvre " + "y " * 200, "cafe", "Le Café ouvre"),
    ("é " * 200 + "the kafka broker " + "y " * 200, "kafka", "the kafka broker"),
    ("That idea was ideal " + "x " * 200 + "The ids collide.", "ids", "The ids collide."),
    ("I opened it " + "x " * 200 + "Ask ops to restart it.", "ops", "Ask ops to restart it."),
])
def test_a_snippet_finds_the_word_as_the_indexes_split_and_fold_it(
    text: str, query: str, shown: str
) -> None:
    """An underscore splits words, a word inside another is not the word, accents and case
    fold; the text is not ASCII as well."""
    snippet = hit_snippet(text, query_words(query))
    assert shown in snippet
    assert snippet.startswith("...")


async def test_search_filters_by_thread(cmem: mnemo.Memory) -> None:
    """thread_id restricts the search to that thread; limit bounds the hits."""
    conv = cmem.conversation()
    for thread in ("a", "b", "c"):
        await conv.save(thread, [user(f"kubernetes pods in cluster {thread}")] * 1)
    assert {h.thread_id for h in await cmem.search_messages("kubernetes")} == {"a", "b", "c"}
    assert [h.thread_id for h in await cmem.search_messages("kubernetes", thread_id="b")] == ["b"]
    assert len(await cmem.search_messages("kubernetes", limit=2)) == 2


async def test_search_reads_operators_as_words(cmem: mnemo.Memory) -> None:
    """AND, OR and NOT are words: "keep NOT delete" finds a message about deleting, and a
    query of only those words finds the messages that contain them."""
    conv = cmem.conversation()
    await conv.save("t", [user("never delete the production database"), user("nginx alone"),
                          user("apache alone"), user("this is not a drill")])
    assert {h.seq for h in await cmem.search_messages("keep NOT delete")} == {0, 3}
    assert {h.seq for h in await cmem.search_messages("nginx AND apache")} == {1, 2}
    assert {h.seq for h in await cmem.search_messages("nginx NOT apache")} == {1, 2, 3}
    assert {h.seq for h in await cmem.search_messages("AND OR NOT")} == {3}
    assert await cmem.search_messages("*** ((( )))") == []


async def test_search_folds_accents_in_the_query_and_the_text(cmem: mnemo.Memory) -> None:
    """A word matches with or without its accents, written either way in the query or the
    message, on both backends (PostgreSQL found "café" by "café" alone, FTS5 by "cafe" too);
    the snippet shows the message as written."""
    conv = cmem.conversation()
    await conv.save("t", [user("We met at the café"), user("Naïve résumé, crème brûlée"),
                          user("the cafe was closed"), user("a naive plan")])
    for query, seqs in [("cafe", {0, 2}), ("café", {0, 2}), ("CAFÉ", {0, 2}), ("Cafè", {0, 2}),
                        ("naive", {1, 3}), ("NAÏVE", {1, 3}), ("resume", {1}),
                        ("résumé", {1}), ("creme brulee", {1})]:
        assert {h.seq for h in await cmem.search_messages(query)} == seqs, query
    (hit,) = await cmem.search_messages("brulee")
    assert "Naïve résumé, crème brûlée" in hit.snippet


async def test_search_finds_the_words_of_paths_addresses_and_versions(
    cmem: mnemo.Memory,
) -> None:
    """A text is split into words at its punctuation on both backends, as FTS5 splits it:
    PostgreSQL's parser kept an email, a URL, a host, a file path or a version whole, so none
    of their words was found there."""
    conv = cmem.conversation()
    await conv.save("t", [
        user("mail alice@example.com or see https://docs.example.org/guide/page.html"),
        user("the file /etc/nginx/nginx.conf and version 1.2.3 at host db01.internal:5432"),
        user("a state-of-the-art snake_case_name"),
    ])
    for query, seqs in [("alice", {0}), ("example", {0}), ("docs", {0}), ("guide", {0}),
                        ("nginx", {1}), ("conf", {1}), ("internal", {1}), ("db01", {1}),
                        ("5432", {1}), ("1.2.3", {1}), ("art", {2}), ("snake", {2}),
                        ("snake_case_name", {2}), ("nginx.conf", {1})]:
        assert {h.seq for h in await cmem.search_messages(query)} == seqs, query


async def test_a_snippet_shows_a_word_found_inside_a_path(cmem: mnemo.Memory) -> None:
    """A message found by a word inside a path, far into it, is shown around that word, on
    both backends. PostgreSQL's `ts_headline` read the path as one token, found no query
    word in it, and showed the message's opening words; FTS5's 48 tokens ended at the word,
    past the 300 characters a snippet keeps."""
    conv = cmem.conversation()
    opening = " ".join(f"filler{i}" for i in range(80))
    await conv.save("t", [user(f"the {opening} then the tool went into /opt/toolbox/bin")])
    # "the" shows in the opening words, and is no sign of what the message was found by.
    for query in ["toolbox", "where is the toolbox"]:
        (hit,) = await cmem.search_messages(query)
        assert "/opt/toolbox/bin" in hit.snippet, query
        assert "filler0 " not in hit.snippet, query


# Texts whose words hold combining marks, format characters, or letters and digits with an
# accent: (message, text), then each query with the messages it finds on both backends.
MARKED = [
    (0, "हिन्दी भाषा"),
    (1, "שָלוֹם מַה"),
    (2, "مَرْحَبًا صَدِيقِي"),
    (3, "ภาษาไทยง่ายมาก"),
    (4, "e\u0301clair au chocolat"),  # decomposed: "e" and a combining acute accent
    (5, "un \u00e9clair"),
    (6, "persian می\u200cخواهم"),  # noqa: RUF001 (a zero-width non-joiner inside the word)
    (7, "zero\u200bwidth soft\u00adhyphen x\u2060y \ufeffbom"),
    (8, "café2 naïve2"),
]
MARKED_FOUND = [
    ("हिन्दी", {0}), ("भाषा", {0}), ("שָלוֹם", {1}), ("مَرْحَبًا", {2}), ("صَدِيقِي", {2}),
    ("ภาษาไทยง่ายมาก", {3}), ("e\u0301clair", {4, 5}), ("\u00e9clair", {4, 5}),
    ("eclair", {4, 5}), ("می\u200cخواهم", {6}), ("خواهم", {6}), ("zero", {7}),  # noqa: RUF001
    ("width", {7}), ("zero\u200bwidth", {7}), ("hyphen", {7}), ("y", {7}), ("bom", {7}),
    ("cafe2", {8}), ("café2", {8}), ("naive2", {8}),
]


async def test_search_finds_words_with_marks_and_format_characters(cmem: mnemo.Memory) -> None:
    """A word with combining marks is found by its own text on both backends (its query word
    was cut at each mark, which PostgreSQL's words keep), decomposed or not; a word is split at
    an invisible format character on both (PostgreSQL read it as a letter); and an accent
    folds in a word of letters and digits (PostgreSQL kept it)."""
    await cmem.conversation().save("t", [user(text) for _, text in MARKED])
    for query, seqs in MARKED_FOUND:
        assert {h.seq for h in await cmem.search_messages(query)} == seqs, query


@pytest.mark.parametrize("query", ["", "   ", None, 3])
async def test_blank_query_refused(cmem: mnemo.Memory, query: object) -> None:
    """A blank or non-string query is InvalidInputError."""
    with pytest.raises(mnemo.InvalidInputError):
        await cmem.search_messages(query)  # type: ignore[arg-type]


async def test_search_prefers_recent_on_a_tie(cmem: mnemo.Memory) -> None:
    """Of two equally relevant messages the newer ranks first."""
    clock = ManualClock(now_utc() - timedelta(days=90))
    conv = cmem.conversation(clock=clock)
    await conv.save("old", [user("the invoice total was wrong")])
    clock.advance(days=89)
    await conv.save("new", [user("the invoice total was wrong")])
    hits = await cmem.search_messages("invoice total")
    assert [h.thread_id for h in hits] == ["new", "old"]
    assert hits[0].rank > hits[1].rank


async def test_a_rare_word_outranks_a_common_one_repeated(cmem: mnemo.Memory) -> None:
    """bm25 on both backends: a word in few messages weighs more than one in most of them,
    even repeated (PostgreSQL's `ts_rank` alone has no idf, and ranked the repetition first)."""
    conv = cmem.conversation()
    await conv.save("t", [user(f"server status check {i}") for i in range(20)]
                    + [user("server server server status"), user("kubernetes upgrade planned")])
    hits = await cmem.search_messages("server kubernetes", limit=3)
    assert hits[0].seq == 21
    assert hits[1].seq == 20


async def test_a_message_with_every_word_outranks_a_short_one_with_one(
    cmem: mnemo.Memory
) -> None:
    """bm25's length term saturates: a message holding both query words outranks an older
    one-word message holding only one, on both backends (PostgreSQL's `ts_rank` divided by
    the length's log, and ranked the one-word message first)."""
    conv = cmem.conversation()
    filler = [user(f"unrelated chatter number {i} about lunch and weather") for i in range(20)]
    await conv.save("t", [user("nginx"), *filler,
                          user("Please restart nginx, the login page shows 502.")])
    for query in ("nginx restart", "restart nginx login"):
        hits = await cmem.search_messages(query, limit=3)
        assert [h.seq for h in hits] == [21, 0], query


async def test_exclude_viewport_of(cmem: mnemo.Memory) -> None:
    """exclude_viewport_of leaves out what that thread's viewport shows, not what it evicted
    or what other threads hold."""
    conv = cmem.conversation()
    history = [user(f"database migration step {i} for the billing service") for i in range(12)]
    await conv.save("t", history)
    await conv.save("other", [user("database migration elsewhere")])
    await cmem.evict("t", token_budget=10_000, eviction_fraction=0.5)
    boundary = (await cmem.viewport("t", token_budget=10_000)).boundary_seq
    hits = await cmem.search_messages("database migration", limit=20, exclude_viewport_of="t")
    assert {(h.thread_id, h.seq) for h in hits} == {("other", 0)} | {
        ("t", s) for s in range(boundary)
    }


def test_hostile_queries_are_safe(store: str) -> None:
    """Any text but a blank one (of whitespace, control and format characters alone) is a safe
    query: no error, only hits (or none)."""
    with anyio.from_thread.start_blocking_portal() as portal, portal.wrap_async_context_manager(
        mnemo.Memory(store, llm=OfflineFake(), embedder=FakeEmbedder())
    ) as mem:
        conv = mem.conversation()
        portal.call(conv.save, "t", [user('quote " star * caret ^ colon : NEAR(x y) AND OR')])

        @settings(max_examples=150, deadline=None)
        @given((
            st.text(min_size=1, max_size=60)
            | st.lists(
                st.sampled_from(['"', "*", "^", ":", "(", ")", "AND", "OR", "NOT", "NEAR",
                                 "quote", "-", "+", "{", "}", "col:", "'", "\\", "\x00", "é",
                                 "\u0301", "\u094d", "\u200b", "_", "x\u200cy"]),
                min_size=1, max_size=8,
            ).map(" ".join)
        ).filter(lambda q: any(
            not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf") for c in q)))
        def check(query: str) -> None:
            hits = portal.call(lambda: mem.search_messages(query, limit=3))
            assert all(isinstance(h, mnemo.SearchHit) for h in hits)

        check()


async def test_view_messages(cmem: mnemo.Memory) -> None:
    """view_messages shows `radius` messages each side, tool outputs as ok/error, and the
    nearest snapshots before and after."""
    conv = cmem.conversation()
    history = [user(f"plain message {i} about the roadmap") for i in range(30)]
    history[12] = tool_call("c1", "build")
    history[13] = tool_result("c1", "Traceback (most recent call last): build failed")
    history[14] = tool_call("c2", "test")
    history[15] = tool_result("c2", "all 12 tests passed, no errors")
    stored = await conv.save("t", history)
    for _ in range(4):
        await cmem.evict("t", token_budget=2000, eviction_fraction=0.2)
    target = stored[14]
    view = await cmem.view_messages(target.id, radius=2)
    assert view.target == target
    assert [m.seq for m in view.messages] == [12, 13, 14, 15, 16]
    assert [m.content for m in view.messages[1:4:2]] == ["error", "ok"]
    assert all(s.start_seq <= 14 for s in view.snapshots_before)
    assert all(s.start_seq > 14 for s in view.snapshots_after)
    assert len(view.snapshots_before) <= 3
    assert len(view.snapshots_after) <= 3
    assert view.snapshots_before or view.snapshots_after
    text = view.render()
    assert f"> message 14 [{target.id}]" in text


async def test_view_messages_refuses(cmem: mnemo.Memory) -> None:
    """Unknown ids are NotFoundError, bad radii InvalidInputError."""
    with pytest.raises(mnemo.NotFoundError):
        await cmem.view_messages("msg_nope")
    stored = await cmem.conversation().save("t", [user("x")])
    for radius in (-1, 101, True):
        with pytest.raises(mnemo.InvalidInputError):
            await cmem.view_messages(stored[0].id, radius=radius)
    assert (await cmem.view_messages(stored[0].id, radius=0)).messages == stored


def test_match_expression_dedups_and_caps() -> None:
    """Repeated words count once; a 5,000-word query keeps MAX_QUERY_TERMS distinct terms."""
    assert match_expression("nginx Nginx proxy NGINX AND nginx") == '"nginx" OR "proxy" OR "AND"'
    long_query = " ".join(f"w{i}" for i in range(5000))
    expression = match_expression(long_query)
    assert expression.count('"') == 2 * MAX_QUERY_TERMS
    assert expression.count(" OR ") == MAX_QUERY_TERMS - 1


def test_match_expression_keeps_the_longest_words_past_the_cap() -> None:
    """Past the cap the shortest words are left out, operators' names included (they are
    words like any other)."""
    words = " ".join(f"longword{i}" for i in range(MAX_QUERY_TERMS - 1))
    # 36 distinct words: the four shortest ("zz", "b", "OR", "NOT") are left out.
    expression = match_expression(f"{words} zz NOT b OR gammaword")
    assert expression.endswith(f'"longword{MAX_QUERY_TERMS - 2}" OR "gammaword"')
    assert '"b"' not in expression
    assert '"NOT"' not in expression
    assert '"zz"' not in expression
