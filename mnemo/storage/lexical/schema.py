"""The lexical index's tantivy schema, and the analyzer used for both documents and queries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The analyzer's name; every opening of the index must register it.
TOKENIZER = "mnemo_en"
# The longest word kept, in UTF-8 bytes: a SHA-512 in hex, 85 CJK characters (`en_stem`'s 40
# lost hashes and CJK runs); longer tokens are blobs left to the store's search.
LONGEST_WORD = 255


def schema() -> Any:
    """The index's fields (a new layout, or a new analyzer, needs a new `FORMAT` folder)."""
    import tantivy

    builder = tantivy.SchemaBuilder()
    # `key` is "<repo>/<rowid>"; `id` stored only (indexed, it took 1.4 of 3.9 MB at 50k
    # nodes); `text` without positions; `holds`, the keys of other nodes whose text it holds.
    builder.add_text_field("key", tokenizer_name="raw", stored=True, index_option="basic")
    builder.add_bytes_field("id", stored=True, indexed=False)
    builder.add_text_field("repo", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("type", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("text", tokenizer_name=TOKENIZER, index_option="freq")
    builder.add_text_field("holds", tokenizer_name="raw", index_option="basic")
    # `stems` (`fresh.stem_text`), stored for scoring; `length`, their count.
    builder.add_bytes_field("stems", stored=True, indexed=False)
    builder.add_integer_field("length", fast=True)
    builder.add_integer_field("seq", stored=True)
    return builder.build()


def analyzer() -> Any:
    """tantivy's `en_stem` with accents folded as the store's search folds them and words up
    to `LONGEST_WORD` kept: split, drop long tokens, fold to ASCII (before lowercasing, which
    would leave "İ" a dotted "i"), lowercase, stem. Takes texts composed (NFC)."""
    import tantivy as tv

    return (
        tv.TextAnalyzerBuilder(tv.Tokenizer.simple())
        .filter(tv.Filter.remove_long(LONGEST_WORD + 1))  # keeps what is shorter than this
        .filter(tv.Filter.ascii_fold())
        .filter(tv.Filter.lowercase())
        .filter(tv.Filter.stemmer("english"))
        .build()
    )


def open_index(folder: Path, fields: Any) -> Any:
    """The index in `folder` (made if none) with the analyzer registered; `ValueError` for a
    folder tantivy cannot read."""
    import tantivy as tv

    index = tv.Index(fields, path=str(folder))
    index.register_tokenizer(TOKENIZER, analyzer())
    return index
