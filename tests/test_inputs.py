"""The input bounds: `Config.max_text_chars`, the text and JSON checks, and query terms."""

from __future__ import annotations

import itertools
import string
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

import mnemo
from mnemo import State, text
from mnemo.errors import DEFAULT_MAX_TEXT_CHARS, MAX_TEXT_CHARS_LIMIT, check_json, check_text
from mnemo.text import MAX_QUERY_TERMS, query_terms, query_words
from tests.conftest import REPO
from tests.fakes import open_test_memory


def test_config_default_bound() -> None:
    """Config.max_text_chars defaults to the documented bound and survives a JSON round trip."""
    config = mnemo.Config()
    assert config.max_text_chars == DEFAULT_MAX_TEXT_CHARS
    assert mnemo.Config.from_json(mnemo.Config(max_text_chars=500).to_json()).max_text_chars == 500


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "100"])
def test_config_rejects_bad_bound(bad: object) -> None:
    """A max_text_chars that is not an integer >= 1 is an InvalidInputError."""
    with pytest.raises(mnemo.InvalidInputError, match="max_text_chars"):
        mnemo.Config(max_text_chars=bad)  # type: ignore[arg-type]


def test_config_bound_has_a_ceiling() -> None:
    """max_text_chars is at most MAX_TEXT_CHARS_LIMIT, which PostgreSQL's full-text search
    can index (the test below); one more is refused, naming it."""
    assert mnemo.Config(max_text_chars=MAX_TEXT_CHARS_LIMIT).max_text_chars == 120_000
    with pytest.raises(mnemo.InvalidInputError, match=r"max_text_chars .* from 1 to 120,000"):
        mnemo.Config(max_text_chars=MAX_TEXT_CHARS_LIMIT + 1)


def test_a_stored_bound_past_the_ceiling_is_read_at_the_ceiling() -> None:
    """A repo config stored before the ceiling still opens, lowered to it."""
    stored = mnemo.Config().to_json().replace('"max_text_chars": 32000',
                                               '"max_text_chars": 1000000')
    assert mnemo.Config.from_json(stored).max_text_chars == MAX_TEXT_CHARS_LIMIT


def densest(chars: int, seed: int) -> str:
    """`chars` characters of distinct two-character words of CJK Extension B: what makes
    PostgreSQL's tsvector longest a character (4 UTF-8 bytes a character, and 4 bytes of
    count and position a word: 4 bytes a character of text, where
    four-character words of the basic CJK block make 3.2 and ASCII four-letter words 1.6)."""
    letters = [chr(0x20000 + i) for i in range(400)]
    every = ("".join(w) for w in itertools.product(letters, repeat=2))
    words = itertools.islice(every, seed * 60_000, seed * 60_000 + chars // 3 + 1)
    text = " ".join(words)[:chars]
    return text[:-1] + letters[0] if text.endswith(" ") else text


@pytest.mark.slow
async def test_texts_at_the_ceiling_are_stored_on_both_backends(store: str) -> None:
    """A step whose observation and action are each MAX_TEXT_CHARS_LIMIT characters of the
    densest words, and a message as long, are stored, committed and found by a word on
    both backends. Regression: PostgreSQL refused a node of about 262,000 such characters
    (`string is too long for tsvector`) as StorageError, where SQLite stored it."""
    config = mnemo.Config(max_text_chars=MAX_TEXT_CHARS_LIMIT)
    observation, action = densest(MAX_TEXT_CHARS_LIMIT, 0), densest(MAX_TEXT_CHARS_LIMIT, 1)
    assert len(observation) == len(action) == MAX_TEXT_CHARS_LIMIT
    async with mnemo.Memory(store, config=config, embedder=mnemo.HashEmbedder(8)) as mem:
        await mem.open_repo(REPO)
        session = await mem.start_session("store long texts", repo=REPO)
        await mem.append(session, observation, action)
        receipt = await mem.close_and_commit(session)
        assert receipt.node_ids
        await mem.conversation().save("t", [{"role": "user", "content": observation}])
        hits = await mem.search_messages(observation.split()[-1])
        assert [h.seq for h in hits] == [0]


def test_check_text_bound() -> None:
    """A text of exactly the bound passes; one character more is refused, naming the bound."""
    assert check_text("x" * 10, "goal", limit=10) == "x" * 10
    with pytest.raises(mnemo.InvalidInputError, match=r"goal is 11 characters.*10 allowed"):
        check_text("x" * 11, "goal", limit=10)


def test_check_text_type_and_blank() -> None:
    """Non-strings are refused; blank text only when it is not allowed."""
    with pytest.raises(mnemo.InvalidInputError, match="must be a string"):
        check_text(b"x", "observation", limit=10)
    with pytest.raises(mnemo.InvalidInputError, match="blank"):
        check_text("  ", "goal", limit=10)
    assert check_text("", "action", limit=10, blank_ok=True) == ""


def test_check_json_bound() -> None:
    """Metadata is bounded by the length of its JSON; unserialisable metadata is refused."""
    assert check_json({"a": 1}, "metadata", limit=8) == '{"a": 1}'
    with pytest.raises(mnemo.InvalidInputError, match="as JSON"):
        check_json({"a": "x" * 10}, "metadata", limit=8)
    with pytest.raises(mnemo.InvalidInputError, match="JSON-serialisable"):
        check_json({"a": object()}, "metadata", limit=100)


def test_query_terms_dedup_case_insensitive() -> None:
    """Repeated words count once, whatever their case; the first spelling is kept, in order."""
    assert query_terms(["Nginx", "port", "NGINX", "nginx", "Port", "proxy"]) == [
        "Nginx", "port", "proxy"
    ]


def test_query_terms_cap_keeps_longest_in_order() -> None:
    """Past the cap the longest words stay (earlier first on ties), in query order."""
    words = ["a", "bb", "ccc", "dd", "eeee", "f"]
    assert query_terms(words, cap=3) == ["bb", "ccc", "eeee"]


@pytest.mark.parametrize(
    ("query", "words"),
    [
        # Combining marks are in the word (`\w` stops at them): a virama and vowel signs,
        # Hebrew and Arabic vowel points, a Thai tone mark.
        ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),
        ("שָלוֹם מַה", ["שָלוֹם", "מַה"]),
        ("مَرْحَبًا صَدِيقِي", ["مَرْحَبًا", "صَدِيقِي"]),
        ("ภาษาไทยง่ายมาก", ["ภาษาไทยง่ายมาก"]),
        # Composed: "e" and a combining acute accent are "é".
        ("e\u0301clair", ["\u00e9clair"]),
        # A format character between word characters joins them; at a word's edge it is none.
        ("می\u200cخواهم", ["می\u200cخواهم"]),  # noqa: RUF001
        ("zero\u200bwidth soft\u00adhyphen", ["zero\u200bwidth", "soft\u00adhyphen"]),
        ("\ufeffstart end\u200b x", ["start", "end", "x"]),
        # A mark or a format character alone is no word.
        ("a \u0301 \u200d b", ["a", "b"]),
        ('nginx "proxy" AND NOT port)', ["nginx", "proxy", "AND", "NOT", "port"]),
        ("café2 snake_case_name 1.2.3", ["café2", "snake_case_name", "1", "2", "3"]),
    ],
)
def test_query_words(query: str, words: list[str]) -> None:
    """A query's words keep their combining marks and the format characters inside them, are
    composed (NFC), and hold no punctuation."""
    assert query_words(query) == words


def test_query_terms_of_many_distinct_words() -> None:
    """5,000 distinct words become MAX_QUERY_TERMS terms."""
    words = [f"w{i}" for i in range(5000)]
    kept = query_terms(words)
    assert len(kept) == MAX_QUERY_TERMS
    assert kept == sorted(kept, key=words.index)


async def test_recall_of_5000_distinct_words_searches_capped_terms(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall query of 5,000 distinct words reaches the lexical index (or the store's
    full-text search: FTS5, a tsquery) as at most MAX_QUERY_TERMS terms."""
    generated: list[list[str]] = []

    def spy(words: Iterable[str], *, cap: int = MAX_QUERY_TERMS) -> list[str]:
        generated.append(query_terms(words, cap=cap))
        return generated[-1]

    # Every search splits its query with `text.query_words`, which caps by `query_terms`.
    monkeypatch.setattr(text, "query_terms", spy)
    # Three-letter words: 5,000 of them fit in the default bound (20,000 characters).
    query = " ".join("".join(w) for w in itertools.islice(
        itertools.product(string.ascii_lowercase, repeat=3), 5000))
    await mem.recall(REPO, query)
    assert generated
    assert all(len(terms) == MAX_QUERY_TERMS for terms in generated)


# ---- every public text input, one character past the bound ----------------------------------

LIMIT = 200
LONG = "word " * 40 + "x"  # LIMIT + 1 characters
FITS = "a statement that fits well within the bound of this test."


@pytest.fixture
async def small() -> AsyncIterator[mnemo.Memory]:
    """A Memory (on the fakes) whose default Config allows texts of LIMIT characters."""
    async with open_test_memory(config=mnemo.Config(max_text_chars=LIMIT)) as m:
        await m.open_repo(REPO)
        yield m


def test_long_is_one_past_the_limit() -> None:
    """The over-long text of these tests is exactly one character past the bound."""
    assert len(LONG) == LIMIT + 1


async def test_start_session_long_goal(small: mnemo.Memory) -> None:
    """start_session with a goal past the bound raises and creates no session."""
    with pytest.raises(mnemo.InvalidInputError, match="goal"):
        await small.start_session(LONG, repo=REPO)
    assert await small.list_sessions() == []


@pytest.mark.parametrize(
    ("observation", "action", "metadata"),
    [(LONG, "go", None), ("look", LONG, None), ("look", "go", {"note": LONG})],
)
async def test_append_long_step(
    small: mnemo.Memory, observation: str, action: str, metadata: dict[str, object] | None
) -> None:
    """append with an observation, action or metadata past the bound raises; no step is added."""
    sid = await small.start_session("explore", repo=REPO)
    with pytest.raises(mnemo.InvalidInputError):
        await small.append(sid, observation, action, metadata=metadata)
    with pytest.raises(mnemo.InvalidInputError):
        await small.append_async(sid, observation if metadata is None else LONG, action)
    context = await small.session_context(sid)
    assert context is not None
    assert context.recent_steps == []
    assert await small.session_state(sid) is State.COLLECTING


async def test_start_episode_long_goal(small: mnemo.Memory) -> None:
    """start_episode(_async) with a goal past the bound raises; the session stays idle."""
    sid = await small.start_session("explore", repo=REPO)
    await small.close_and_commit(sid)
    assert await small.session_state(sid) is State.IDLE
    with pytest.raises(mnemo.InvalidInputError):
        await small.start_episode(sid, LONG)
    with pytest.raises(mnemo.InvalidInputError):
        await small.start_episode_async(sid, LONG)
    assert await small.session_state(sid) is State.IDLE


async def test_session_config_governs_its_steps(small: mnemo.Memory) -> None:
    """A session's own config sets its bound: a larger one accepts what the default refuses."""
    sid = await small.start_session(
        "explore", repo=REPO, config=mnemo.Config(max_text_chars=10 * LIMIT)
    )
    info = await small.append(sid, LONG, "go")
    assert info.index == 0


async def test_recall_long_query(small: mnemo.Memory) -> None:
    """recall and recall_in_context with a query past the repo's bound raise."""
    sid = await small.start_session("explore", repo=REPO)
    with pytest.raises(mnemo.InvalidInputError, match="query"):
        await small.recall(REPO, LONG)
    with pytest.raises(mnemo.InvalidInputError, match="query"):
        await small.recall_in_context(REPO, sid, LONG)


async def test_recall_in_context_keeps_within_the_bound(small: mnemo.Memory) -> None:
    """recall_in_context cuts the added context so that a query within the bound is served."""
    sid = await small.start_session("g" * (LIMIT - 10), repo=REPO)
    await small.append(sid, "o" * (LIMIT - 10), "a" * (LIMIT - 10))
    result = await small.recall_in_context(REPO, sid, "q" * (LIMIT - 10))
    assert len(result.query) == LIMIT


@pytest.mark.parametrize(
    "trajectory",
    [
        mnemo.Trajectory(LONG, [mnemo.Step("look", "go")]),
        mnemo.Trajectory("explore", [mnemo.Step(LONG, "go")]),
        mnemo.Trajectory("explore", [mnemo.Step("look", LONG)]),
        mnemo.Trajectory("explore", [mnemo.Step("look", "go", {"note": LONG})]),
        mnemo.Trajectory("explore", [mnemo.Step("look", "go")], {"note": LONG}),
    ],
)
async def test_ingest_long_text(small: mnemo.Memory, trajectory: mnemo.Trajectory) -> None:
    """ingest with any text (or metadata) past the bound raises and stores nothing."""
    with pytest.raises(mnemo.InvalidInputError, match="trajectory"):
        await small.ingest(REPO, trajectory, source_id="src")
    assert await small.get_nodes_by_type(REPO, list(mnemo.NodeType)) == []
    fine = await small.ingest(REPO, mnemo.Trajectory("explore", []), source_id="src")
    assert fine.created


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": LONG},
        {"role": "user", "content": [{"type": "text", "text": LONG}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "function": {"name": "f", "arguments": LONG}}]},
        {"role": "user", "content": "hi", "extra": LONG},
    ],
)
async def test_save_long_message(small: mnemo.Memory, message: dict[str, object]) -> None:
    """save with a message past the bound raises and stores none of the history."""
    threads = small.conversation()
    with pytest.raises(mnemo.InvalidInputError, match=r"messages\[1\]"):
        await threads.save("t", [{"role": "user", "content": FITS}, message])
    assert await threads.raw("t") == []


async def test_conversation_queries_and_goals(small: mnemo.Memory) -> None:
    """search_messages, load, add_goal and save_compaction refuse texts past the bound."""
    threads = small.conversation()
    await threads.save("t", [{"role": "user", "content": FITS}])
    with pytest.raises(mnemo.InvalidInputError, match="query"):
        await small.search_messages(LONG)
    with pytest.raises(mnemo.InvalidInputError, match="query"):
        await threads.load("t", LONG)
    with pytest.raises(mnemo.InvalidInputError, match="description"):
        await small.add_goal("t", LONG)
    with pytest.raises(mnemo.InvalidInputError, match="summary_text"):
        await threads.save_compaction("t", 0, 0, LONG)
    assert await threads.compactions("t") == []
    assert (await small.viewport("t", token_budget=1000)).pinned == []


async def test_memory_files_long_texts(tmp_path: Path) -> None:
    """MemoryFiles refuses a statement or query past its bound; update reports it, writes none."""
    files = mnemo.MemoryFiles(tmp_path, min_iterations=0, max_text_chars=LIMIT)
    with pytest.raises(mnemo.InvalidInputError, match="what"):
        await files.persist(LONG, llm=None)
    with pytest.raises(mnemo.InvalidInputError, match="query"):
        await files.recall(LONG)
    update = await files.update(
        [{"role": "user", "content": "We decided to use Postgres."},
         {"role": "user", "content": LONG}],
        llm=None, iterations=10,
    )
    assert update.error is not None
    assert "InvalidInputError" in update.error
    assert update.written == []
    assert files.list() == []


def test_memory_files_bound_validated(tmp_path: Path) -> None:
    """MemoryFiles' max_text_chars must be a positive int."""
    with pytest.raises(mnemo.InvalidInputError, match="max_text_chars"):
        mnemo.MemoryFiles(tmp_path, max_text_chars=0)
