"""The offline knowledge-update set: a fact, later corrected, and a question whose answer is
the value that holds now, through the offline model end to end.

Each case is one or two sessions an agent ran, in order, through the offline model (the
default LLM): the first states a value, a later step (of the same step, the same session or a
later one) corrects it. A recall meets a case when the stale fact is retired and the first
memory that names either value is not retired and names the current one.
`tests/recall/test_offline_updates.py` requires every case on both backends. (The
knowledge-update suite of `scripts/eval_recall.py`, `knowledge_update.py`, measures recall
with a model that extracts exactly the facts given.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import mnemo

# One session: its goal and its (observation, action) steps.
Told = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class Case:
    """Sessions that state `stale` then `current`, and a question about it."""

    question: str
    current: str
    stale: str
    sessions: tuple[Told, ...]


CASES: tuple[Case, ...] = (
    Case("which port does gunicorn use?", "127.0.0.1:8000", "8001", (
        ("Fix the blog's 502", (
            ("nginx returns 502 Bad Gateway on the blog.", "Check the nginx error log."),
            ("gunicorn listens on 127.0.0.1:8001, not 8000.",
             "Bind gunicorn to 127.0.0.1:8000."),
        )),
    )),
    Case("where does Dana live?", "Porto", "Lisbon", (
        ("Plan the trip", (("Dana lives in Lisbon.", "Note it."),)),
        ("Plan the visit", (("Dana moved to Porto.", "Note it."),)),
    )),
    Case("what is the cache TTL?", "ten minutes", "five minutes", (
        ("Tune the cache", (("The cache TTL is five minutes.", "Keep it."),)),
        ("Tune the cache again", (("The cache TTL is now ten minutes.",
                                   "Update the runbook."),)),
    )),
    Case("what is the API rate limit?", "500", "120", (
        ("Configure the API", (("The API rate limit is 120 requests per minute.",
                                "Tell the partner team."),)),
        ("Onboard the partner", (("The API rate limit was raised to 500 requests per minute.",
                                  "Tell the partner team."),)),
    )),
    Case("what is the staging database host?", "db-stage-2.internal", "db-stage-1.internal", (
        ("Set up staging", (("The staging database host is db-stage-1.internal.",
                             "Add it to the team's .pgpass."),)),
        ("Move staging", (("Staging moved to the new cluster this week.",
                           "Update the DNS record."),
                          ("The staging database host is db-stage-2.internal.",
                           "Update the staging env file."))),
    )),
    Case("when do deploys happen?", "Wednesdays", "Tuesday", (
        ("Plan releases", (("Deploys happen every Tuesday at 10am.",
                            "Put it in the team calendar."),)),
        ("Plan releases after the retro", (("Deploys now happen on Wednesdays at 9am.",
                                            "Update the team calendar."),)),
    )),
    Case("how long are the logs kept?", "90 days", "30 days", (
        ("Set up logging", (("The logs are kept for 30 days.", "Note the retention."),)),
        ("Audit logging", (("The logs are now kept for 90 days.", "Note the retention."),)),
    )),
    Case("which database does the orders service use?", "Postgres", "MySQL", (
        ("Pick the stack", (("We use MySQL for the orders service.", "Write it down."),)),
        ("Migrate the orders service", (("We switched from MySQL to Postgres for the orders "
                                         "service.", "Write it down."),)),
    )),
    Case("how much of Sam's trip budget is left for food?", "362 EUR", "271 EUR", (
        ("Help Sam plan the Madrid trip", (
            ("Sam: I have 900 EUR in total for the Madrid trip, flights included.",
             "Compute the Madrid trip budget: 189 EUR flights plus 4 hotel nights at 110 EUR "
             "is 629 EUR, leaving 271 EUR for food, museums and transport."),
            ("Sam: Yes, book the cheaper guesthouse.",
             "The new trip budget leaves 362 EUR for food, museums and transport."),
        )),
    )),
    Case("which port does the VPN use?", "51821", "51820", (
        ("Set up the VPN", (("The VPN uses WireGuard on port 51820.", "Open the firewall."),)),
        ("Fix the VPN", (("The VPN now uses WireGuard on port 51821.",
                          "Open the firewall again."),)),
    )),
    Case("what does Melanie work as?", "teacher", "nurse", (
        ("Chat with Melanie", (("Melanie works as a nurse.", "Note it."),)),
        ("Chat with Melanie again", (("Melanie quit her job and now works as a teacher.",
                                      "Note it."),)),
    )),
    Case("what is postgres max_connections?", "200", "100", (
        ("Tune postgres", (
            ("Postgres runs with max_connections = 100.", "Check the connection count."),
            ("The pool still runs out of connections under load.",
             "Raise the limit in postgresql.conf and restart."),
            ("Postgres now runs with max_connections = 200.", "Watch the connection count."),
        )),
    )),
)

REPO = "updates"


async def remember(mem: mnemo.Memory, cases: Sequence[Case] = CASES) -> None:
    """Opens `REPO` and runs and commits every session of `cases`, in order."""
    await mem.open_repo(REPO)
    for case in cases:
        for goal, steps in case.sessions:
            sid = await mem.start_session(goal, repo=REPO)
            for observation, action in steps:
                await mem.append(sid, observation, action)
            await mem.close_and_commit(sid)
            await mem.end_session(sid)


def names(text: str, value: str) -> bool:
    """Whether `text` holds `value` as a whole word (not inside a longer one)."""
    return re.search(rf"(?<![\w.]){re.escape(value)}(?![\w])", text) is not None


async def evaluate(mem: mnemo.Memory, cases: Sequence[Case] = CASES) -> list[tuple[Case, str]]:
    """The cases not met, each with why."""
    missed: list[tuple[Case, str]] = []
    facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    for case in cases:
        stale = [f for f in facts if names(f.text, case.stale) and not names(f.text, case.current)]
        if not stale or not all(f.retired for f in stale):
            missed.append((case, f"stale facts not all retired: {[f.text for f in stale]}"))
            continue
        result = await mem.recall(REPO, case.question, reinforce=False)
        first = next((m for m in result.memories
                      if names(m.node.text, case.current) or names(m.node.text, case.stale)), None)
        if first is None or first.retired or not names(first.node.text, case.current):
            missed.append((case, f"first: {first}"))
    return missed
