"""The lexical index's tantivy schema, and the analyzer that turns a query's words into
the stems its `text` field holds (the `en_stem` tokenizer's, so both sides agree)."""

from __future__ import annotations

from typing import Any


def schema() -> Any:
    """The index's fields (a new layout needs a new `FORMAT` folder)."""
    import tantivy

    builder = tantivy.SchemaBuilder()
    # `key` is "<repo>/<rowid>" (a rowid can be reused after a delete, in another repo too);
    # `id` is what recall gets back; `text` keeps frequencies, no positions (no phrase queries);
    # `holds`, the keys of the other nodes whose text is in `text` (a step's window).
    builder.add_text_field("key", tokenizer_name="raw", stored=True, index_option="basic")
    builder.add_text_field("id", tokenizer_name="raw", stored=True, index_option="basic")
    builder.add_text_field("repo", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("type", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("text", tokenizer_name="en_stem", index_option="freq")
    builder.add_text_field("holds", tokenizer_name="raw", index_option="basic")
    builder.add_integer_field("seq", stored=True)
    return builder.build()


def analyzer() -> Any:
    """What `en_stem` does to a text: split, drop tokens over 40 bytes, lowercase, stem."""
    import tantivy as tv

    return (
        tv.TextAnalyzerBuilder(tv.Tokenizer.simple())
        .filter(tv.Filter.remove_long(40))
        .filter(tv.Filter.lowercase())
        .filter(tv.Filter.stemmer("english"))
        .build()
    )
