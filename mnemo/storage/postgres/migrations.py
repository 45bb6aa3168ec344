"""mnemo's PostgreSQL migrations in order: a baseline (`m020_scopes`, every table as 0.1.0 has
it: the text search configuration, `tables.py`'s tables, the lexical log's functions and
triggers), then later ones. An applied migration is never edited: a change is the next one at
the end, here and in `sqlite/schema.py` alike."""

from __future__ import annotations

from dataclasses import dataclass

from mnemo.storage.lexical.index import LOG_KEEP
from mnemo.storage.postgres.text_search import SEARCH_VECTOR, TEXT_SEARCH_CONFIG
from mnemo.storage.tables import ddl, statements


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: its name (recorded once applied) and its statements, in order."""

    name: str
    statements: tuple[str, ...]


# Words found as FTS5 finds them: a Snowball stemmer that keeps stop words, accents folded
# (`unaccent`, in its own schema, ahead of the stemmer, or of `simple` for words with digits).
_TEXT_SEARCH = (
    "CREATE TEXT SEARCH DICTIONARY mnemo_english_stem (TEMPLATE = snowball, LANGUAGE = english)",
    f"CREATE TEXT SEARCH CONFIGURATION {TEXT_SEARCH_CONFIG} (COPY = english)",
    f"ALTER TEXT SEARCH CONFIGURATION {TEXT_SEARCH_CONFIG}"
    " ALTER MAPPING FOR asciiword, asciihword, hword_asciipart WITH mnemo_english_stem",
    f"""DO $$ DECLARE place name := (SELECT n.nspname FROM pg_extension e
        JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'unaccent');
    BEGIN
        EXECUTE format('ALTER TEXT SEARCH CONFIGURATION {TEXT_SEARCH_CONFIG}'
            ' ALTER MAPPING FOR word, hword, hword_part'
            ' WITH %I.unaccent, mnemo_english_stem', place);
        EXECUTE format('ALTER TEXT SEARCH CONFIGURATION {TEXT_SEARCH_CONFIG}'
            ' ALTER MAPPING FOR numword, numhword, hword_numpart'
            ' WITH %I.unaccent, simple', place);
    END $$""",
)

# Every change of a node's text logged under a per-repo sequence in the writer's transaction
# (the locked `lexical_repos` row makes numbers commit in order); LOG_KEEP entries are kept.
_LEXICAL = (
    # Stored as written: keep it as every database holds it.
    f"""CREATE FUNCTION mnemo_lexical_log(changed_repo text, changed bigint[])
            RETURNS void LANGUAGE plpgsql AS $$
            DECLARE
                last bigint;
            BEGIN
                INSERT INTO lexical_repos AS l (repo, seq)
                    VALUES (changed_repo, cardinality(changed))
                    ON CONFLICT (repo) DO UPDATE SET seq = l.seq + cardinality(changed),
                        horizon = greatest(l.horizon, l.seq + cardinality(changed) - {LOG_KEEP})
                    RETURNING seq INTO last;
                INSERT INTO lexical_log (repo, seq, node)
                    SELECT changed_repo, last - cardinality(changed) + n.i, n.node
                    FROM unnest(changed) WITH ORDINALITY AS n(node, i);
                DELETE FROM lexical_log WHERE repo = changed_repo AND seq <= last - {LOG_KEEP};
            END $$""",
    """CREATE FUNCTION mnemo_lexical_rows() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE
                r record;
            BEGIN
                FOR r IN SELECT repo, array_agg(rowid ORDER BY rowid) AS nodes
                         FROM changed GROUP BY repo ORDER BY repo LOOP
                    PERFORM mnemo_lexical_log(r.repo, r.nodes);
                END LOOP;
                RETURN NULL;
            END $$""",
    """CREATE FUNCTION mnemo_lexical_row() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM mnemo_lexical_log(OLD.repo, ARRAY[OLD.rowid]);
                IF NEW.repo IS DISTINCT FROM OLD.repo OR NEW.rowid IS DISTINCT FROM OLD.rowid THEN
                    PERFORM mnemo_lexical_log(NEW.repo, ARRAY[NEW.rowid]);
                END IF;
                RETURN NULL;
            END $$""",
    "CREATE TRIGGER nodes_lexical_insert AFTER INSERT ON nodes"
    " REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION mnemo_lexical_rows()",
    "CREATE TRIGGER nodes_lexical_delete AFTER DELETE ON nodes"
    " REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION mnemo_lexical_rows()",
    "CREATE TRIGGER nodes_lexical_update AFTER UPDATE ON nodes FOR EACH ROW"
    " WHEN (OLD.text IS DISTINCT FROM NEW.text OR OLD.type IS DISTINCT FROM NEW.type"
    " OR OLD.id IS DISTINCT FROM NEW.id OR OLD.repo IS DISTINCT FROM NEW.repo)"
    " EXECUTE FUNCTION mnemo_lexical_row()",
)

BASELINE = Migration("m020_scopes", (
    *_TEXT_SEARCH, *statements(ddl(postgres=True).replace("SEARCH_VECTOR", SEARCH_VECTOR)),
    *_LEXICAL,
))

MIGRATIONS: tuple[Migration, ...] = (BASELINE,)
