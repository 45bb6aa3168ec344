"""Recall's lexical channel: a tantivy index of the graph's node texts, kept from the store's
log (`index`, read through `source`), with the changes not yet committed to it searched beside
it (`fresh`); a step's document holds the steps around it (`windows`)."""
