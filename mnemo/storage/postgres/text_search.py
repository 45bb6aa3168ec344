"""PostgreSQL's full-text search as FTS5 searches: the text search configuration, the search
vector of a text and the tsquery of one query word (the migrations create the configuration
and the generated columns; the stores search with them)."""

from __future__ import annotations

# FTS5's `porter unicode61` stems every word and drops none; PostgreSQL's `english` stems with
# Snowball's English (Porter's successor) but drops stop words, so a search for "it" or "the"
# would find nothing. `mnemo_english` is `english` with a stemmer that keeps every word, and
# (m012) folds accents first, as `unicode61` does.
TEXT_SEARCH_CONFIG = "mnemo_english"
# FTS5's `unicode61` and the lexical index's tokenizer split a text at every character that is
# neither a letter nor a digit; PostgreSQL's parser keeps an email, a URL, a path or a version
# whole and reads Unicode's format characters (Cf) as letters. The stored search vectors (m012
# on) parse the text with its ASCII punctuation and its format characters made spaces, and each
# query word is parsed the same way (`WORD_QUERY`), so its parts are one phrase, as in FTS5.
# The format characters as of Unicode 14 (Python 3.11's `unicodedata`), first to last of each
# range; m012's columns are computed with them, so a change needs a migration of its own.
_FORMAT_CHARACTERS = (
    (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),
    (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x13438), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)


def _escape(code: int) -> str:
    """A regular expression's escape for a character, its backslash doubled as an E'' literal
    needs (an E'' literal reads the same whatever `standard_conforming_strings` says)."""
    return f"\\\\u{code:04x}" if code <= 0xFFFF else f"\\\\U{code:08x}"


# What a text is split at before PostgreSQL's parser reads it (see above).
_SPLIT_AT = "[!-/:-@[-`{-~" + "".join(
    _escape(first) + ("" if last == first else "-" + _escape(last))
    for first, last in _FORMAT_CHARACTERS
) + "]+"


def _spaced(text: str) -> str:
    """SQL of the text `text` (an expression) with each run of `_SPLIT_AT` made a space."""
    return f"regexp_replace({text}, E'{_SPLIT_AT}', ' ', 'g')"


SEARCH_VECTOR = f"to_tsvector('{TEXT_SEARCH_CONFIG}', {_spaced('text')})"
# The tsquery of one query word (a parameter): the phrase of its parts, split as a text is.
WORD_QUERY = f"phraseto_tsquery('{TEXT_SEARCH_CONFIG}', {_spaced('%s')})"
