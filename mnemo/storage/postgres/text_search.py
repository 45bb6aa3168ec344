"""PostgreSQL's full-text search made to split and fold as FTS5 does: the configuration, a
text's search vector and one query word's tsquery."""

from __future__ import annotations

# `english` with a stemmer that drops no stop word and folds accents first, as FTS5's
# `porter unicode61` does.
TEXT_SEARCH_CONFIG = "mnemo_english"
# As FTS5 splits at every non-letter, non-digit, ASCII punctuation and format characters (Cf,
# Unicode 14 ranges) are made spaces before PostgreSQL's parser; a change needs a migration.
_FORMAT_CHARACTERS = (
    (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),
    (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x13438), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)


def _escape(code: int) -> str:
    """A regular expression's escape for a character, as an E'' literal needs it."""
    return f"\\\\u{code:04x}" if code <= 0xFFFF else f"\\\\U{code:08x}"


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
