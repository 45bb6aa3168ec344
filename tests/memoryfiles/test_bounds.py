"""MemoryFiles at their limit: the LLM condenses, the fallback drops visibly, and the switch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

import mnemo
from mnemo.calls.tasks import task_inputs
from mnemo.memoryfiles import _format
from tests.memoryfiles.fakes import Clock, RecordingLLM, snapshot, user

OLD = "The staging cluster runs on three m5.large nodes in eu-west-1."
LONG = "The production deploy checklist: " + ", ".join(
    f"step {n} verifies canary metric {n} before promoting" for n in range(12)
)


def scripted(condense: dict[str, Any] | None) -> RecordingLLM:
    """An LLM that files every statement as it is under "deploy" and answers
    `memory_condense` with `condense` (with garbage when None)."""
    llm = RecordingLLM()

    def reply(request: mnemo.LLMRequest) -> Any:
        if request.task == "memory_persist":
            statement = task_inputs(request)["statement"]
            return {"topic": "deploy", "description": "Where staging runs", "entry": statement}
        return condense if condense is not None else {"nonsense": True}

    llm.reply = reply
    return llm


async def test_a_full_file_is_condensed_by_the_llm(directory: Path, clock: Clock) -> None:
    """A write past max_chars asks the LLM to condense the file; its content and description
    are written, and the result says which entries are no longer there word for word."""
    files = mnemo.MemoryFiles(directory, max_chars=200, clock=clock)
    condensed = {
        "description": "Staging hosts and the production deploy checklist",
        "content": "- Staging: 3 m5.large nodes, eu-west-1.\n- Deploys check 12 canary metrics.",
    }
    llm = scripted(condensed)
    await files.persist(OLD, llm=llm)
    stored = await files.persist(LONG, llm=llm)

    assert [r.task for r in llm.calls] == ["memory_persist", "memory_persist", "memory_condense"]
    shown = task_inputs(llm.calls[-1])
    assert shown["entries"] == [f"- {OLD}", f"- {LONG}"]
    assert shown["max_chars"] == 200
    assert stored.content == condensed["content"] + "\n"
    assert stored.description == condensed["description"]
    assert stored.condensed
    assert not stored.truncated
    assert stored.dropped == (f"- {OLD}", f"- {LONG}")
    assert files.list()[0].content == stored.content


async def test_a_condensed_description_saying_an_entry_again_is_kept(
    directory: Path, clock: Clock
) -> None:
    """Condensing is no correction: the condensed file's description stands even when it says
    an entry the condensing reworded (it was replaced by the first entry left)."""
    files = mnemo.MemoryFiles(directory, max_chars=200, clock=clock)
    described = "The staging cluster runs on three m5.large nodes in eu-west-1"
    llm = scripted({"description": described,
                    "content": "- Staging: 3 m5.large nodes, eu-west-1.\n- 12 canary checks."})
    await files.persist(OLD, llm=llm)
    stored = await files.persist(LONG, llm=llm)
    assert stored.condensed
    assert stored.description == described


async def test_a_condensed_correction_keeps_the_condensed_description(
    directory: Path, clock: Clock
) -> None:
    """A correction whose write is condensed: the condensed description, which says an entry
    the condensing reworded and not the one the correction took back, stands."""
    files = mnemo.MemoryFiles(directory, max_chars=200, clock=clock)
    described = "The staging cluster runs on three m5.large nodes in eu-west-1"
    llm = RecordingLLM()

    def reply(request: mnemo.LLMRequest) -> Any:
        if request.task == "memory_persist":
            statement = task_inputs(request)["statement"]
            return {"topic": "deploy", "description": "Where staging runs", "entry": statement}
        if request.task == "memory_condense":
            return {"description": described, "content":
                    "- Staging: 3 m5.large nodes, eu-west-1.\n- Deploys: Thursday, 12 checks."}
        return {"files": [{"topic": "deploy", "description": "", "signals": ["correction"],
                           "content": f"- The deploy window is Thursday. {LONG}",
                           "remove": ["- The deploy window is Tuesday."]}]}

    llm.reply = reply
    await files.persist(OLD, llm=llm)
    await files.persist("The deploy window is Tuesday.", llm=llm)
    result = await files.update([{"role": "user", "content": "Correction: it is Thursday."}],
                                llm=llm, iterations=10)
    [written] = result.files
    assert written.condensed
    assert files.list()[0].description == described


async def test_failed_condense_falls_back_to_dropping_visibly(
    directory: Path, clock: Clock
) -> None:
    """When condensing fails, the oldest entries are dropped and the long one cut, and the
    result says so; the description follows what is left."""
    files = mnemo.MemoryFiles(directory, max_chars=200, clock=clock)
    llm = scripted(None)
    first = await files.persist(OLD, llm=llm)
    assert first.dropped == ()
    assert not first.truncated

    stored = await files.persist(LONG, llm=llm)
    assert [r.task for r in llm.calls].count("memory_condense") == 2  # asked, then re-asked once
    assert len(stored.content) <= 200
    assert OLD not in stored.content
    assert stored.content.startswith("- The production deploy checklist")
    assert stored.dropped == (f"- {OLD}",)
    assert stored.truncated
    assert not stored.condensed
    assert "staging" not in stored.description.lower()
    assert stored.description.startswith("The production deploy checklist")


async def test_condense_reply_past_the_limit_is_asked_again(directory: Path, clock: Clock) -> None:
    """A condensed file that still passes max_chars is not written as is: the bound holds."""
    files = mnemo.MemoryFiles(directory, max_chars=100, clock=clock)
    llm = scripted({"description": "d", "content": "- " + "x" * 150})
    stored = await files.persist(LONG, llm=llm)
    assert [r.task for r in llm.calls].count("memory_condense") == 2
    assert len(stored.content) <= 100
    assert stored.truncated


async def test_a_statement_too_long_for_its_file_is_truncated(
    directory: Path, clock: Clock
) -> None:
    """Offline, a statement longer than max_chars is filed cut short (ending in an ellipsis),
    and the result says truncated, not condensed, with nothing dropped; filed after another
    entry, that entry makes room and is the only one dropped."""
    files = mnemo.MemoryFiles(directory, max_chars=200, clock=clock)
    alone = await files.persist(LONG, llm=None)
    assert alone.content.endswith("\u2026\n")
    assert len(alone.content) <= 200
    assert (alone.truncated, alone.condensed, alone.dropped) == (True, False, ())

    other = mnemo.MemoryFiles(directory / "other", max_chars=200, clock=clock)
    await other.persist("The production deploy checklist lives in the wiki.", llm=None)
    after = await other.persist(LONG, llm=None)
    assert after.content.startswith("- The production deploy checklist: step 0")
    assert after.content.endswith("\u2026\n")
    assert (after.truncated, after.condensed) == (True, True)
    assert after.dropped == ("- The production deploy checklist lives in the wiki.",)


async def test_a_model_that_only_cuts_an_entry_truncates(directory: Path, clock: Clock) -> None:
    """A condensed reply that keeps an entry's leading words (with or without an ellipsis) and
    the other entries as they were is a truncation: nothing is dropped or condensed."""
    files = mnemo.MemoryFiles(directory, max_chars=200, clock=clock)
    short = "The staging cluster runs."
    cut = "The production deploy checklist: step 0 verifies canary metric 0\u2026"
    llm = scripted({"description": "Deploys", "content": f"- {short}\n- {cut}"})
    await files.persist(short, llm=llm)
    stored = await files.persist(LONG, llm=llm)
    assert [r.task for r in llm.calls].count("memory_condense") == 1
    assert stored.content == f"- {short}\n- {cut}\n"
    assert (stored.truncated, stored.condensed, stored.dropped) == (True, False, ())


async def test_condense_keeps_an_entry_written_meanwhile(directory: Path, clock: Clock) -> None:
    """The condensed reply is merged against the file as the write read it: an entry added
    by hand while the model condenses lands in the file, next to the condensed entries."""
    files = mnemo.MemoryFiles(directory, max_chars=200, clock=clock)
    condensed = {"description": "Deploys", "content": "- Deploys check 12 canary metrics."}
    other = "Deploy windows are Tuesdays from 10:00 to 12:00 UTC."

    def add_by_hand() -> None:
        (path,) = directory.glob("*.md")
        text = path.read_text(encoding="utf-8")
        path.write_text(f"{text.rstrip()}\n- {other}\n", encoding="utf-8")

    class Racing(RecordingLLM):
        async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
            if request.task == "memory_condense":
                await anyio.to_thread.run_sync(add_by_hand)
            return await super().generate(request)

    llm = Racing()
    llm.reply = scripted(condensed).reply
    await files.persist(OLD, llm=llm)
    stored = await files.persist(LONG, llm=llm)
    assert other in stored.content
    assert "Deploys check 12 canary metrics." in stored.content
    assert OLD not in stored.content
    assert stored.condensed


async def test_update_reports_what_bounding_cost(directory: Path, clock: Clock) -> None:
    """An update that takes a file past max_chars reports the file with its dropped entries."""
    files = mnemo.MemoryFiles(directory, max_chars=120, clock=clock)
    llm = RecordingLLM()
    llm.reply = lambda request: (
        {
            "files": [
                {
                    "topic": "db",
                    "description": "The database",
                    "signals": ["decision"],
                    "content": f"- {OLD}\n- {LONG}",
                }
            ]
        }
        if request.task == "memory_update"
        else {"x": 1}
    )
    result = await files.update(user("We decided on the staging layout."), llm=llm, iterations=10)
    assert result.error is None
    (written,) = result.files
    assert written.topic == "db"
    assert written.dropped == (f"- {OLD}",)
    assert written.truncated
    assert len(written.content) <= 120


async def test_offline_condense_merges_and_fits(directory: Path, clock: Clock) -> None:
    """Offline, a full file is condensed: a repeated entry is merged away, the rest fits."""
    files = mnemo.MemoryFiles(directory, max_chars=140, clock=clock)
    await files.persist("The deploy runs on Fridays.", llm=None)
    await files.persist("The deploy runs on Fridays after the freeze at 14:00 UTC.", llm=None)
    stored = await files.persist("The deploy needs two approvals from the platform team.", llm=None)
    assert len(stored.content) <= 140
    assert "after the freeze at 14:00 UTC" in stored.content
    assert "- The deploy runs on Fridays.\n" not in stored.content
    assert "two approvals" in stored.content
    assert stored.condensed
    assert stored.dropped == ("- The deploy runs on Fridays.",)


async def test_disabled_files_ask_and_write_nothing(directory: Path, clock: Clock) -> None:
    """With enabled=False, update and persist ask nothing, write nothing, and say so."""
    files = mnemo.MemoryFiles(directory, min_iterations=0, enabled=False, clock=clock)
    llm = RecordingLLM()
    update = await files.update(user("We decided to use PostgreSQL 16."), llm=llm, iterations=50)
    persisted = await files.persist("The VPN password rotates every 90 days.", llm=llm)
    assert update == mnemo.MemoryUpdate(skipped="disabled")
    assert persisted.skipped == "disabled"
    assert (persisted.topic, persisted.content) == ("", "")
    assert llm.calls == []
    assert snapshot(directory) == {}
    assert files.list() == []


def test_bound_reports_dropped_and_truncated() -> None:
    """bound says which entries it dropped (as they were) and whether it cut one."""
    lines = ["- one two three", "- four five six", "- " + "seven " * 20]
    fitted = _format.bound(lines, 40)
    assert fitted.dropped == ("- one two three", "- four five six")
    assert fitted.truncated
    assert len(_format.body(fitted.lines)) <= 40
    assert _format.bound(lines[:2], 400) == _format.Fitted(lines[:2], (), False)


async def test_update_files_lists_only_changed_files(directory: Path, clock: Clock) -> None:
    """MemoryUpdate.files holds the files an update changed, not those it left as they were."""
    files = mnemo.MemoryFiles(directory, clock=clock)
    llm = RecordingLLM()
    llm.reply = lambda _request: {
        "files": [
            {
                "topic": "db",
                "description": "The database",
                "signals": ["decision"],
                "content": "- We use PostgreSQL 16.",
            }
        ]
    }
    first = await files.update(user("We decided on PostgreSQL 16."), llm=llm, iterations=10)
    again = await files.update(user("We decided on PostgreSQL 16."), llm=llm, iterations=10)
    assert [f.topic for f in first.files] == first.written == ["db"]
    assert again.written == []
    assert again.files == []
