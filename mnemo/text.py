"""Words: mnemo's one home for splitting, stemming and weighing text (docs/DECISIONS.md, "One
text module"), deterministic and cheap: `words`/`tokens` for mnemo's heuristics ("don't",
"nginx.conf" one word), `text_words`/`query_words` cut at joiners as every search splits, `stem`
(Snowball English), stopwords, sentences, and how informative a word is."""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Iterable
from itertools import islice

import Stemmer

# What joins two runs of word characters into one word when it stands alone between them.
JOINERS = "'.-"
# `words` of an all-ASCII text in one expression (the common case on the ingest path).
_ASCII_WORD = re.compile(r"\w+(?:['.\-]\w+)*")
_ASCII_PART = re.compile(r"\w+")
_JOINER = re.compile(r"['.\-]")
# The clitic a word may end in ("Melanie's", "they're", "it'll", "we've", "I'd", "I'm").
_CLITIC = re.compile(r"'(?:s|re|ll|ve|d|m)$", re.IGNORECASE)
# Distinct terms a lexical query keeps: a query's cost grows with them (BENCHMARKS.md).
MAX_QUERY_TERMS = 32
# A run of what is neither a word character nor a space: where a word may hold a joiner, a
# combining mark or a format character (`_within_words`).
_BETWEEN_WORDS = re.compile(r"[^\w\s]+")
_WORD_CHARACTER = re.compile(r"\w")
_NON_SPACE = re.compile(r"\S+")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'"})
# A sentence ends at . ! or ? followed by space and what starts a sentence ("e.g. the" stays).
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_BULLET = re.compile(r"^\s*(?:[-*\u2022>]+|\d+[.)])\s+")

STOPWORDS: frozenset[str] = frozenset(
    """
    a about above after again against all almost along already also although always am among an
    and another any anybody anyone anything anyway anyways are aren't around as at be because
    been before being below between both but by can can't cannot could couldn't did didn't do
    does doesn't doing don't done down during each either else enough even ever every
    everybody everyone everything few for from further get gets getting give given go goes
    going gone got gotten had hadn't has hasn't have haven't having he he'd he'll he's her here
    here's hers herself him himself his how how's however i i'd i'll i'm i've if in into is
    isn't it it'd it'll it's its itself just kind know let let's lets like likely made make
    makes many may maybe me might mine more most much must mustn't my myself need needs neither
    never no nobody none nor not nothing now of off often oh ok okay on once one ones only onto
    or other others otherwise ought our ours ourselves out over own per perhaps please put quite
    rather really right said same say says see seem seems shall shan't she she'd she'll she's
    should shouldn't since so some somebody someone something sometimes somewhat soon still such
    sure take tell than that that's the their theirs them themselves then there there's these
    they they'd they'll they're they've thing things think this those though through thus to
    too toward towards try trying under unless until up upon us use used using very via want
    wants was wasn't way we we'd we'll we're we've well were weren't what what's whatever when
    whenever where where's whereas wherever whether which while who who's whoever whom whose why
    will with within without won't would wouldn't yeah yes yet you you'd you'll you're you've
    your yours yourself yourselves
    hi hello hey thanks thank thx cheers bye goodbye great awesome cool nice perfect alright
    sounds hmm hm uh um ah wow lol
    """.split())

# A contraction written with U+02BC (a letter to `\w`) is a stopword too.
STOPWORDS |= {word.replace("'", "\u02bc") for word in STOPWORDS if "'" in word}

# Words that open a sentence without carrying content ("Okay, so the build fails").
FILLER_OPENERS: frozenset[str] = frozenset(
    """
    okay ok so well alright right sure yes yeah yep hmm hm oh ah um uh great cool nice perfect
    awesome also actually anyway anyways basically now then thanks
    """.split())


def normalise(text: str) -> str:
    """The text with typographic apostrophes made ASCII (so "don't" tokenizes one way)."""
    return text.translate(_APOSTROPHES)


def words(text: str) -> list[str]:
    """The words of `text` in order, case preserved, read NFC-composed with typographic
    apostrophes made ASCII: runs of `\\w` with combining marks among them and format
    characters between them (`\\w` alone cuts "हिन्दी" apart), two runs joined by one of
    `JOINERS` being one word."""
    text = normalise(text)
    if text.isascii():
        return _ASCII_WORD.findall(text)
    return [w for w in _spaced(text).split() if _WORD_CHARACTER.search(w)]


def tokens(text: str) -> list[str]:
    """The lower-cased words of `text` in order (`words`)."""
    text = normalise(text)
    if text.isascii():  # lower-casing keeps ASCII text's length and its words' bounds
        return _ASCII_WORD.findall(text.lower())
    return [word.lower() for word in words(text)]


def first_tokens(text: str, n: int) -> list[str]:
    """The first `n` of `tokens(text)`, reading little more of `text` than they take."""
    if n <= 0:
        return []
    text = normalise(text)
    if text.isascii():
        return [m.group().lower() for m in islice(_ASCII_WORD.finditer(text), n)]
    size = 16 * (n + 1)
    while True:
        # With a word past the n-th in the prefix, the n-th ended before the cut.
        found = tokens(text[:size])
        if len(found) > n or size >= len(text):
            return found[:n]
        size *= 2


def without_clitic(word: str) -> str:
    """A word without the clitic it ends in ("Melanie's" -> "Melanie"), or as it is."""
    return _CLITIC.sub("", word)


def parts(word: str) -> list[str]:
    """The words a search reads in one word of `words`: it cut at its joiners ("nginx.conf":
    "nginx", "conf")."""
    return [part for part in _JOINER.split(word) if _WORD_CHARACTER.search(part)]


def _spaced(text: str) -> str:
    """`text` composed, every character no part of a word made a space (same length)."""
    return _BETWEEN_WORDS.sub(_within_words, unicodedata.normalize("NFC", text))


def _within_words(between: re.Match[str]) -> str:
    """A run of non-word, non-space characters: what belongs to the words around it kept,
    the rest made spaces, one for one."""
    run = between.group()
    text, start, end = between.string, between.start(), between.end()
    # The run is as long as it can be: a neighbour that is no space is a word character.
    inside = (0 < start and end < len(text)
              and not text[start - 1].isspace() and not text[end].isspace())
    if run.isascii():  # ASCII punctuation, the common case: no mark nor format character
        return run if inside and len(run) == 1 and run in JOINERS else " " * len(run)
    # A format character joins only the words on both its sides; a mark, the one before it;
    # a joiner, when it is the run's only character besides those.
    joins = inside and sum(1 for c in run if not _in_word(c)) == 1
    return "".join(
        character if (_in_word(character)
                      and (inside or unicodedata.category(character) != "Cf"))
        or (joins and character in JOINERS) else " "
        for character in run)


def _in_word(character: str) -> bool:
    """Whether `character`, which `\\w` does not match, belongs to the word around it: a
    combining mark (Unicode's M*) or an invisible format character (Cf)."""
    category = unicodedata.category(character)
    return category[0] == "M" or category == "Cf"


# A Snowball stemmer keeps state while it stems: one per thread (its own cache off).
_STEMMERS = threading.local()
# word -> stem, cleared at 65,536 words: a dict of strings, which the collector never walks.
_STEMS: dict[str, str] = {}


def stem(word: str) -> str:
    """The Snowball English stem of a lower-cased word ("configuring" -> "configur"); a word
    of other characters than letters and apostrophes is its own stem."""
    stemmed = _STEMS.get(word)
    if stemmed is None:
        stemmed = _stem(word)
        if len(_STEMS) >= 65_536:
            _STEMS.clear()
        _STEMS[word] = stemmed
    return stemmed


def _stem(word: str) -> str:
    if not word.replace("'", "").isalpha():
        return word
    stemmer = getattr(_STEMMERS, "english", None)
    if stemmer is None:
        stemmer = _STEMMERS.english = Stemmer.Stemmer("english", 0)
    stemmed: str = stemmer.stemWord(word)
    return stemmed


def is_stopword(word: str) -> bool:
    """Whether `word` (any case) is a function word or conversational filler."""
    return word.lower() in STOPWORDS


def without_stopwords(text: str) -> str:
    """`text` composed (NFC), each word of `words` that is a stopword made a space."""
    text = unicodedata.normalize("NFC", normalise(text))
    spaced, word_in = (text, _ASCII_WORD) if text.isascii() else (_spaced(text), _NON_SPACE)
    kept = list(text)
    for word in word_in.finditer(spaced):
        if is_stopword(word.group()):
            kept[word.start():word.end()] = " " * (word.end() - word.start())
    return "".join(kept)


def is_acronym(word: str) -> bool:
    """An all-capitals word of two or more characters, digits allowed ("AWS", "S3", "HTTP2")."""
    return len(word) >= 2 and word.isupper() and any(c.isalpha() for c in word)


def is_identifier(word: str) -> bool:
    """A word written as code, a path or a name, never re-cased: with one of `_./-:`, a digit
    or a capital after its first character ("test_upload", "S3", "GitHub")."""
    return any(c in "_./-:" or c.isdigit() for c in word) or any(c.isupper() for c in word[1:])


def label_case(word: str) -> str:
    """`word` lower-cased for a label or a key phrase, unless it is an identifier."""
    return word if is_identifier(word) else word.lower()


def is_informative(word: str) -> bool:
    """A content word: not a stopword, and 4+ characters long, or with a digit, or an acronym."""
    return word.lower() not in STOPWORDS and (
        len(word) >= 4 or any(c.isdigit() for c in word) or is_acronym(word))


def content_stems(text: str) -> set[str]:
    """The stems of the informative words of `text`."""
    return {stem(w.lower()) for w in words(text) if is_informative(w)}


def sentences(text: str) -> list[str]:
    """The sentences of `text`, split at line breaks and sentence-ending punctuation, without
    bullets, numbers or blank pieces."""
    lines = (_BULLET.sub("", line) for line in normalise(text).splitlines())
    return [kept for line in lines for piece in _SENTENCE_END.split(line.strip())
            if (kept := piece.strip())]


def first_sentence(text: str, *, max_words: int = 40) -> str:
    """The first sentence of `text`, cut to `max_words` words ("" when there is none)."""
    found = sentences(text)
    return clip_words(found[0], max_words) if found else ""


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def clip_words(text: str, max_words: int) -> str:
    """`text` with whitespace collapsed, cut after `max_words` words (marked with "...")."""
    parts = text.split()
    if len(parts) <= max_words:
        return " ".join(parts)
    return " ".join(parts[:max_words]).rstrip(",;:") + "..."


def _word_score(word: str, *, sentence_initial: bool) -> float:
    """How informative one word is: longer words, digits and proper names score higher."""
    score = 1.0 + 0.1 * min(len(word), 12)
    if any(c.isdigit() for c in word):
        score += 0.8
    if is_acronym(word):
        score += 0.8
    elif word[:1].isupper() and not sentence_initial:
        score += 0.6
    return score


def key_phrase(text: str, *, max_words: int = 4) -> str:
    """A key phrase of `text`: its most informative words (the first sentence's first), each
    stem once, in order, lower-case but for identifiers."""
    picked: dict[str, tuple[float, int, str]] = {}
    fallback: dict[str, tuple[float, int, str]] = {}
    position = 0
    for s_index, sentence in enumerate(sentences(text) or [text]):
        for w_index, word in enumerate(words(sentence)):
            position += 1
            key = stem(word.lower())
            if is_informative(word):
                if key not in picked:
                    score = _word_score(word, sentence_initial=w_index == 0)
                    score += 0.5 if s_index == 0 else 0.0
                    picked[key] = (score, position, label_case(word))
            elif not is_stopword(word) and len(word) >= 3 and key not in fallback:
                fallback[key] = (0.5, position, label_case(word))
    if len(picked) < 2:
        for key, value in fallback.items():
            picked.setdefault(key, value)
    best = sorted(picked.values(), key=lambda item: (-item[0], item[1]))[:max_words]
    return " ".join(word for _, _, word in sorted(best, key=lambda item: item[1]))


def concepts(text: str, *, limit: int = 4) -> list[str]:
    """Up to `limit` concept labels of `text`, most informative first, lower-case but for
    identifiers, each stem once (a run of capitalised words, "Visual Studio Code", is one)."""
    ws = [without_clitic(word) for word in words(text)]
    scored: list[tuple[float, int, str]] = []
    seen: set[str] = set()
    i = 0
    while i < len(ws):
        word = ws[i]
        if i > 0 and word[:1].isupper() and not is_stopword(word):
            j = i
            while j < len(ws) and j - i < 3 and ws[j][:1].isupper() and not is_stopword(ws[j]):
                j += 1
            if j - i >= 2:
                label = " ".join(map(label_case, ws[i:j]))
                if label.lower() not in seen:
                    seen.add(label.lower())
                    seen.update(stem(w.lower()) for w in ws[i:j])
                    scored.append((2.5 + 0.3 * (j - i), i, label))
                i = j
                continue
        key = stem(word.lower())
        if key not in seen and (is_informative(word) or is_name(word, sentence_initial=i == 0)):
            seen.add(key)
            scored.append((_word_score(word, sentence_initial=i == 0), i, label_case(word)))
        i += 1
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [label for _, _, label in scored[:limit]]


def is_name(word: str, *, sentence_initial: bool) -> bool:
    """A capitalised non-stopword that is not the first word of its sentence ("Bob", "Rust")."""
    return not sentence_initial and word[:1].isupper() and not is_stopword(word)


def query_terms(words: Iterable[str], *, cap: int = MAX_QUERY_TERMS) -> list[str]:
    """The distinct words of a query (case-insensitively, first spelling kept), in order, at
    most `cap`: past it the longest are kept (ties: the earlier)."""
    first: dict[str, tuple[int, str]] = {}
    for position, word in enumerate(words):
        first.setdefault(word.casefold(), (position, word))
    distinct = list(first.values())
    if len(distinct) > cap:
        distinct = sorted(distinct, key=lambda item: (-len(item[1]), item[0]))[:cap]
        distinct.sort()
    return [word for _, word in distinct]


def query_words(query: str) -> list[str]:
    """The words a query searches for, distinct and capped (`query_terms`), in order: the
    `parts` of its `words`, read NFC-composed. Every search splits its query here."""
    return query_terms(text_words(query))


def text_words(text: str) -> list[str]:
    """Every word of `text` as a search splits it, repeats and all, in order."""
    if text.isascii():
        return _ASCII_PART.findall(text)
    return [part for word in words(text) for part in parts(word)]

