"""The lexical index's tantivy schema, and the analyzer that turns a text into the stems its
`text` field holds: one definition, registered on the index for its documents and applied by
the index itself to a query's words, so both sides agree."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

# The `text` field's analyzer, by the name the folder's schema records. tantivy keeps the name
# only: every opening of the index registers it (a writer made without it fails).
TOKENIZER = "mnemo_en"
# The longest word the index keeps, in UTF-8 bytes. `en_stem`'s 40 lost a git commit's hash
# (40 hex digits), a SHA-256, a long identifier or German compound, and any run of 14 CJK
# characters, all of which the store's own search finds. 255 keeps a SHA-512 in hex (128), 85
# CJK characters, 127 Cyrillic letters. Longer, a token is mostly a blob (a key, base64, a hex
# dump) that no query types, each a term of its own in the index: PostgreSQL keeps words up to
# 2,047 bytes and FTS5 any word, so those are found by the store's search only.
LONGEST_WORD = 255


def schema() -> Any:
    """The index's fields (a new layout, or a new analyzer, needs a new `FORMAT` folder)."""
    import tantivy

    builder = tantivy.SchemaBuilder()
    # `key` is "<repo>/<rowid>" (a rowid can be reused after a delete, in another repo too);
    # `id` is what recall gets back (UTF-8, stored only: no search asks for it, and as a term
    # it took 1.4 of a 50k-node index's 3.9 MB); `text` keeps frequencies, no positions (no
    # phrase queries); `holds`, the keys of the other nodes whose text is in `text` (a step's
    # window).
    builder.add_text_field("key", tokenizer_name="raw", stored=True, index_option="basic")
    builder.add_bytes_field("id", stored=True, indexed=False)
    builder.add_text_field("repo", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("type", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("text", tokenizer_name=TOKENIZER, index_option="freq")
    builder.add_text_field("holds", tokenizer_name="raw", index_option="basic")
    # `stems`, the document's stems as `fresh.stem_text` writes them (stored only: a hit is
    # scored from them); `length`, how many (summed for BM25's average length).
    builder.add_bytes_field("stems", stored=True, indexed=False)
    builder.add_integer_field("length", fast=True)
    builder.add_integer_field("seq", stored=True)
    return builder.build()


def analyzer() -> Any:
    """tantivy's `en_stem` with accents folded and longer words kept: split, drop tokens
    longer than `LONGEST_WORD`, fold to ASCII, lowercase, stem. It is given texts composed
    (`composed`): it splits at a combining mark, so a decomposed "éclair" was "e" and "clair".

    Folded as the store's own search folds them ("café", "cafe" and "CAFÉ" are one word):
    FTS5's `unicode61` drops diacritics, PostgreSQL's `mnemo_english` runs `unaccent`.
    Folded before lowercasing: lowercased first, "İ" became "i" and a combining dot, which
    no folding removes, and small capitals ("ᴀ") folded to capitals.
    """
    import tantivy as tv

    return (
        tv.TextAnalyzerBuilder(tv.Tokenizer.simple())
        .filter(tv.Filter.remove_long(LONGEST_WORD + 1))  # keeps what is shorter than this
        .filter(tv.Filter.ascii_fold())
        .filter(tv.Filter.lowercase())
        .filter(tv.Filter.stemmer("english"))
        .build()
    )


def composed(text: str) -> str:
    """`text` as the index takes it: composed (NFC), as query words are
    (`mnemo.text.query_words`), so a decomposed accent and a precomposed one are one word.
    The index and its scoring of uncommitted documents analyze this text alike."""
    return unicodedata.normalize("NFC", text)


def open_index(folder: Path, fields: Any) -> Any:
    """The index in `folder` (made there if there is none) with `fields`' analyzer registered.

    Raises:
        ValueError: tantivy's, for a folder it cannot read.
    """
    import tantivy as tv

    index = tv.Index(fields, path=str(folder))
    index.register_tokenizer(TOKENIZER, analyzer())
    return index
