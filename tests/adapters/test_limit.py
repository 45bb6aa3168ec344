"""The adaptive concurrency limit (mnemo/adapters/limit.py) against simulated servers, and the
deadlines that do not count a wait for a slot (`mnemo.calls.retry`).

The servers are simulated in virtual time (trio's `MockClock`, which jumps ahead whenever every
task waits), so a run of hundreds of requests of seconds each takes milliseconds and its times
are exact: a server of `slots` slots answers each request after its service time, queueing
the rest, and goes on with a request whose client gave up (as llama.cpp's and
llama-cpp-python's servers do).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import pytest
import trio.testing
from hypothesis import example, given, settings, strategies as st

from mnemo.adapters.limit import INITIAL, Limit, LimitState, ServerProfile
from mnemo.calls.retry import Expired, allow, fail_after, waiting


def simulate(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend="trio",
              backend_options={"clock": trio.testing.MockClock(autojump_threshold=0)})


@dataclass
class Server:
    """A server with `slots` slots; `service(kind)` seconds a request. With `tokens`, each
    reply reports tokens in proportion to its time (as a model's decoding is)."""

    slots: int
    service: Callable[[str], float]
    waits: list[float] = field(default_factory=list)  # time each request queued in the server
    received: int = 0
    tokens: bool = False

    def __post_init__(self) -> None:
        self._free = anyio.Semaphore(self.slots)

    async def answer(self, kind: str, done: anyio.Event) -> None:
        arrived = anyio.current_time()
        self.received += 1
        async with self._free:
            self.waits.append(anyio.current_time() - arrived)
            await anyio.sleep(self.service(kind))
        done.set()


@dataclass
class Client:
    """Sends through a `Limit` and retries a timed-out request (after the limit dropped)."""

    server: Server
    limit: Limit
    timeout: float
    group: anyio.abc.TaskGroup
    timeouts: int = 0
    answered: int = 0

    async def ask(self, kind: str) -> None:
        for _ in range(5):
            async with self.limit.slot(kind, self.timeout) as ticket:
                done = anyio.Event()
                self.group.start_soon(self.server.answer, kind, done)
                with anyio.move_on_after(self.timeout) as scope:
                    await done.wait()
                if not scope.cancelled_caught:
                    if self.server.tokens:
                        ticket.answered(100, int(50 * self.server.service(kind)))
                    else:
                        ticket.answered()
                    self.answered += 1
                    return
                ticket.overloaded()
                self.timeouts += 1
        raise AssertionError("a request failed five times")


async def burst(client: Client, kinds: list[str]) -> None:
    async with anyio.create_task_group() as tg:
        for kind in kinds:
            tg.start_soon(client.ask, kind)


@pytest.mark.parametrize("tokens", [False, True])
def test_a_one_slot_server_never_queues_more_than_one_request(tokens: bool) -> None:
    """Forty requests at once to a server of one slot: each waits in the server behind at most
    one other (today's fixed eight queued seven), and none times out."""
    server = Server(1, lambda kind: 1.0, tokens=tokens)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            client = Client(server, Limit(8), 5.0, group)
            await burst(client, ["semantic"] * 40)
            assert client.timeouts == 0

    simulate(main)
    assert max(server.waits) <= 1.0 + 1e-9
    assert server.received == 40


def test_a_server_with_room_soon_gets_everything_at_once() -> None:
    """A server of 64 slots: a first burst finds the room within a few round trips, and the
    next burst of 32 goes out at once (one round trip)."""
    server = Server(64, lambda kind: 1.0)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            client = Client(server, Limit(64), 10.0, group)
            await burst(client, ["semantic"] * 64)
            assert client.limit.current >= 32
            started = anyio.current_time()
            await burst(client, ["semantic"] * 32)
            assert anyio.current_time() - started == pytest.approx(1.0)

    simulate(main)
    assert max(server.waits) == 0


def test_room_is_found_before_a_larger_burst_needs_it() -> None:
    """A server of 64 slots met with bursts of 24 (closes of 8 trajectories): the limit goes
    on growing while half of it is in use, so a first burst of 32 goes out at once (one round
    trip, not two)."""
    server = Server(64, lambda kind: 1.0)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            client = Client(server, Limit(64), 10.0, group)
            for _ in range(4):
                await burst(client, ["semantic"] * 24)
            started = anyio.current_time()
            await burst(client, ["semantic"] * 32)
            assert anyio.current_time() - started == pytest.approx(1.0)

    simulate(main)
    assert max(server.waits) == 0


@pytest.mark.parametrize("tokens", [False, True])
def test_kinds_of_different_lengths_do_not_read_as_a_queue(tokens: bool) -> None:
    """Replies of one kind taking ten times another's, on a server with room: the limit still
    reaches the ceiling (each kind is compared with itself, or per token of its reply)."""
    server = Server(32, lambda kind: 10.0 if kind == "semantic" else 1.0, tokens=tokens)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            client = Client(server, Limit(16), 60.0, group)
            for _ in range(6):
                await burst(client, ["semantic", "reward"] * 16)
            assert client.limit.current == 16
            assert client.limit.decreases == 0

    simulate(main)


def test_a_timeout_halves_the_limit_before_the_retry_is_sent() -> None:
    """A limit of eight against a one-slot server with a timeout of 2.5 times the service
    time: the requests that time out halve the limit once (the others of that round say
    nothing new), and their retries go out under the lower limit."""
    server = Server(1, lambda kind: 1.0)
    seen: list[int] = []

    async def main() -> None:
        limit = Limit(8, initial=8)
        async with anyio.create_task_group() as group:
            client = Client(server, limit, 2.5, group)
            await burst(client, ["semantic"] * 8)
            seen.append(limit.decreases)
            assert client.timeouts >= 1
            assert limit.current <= 4
            assert client.answered == 8

    simulate(main)
    assert seen[0] >= 1


def test_a_pinned_limit_never_moves() -> None:
    """`concurrency=` pins the number: a one-slot server's queue does not lower it."""
    server = Server(1, lambda kind: 1.0)

    async def main() -> None:
        limit = Limit(8, pinned=3)
        async with anyio.create_task_group() as group:
            await burst(Client(server, limit, 100.0, group), ["semantic"] * 12)
        assert limit.current == 3

    simulate(main)
    assert max(server.waits) == pytest.approx(2.0)


def test_a_restored_limit_starts_where_the_last_one_ended() -> None:
    """What a limit learned (`state`) starts the next one for the same server (`restore`)."""
    limit = Limit(32)
    assert limit.current == INITIAL
    limit.restore(LimitState(24, slow_start=False))
    assert limit.current == 24
    limit.restore(LimitState(99, slow_start=False))
    assert limit.current == 32
    pinned = Limit(32, pinned=4)
    pinned.restore(LimitState(24, slow_start=False))
    assert pinned.current == 4


@settings(max_examples=30)
@given(
    slots=st.integers(1, 12),
    service=st.dictionaries(st.sampled_from(["state", "subgoal", "semantic"]),
                            st.floats(0.2, 5.0), min_size=3),
    rounds=st.lists(st.integers(1, 40), min_size=1, max_size=6),
)
# Two lone requests once grew the limit to 4: the burst after queued three at a one-slot server.
@example(slots=1, service={"state": 1.0, "subgoal": 1.0, "semantic": 1.0}, rounds=[1, 1, 4])
def test_any_server_gets_few_timeouts_and_few_extra_requests(
    slots: int, service: dict[str, float], rounds: list[int]
) -> None:
    """Whatever its slots and speeds, a server sent bursts with a timeout of three times its
    slowest reply sees at most 1.25 times the requests needed: a queue that outlasts the
    timeout is rare, and each costs one extra request."""
    server = Server(slots, lambda kind: service[kind])
    kinds = sorted(service)
    needed = sum(rounds)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            client = Client(server, Limit(16), 3 * max(service.values()), group)
            for size in rounds:
                await burst(client, [kinds[i % len(kinds)] for i in range(size)])

    simulate(main)
    assert server.received <= max(needed + 1, 1.25 * needed)


def test_slow_start_ends_at_half_on_its_first_queue() -> None:
    """A burst of 23 into a server of 3 slots whose replies all take 1 s, with a 3 s timeout:
    slow start grows by a request a reply until replies show a queue, and the first one
    halves the limit, so the server sees at most 1.25 times the requests needed (taking one
    request off instead let those already queued time out: 29 to 33 requests for 23).
    Five runs: the scheduler orders equal-time replies at random."""
    for _ in range(5):
        server = Server(3, lambda kind: 1.0)

        async def main(server: Server = server) -> None:
            async with anyio.create_task_group() as group:
                client = Client(server, Limit(16), 3.0, group)
                await burst(client, ["semantic"] * 23)

        simulate(main)
        assert server.received <= 1.25 * 23


# ---- deadlines -------------------------------------------------------------------------------


def test_a_deadline_does_not_count_a_wait_for_a_turn() -> None:
    """A deadline of 2 s around 1 s of work and a 5 s wait inside mnemo does not fire; the same
    without the wait marked does."""

    async def main() -> None:
        with fail_after(2.0):
            with waiting():
                await anyio.sleep(5.0)
            await anyio.sleep(1.0)
        with pytest.raises(TimeoutError), fail_after(2.0):
            await anyio.sleep(5.0)

    simulate(main)


def test_a_stretched_deadline_that_passes_says_how_long_it_allowed() -> None:
    """A stretching deadline of 2 s that a slow request lengthens to 5 s (then asks for less,
    which changes nothing) passes at 5 s, a wait for a turn not counted, and its error says 5 s,
    not 2; a deadline that does not stretch keeps its 2 s."""
    raised: list[Expired] = []

    async def slow(stretches: bool) -> None:
        try:
            with fail_after(2.0, stretches=stretches):
                allow(5.0)
                allow(1.0)
                with waiting():
                    await anyio.sleep(3.0)
                await anyio.sleep(10.0)
        except Expired as exc:
            raised.append(exc)

    async def main() -> None:
        await slow(stretches=True)
        assert anyio.current_time() == pytest.approx(8.0)
        await slow(stretches=False)

    simulate(main)
    assert [e.seconds for e in raised] == [pytest.approx(5.0), pytest.approx(2.0)]
    assert "5 s" in str(raised[0])


def test_tasks_started_inside_a_deadline_share_it() -> None:
    """Two tasks inside one deadline: while either waits for a turn the clock stands still,
    while both work it runs."""
    ended: list[float] = []

    async def worker(wait: float, work: float) -> None:
        with waiting():
            await anyio.sleep(wait)
        await anyio.sleep(work)
        ended.append(anyio.current_time())

    async def main() -> None:
        with fail_after(3.0):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker, 4.0, 2.0)  # waits 0-4, works 4-6
                tg.start_soon(worker, 0.0, 2.5)  # works 0-2.5 (while the other waits)
        with pytest.raises(TimeoutError), fail_after(3.0):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker, 0.0, 4.0)

    simulate(main)
    assert ended[:2] == [pytest.approx(2.5), pytest.approx(6.0)]


def test_a_stored_profile_reads_back_and_an_unreadable_one_is_empty() -> None:
    """A server profile as the store keeps it (JSON text) reads back the same, its speed
    too; text that is no profile reads as an empty one (the server is learned again)."""
    profile = ServerProfile(LimitState(6, slow_start=True, unit_seconds=0.02), structured="tool")
    assert ServerProfile.decode(profile.encode()) == profile
    assert ServerProfile.decode('{"concurrency": {"limit": 0}}') == ServerProfile()
    assert ServerProfile.decode("not json") == ServerProfile()


class Manual:
    """A clock moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def one_reply(limit: Limit, clock: Manual, seconds: float, *, out: int = 0, prompt: int = 0,
              max_tokens: int | None = None, timeout: float | None = None) -> None:
    """One request through `limit` taking `seconds`: a reply of `out` tokens, or (with a
    `timeout`) a timeout."""
    ticket = limit.begin("state", timeout)
    ticket.max_tokens, ticket.prompt_tokens = max_tokens, prompt
    clock.now += seconds
    if timeout is not None:
        ticket.overloaded(timed_out=True)
    else:
        ticket.answered(prompt, out)
    limit.end(ticket)


def test_a_limit_learns_the_servers_speed_and_the_time_a_request_needs() -> None:
    """Unmeasured, a request's time is unknown; a reply of 92 tokens in 1 s (100 units of
    work with its overhead) makes a unit 10 ms and a request of 192 tokens 3 x 2 s; a slower
    reply is taken at once, a faster one a quarter of the way."""
    clock = Manual()
    limit = Limit(8, clock=clock)
    assert limit.request_time(192) is None
    one_reply(limit, clock, 1.0, out=92)
    assert limit.unit_seconds == pytest.approx(0.01)
    assert limit.request_time(192) == pytest.approx(6.0)
    assert limit.request_time(192, prompt_tokens=1000) == pytest.approx(9.0)
    one_reply(limit, clock, 4.0, out=92)
    assert limit.unit_seconds == pytest.approx(0.04)
    one_reply(limit, clock, 1.0, out=92)
    assert limit.unit_seconds == pytest.approx(0.0325)


def test_a_timeout_makes_the_next_request_of_its_size_get_longer() -> None:
    """A request that timed out after 6 s needed more than 6 s for its 192 tokens: the speed
    becomes at least that slow and twice what it was; the next such request gets 3 x 6 s."""
    clock = Manual()
    limit = Limit(8, clock=clock)
    one_reply(limit, clock, 1.0, out=92)
    one_reply(limit, clock, 6.0, max_tokens=192, timeout=6.0)
    assert limit.unit_seconds == pytest.approx(0.03)
    assert limit.request_time(192) == pytest.approx(18.0)
    one_reply(limit, clock, 6.0, max_tokens=192, timeout=18.0)
    assert limit.unit_seconds == pytest.approx(0.09)


def test_a_limits_speed_is_kept_and_restored() -> None:
    """The measured speed is part of what a limit learned (`state`), restored into a limit
    that has measured none yet, a pinned one too; a measure of its own is kept."""
    clock = Manual()
    measured = Limit(8, clock=clock)
    one_reply(measured, clock, 1.0, out=92)
    state = measured.state()
    assert state.unit_seconds == pytest.approx(0.01)
    fresh, pinned = Limit(8), Limit(8, pinned=1)
    fresh.restore(state)
    pinned.restore(state)
    assert fresh.unit_seconds == pinned.unit_seconds == pytest.approx(0.01)
    assert pinned.current == 1
    measured.restore(LimitState(2, unit_seconds=5.0))
    assert measured.unit_seconds == pytest.approx(0.01)
