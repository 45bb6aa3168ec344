"""A child process for the durability tests: it drives a Memory to a chosen point and then
dies with `os._exit`, skipping every cleanup (no close, no checkpoint), like a killed process.

    python -m tests.session.durability_child DB MODE

Modes: "collecting" (3 steps appended), "extracting" (closed while the semantic task hangs),
"ready" (extraction finished, not committed), "committed" (commit returned), "auto" (auto-
commit session: one trajectory committed in the background, the next one collecting).
It prints the session id on stdout before dying.
"""

from __future__ import annotations

import os
import sys

import anyio

import mnemo
from tests.fakes import EventLog, FakeEmbedder, FakeLLM

STEPS = [("walk north", "go north"), ("walk east", "go east"), ("walk south", "go south")]


async def main(path: str, mode: str) -> None:
    llm, events = FakeLLM(), EventLog()
    config = mnemo.Config(auto_commit=mode == "auto")
    async with mnemo.Memory(path, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo("r", config=config)
        sid = await mem.start_session("explore the house", repo="r")
        for observation, action in STEPS:
            await mem.append(sid, observation, action)
        if mode == "auto":
            await mem.append(sid, "open door", "push door")
            with anyio.fail_after(10):
                await events.wait_for(lambda e: e.kind == "trajectory_committed")
        elif mode == "extracting":
            held = llm.hold("semantic")
            await mem.close(sid)
            with anyio.fail_after(10):
                await held.started.wait()
        elif mode in ("ready", "committed"):
            await mem.close(sid)
            await events.wait_state(mem, sid, mnemo.State.READY, mnemo.State.FAILED)
            if mode == "committed":
                receipt = await mem.commit(sid)
                assert receipt is not None
                print(" ".join(receipt.node_ids), file=sys.stderr, flush=True)
        print(sid, flush=True)
        os._exit(0)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
