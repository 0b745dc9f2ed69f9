"""The runs layer's pieces: queueing turns, one worker's decisions, the pool API and ``jixu worker``'s errors."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jixu.errors import InvalidInput, ThreadBusy, ThreadNotFound
from jixu.ledger import MemoryStore, Store
from jixu.scheduling import (
    Worker,
    WorkerConfig,
    WorkerPool,
    create_thread_for,
    enqueue_thread,
    make_agent,
    submit_turn,
    thread_id_of,
    thread_work_key,
)
from jixu.scheduling.workers import factory_spec, load_agent_factory
from jixu.threads.log import ThreadLog
from tests.conftest import StoreFactory
from tests.helpers import PROC_CHILDREN, ROOT, children_of, process_exited, python_env
from tests.runs.agents import counter_agent, prepared_agent
from tests.runs.conftest import WAIT, Spawn, jixu, outside_lines, thread_state, wait_until

# --- queueing -------------------------------------------------------------------------------------------


def test_submit_turn_records_a_queued_turn_and_enqueues_the_thread_in_its_project() -> None:
    store = MemoryStore()
    thread_id = create_thread_for(store, counter_agent(), project="billing", metadata={"customer": 7})
    log = ThreadLog.load(store, thread_id)
    assert log.state.metadata == {"customer": 7, "project": "billing"}
    turn_id = submit_turn(store, thread_id, "charge it")
    turn = ThreadLog.load(store, thread_id).state.active_turn()
    assert turn is not None and turn.turn_id == turn_id and turn.queued and turn.owner is None
    [item] = store.list_work()
    assert (item.key, item.group, item.state) == (thread_work_key(thread_id), "billing", "pending")
    assert thread_id_of(item.key) == thread_id and thread_id_of("run/1") is None
    events = len(store.read(f"thread/{thread_id}"))
    with pytest.raises(ThreadBusy):
        submit_turn(store, thread_id, "again")
    assert len(store.read(f"thread/{thread_id}")) == events
    assert enqueue_thread(store, thread_id) == item, "enqueueing a pending thread changes nothing"


def test_queueing_refuses_bad_input_and_writes_nothing() -> None:
    store = MemoryStore()
    for project in ("", "x" * 101, 7):
        with pytest.raises(InvalidInput):
            create_thread_for(store, counter_agent(), project=project)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        create_thread_for(store, {"name": "no contract"})
    assert store.list_streams() == [] and store.list_work() == []
    thread_id = create_thread_for(store, counter_agent())
    with pytest.raises(InvalidInput):
        submit_turn(store, thread_id, "   ")
    with pytest.raises(ThreadNotFound):
        submit_turn(store, "01JD0000000000000000000009", "hello")
    assert store.list_work() == [] and len(store.read(f"thread/{thread_id}")) == 1


def test_agent_factories_and_worker_configs_are_checked() -> None:
    assert make_agent("tests.runs.agents:counter_agent").name == "counter"
    assert factory_spec(counter_agent) == "tests.runs.agents:counter_agent"
    for spec in ("tests.runs.agents", "nope.nope:f", "tests.runs.agents:missing", "tests.runs.agents:WAIT:x"):
        with pytest.raises(InvalidInput):
            load_agent_factory(spec)
    with pytest.raises(InvalidInput, match="not a jixu Agent"):
        make_agent("tests.runs.agents:not_an_agent")
    def local_factory() -> object:
        return counter_agent()

    with pytest.raises(InvalidInput):
        factory_spec(local_factory)  # type: ignore[arg-type]
    for bad in ({"lease_ttl": 0}, {"owner": ""}, {"global_limit": 0}, {"project_limits": {"a": -1}},
                {"takeover": "always"}, {"drain_timeout": -1}, {"concurrency": 0}, {"concurrency": True},
                {"concurrency": 1.5}):
        with pytest.raises(InvalidInput):
            WorkerConfig(store_url="memory://", agent="tests.runs.agents:counter_agent", **bad)  # type: ignore[arg-type]
    config = WorkerConfig(store_url="x.db", agent="m:f", owner="w", project_limits={"a": 1}, global_limit=3)
    assert WorkerConfig.from_json(config.to_json()) == config
    with pytest.raises(InvalidInput):
        WorkerConfig.from_json('{"store_url": 1}')


# --- one worker's decisions (in process, on the memory store) -------------------------------------------


def run_worker(store: Store, until: Callable[[], bool], **options: object) -> list[tuple[str, str]]:
    """Run one in-process worker on ``store`` until ``until()`` holds; what it reported."""
    said: list[tuple[str, str]] = []
    config = WorkerConfig(store_url="memory://", agent="tests.runs.agents:counter_agent", owner="w-1",
                          poll_interval=0.01, lease_ttl=5, **options)  # type: ignore[arg-type]
    worker = Worker(counter_agent(), store, config, report=lambda kind, text: said.append((kind, text)))

    async def main() -> None:
        task = asyncio.create_task(worker.run())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while not until():
            assert loop.time() < deadline, said
            await asyncio.sleep(0.01)
        worker.stop("test over")
        await asyncio.wait_for(task, WAIT)

    asyncio.run(main())
    return said


def test_a_worker_runs_a_queued_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JIXU_TEST_OUTSIDE", str(tmp_path / "outside.txt"))
    store = MemoryStore()
    thread_id = create_thread_for(store, counter_agent())
    submit_turn(store, thread_id, "charge")
    said = run_worker(store, lambda: bool(store.list_work(state="done")))
    assert thread_state(store, thread_id)["status"] == "idle" and len(outside_lines(tmp_path / "outside.txt")) == 1
    assert ("finish", f"thread/{thread_id}: idle: reply 'done'") in said


def test_jixu_worker_prepares_its_agents_model_before_the_first_call(sqlite: StoreFactory) -> None:
    # A module the first answer imports (the price catalogue) would run on the event loop while every other
    # call in flight waits: the worker has the driver load it before it takes turns.
    store = sqlite()
    assert sqlite.url is not None
    thread_id = create_thread_for(store, prepared_agent())
    submit_turn(store, thread_id, "hello")
    done = jixu("worker", "--store", sqlite.url, "--agent", "tests.runs.agents:prepared_agent", "--exit-when-idle",
                "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    assert thread_state(store, thread_id)["messages"][-1]["content"] == "prepared first"
    refused = jixu("worker", "--store", sqlite.url, "--agent", "tests.runs.agents:unpreparable_agent",
                   "--exit-when-idle", "--quiet")
    assert refused.returncode == 6, refused.stdout + refused.stderr
    assert "could not prepare: RuntimeError: the price table is unreadable" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_provider_driver_prepares_its_price_catalogue() -> None:
    probe = ("import sys; from jixu.threads.openai import OpenAIModel; model = OpenAIModel('m', api_key='k'); "
             "before = 'genai_prices' in sys.modules; model.prepare(); print(before, 'genai_prices' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.split() == ["False", "True"]


def test_a_worker_runs_as_many_turns_at_once_as_its_concurrency_and_never_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--concurrency N: N queued turns whose unsafe call takes 1 s run side by side on one event loop (about
    1 s in all, not N), never more than N at once, each call exactly once, every thread recorded as it
    would be alone; their commits were shared."""
    import time

    from jixu.kernel import Commits
    from jixu.ledger import SQLiteStore

    monkeypatch.setenv("JIXU_TEST_OUTSIDE", str(tmp_path / "outside.txt"))
    monkeypatch.setenv("JIXU_TEST_TOOL_SLEEP", "1.0")
    store = SQLiteStore(tmp_path / "ledger.db")
    threads = [create_thread_for(store, counter_agent()) for _ in range(12)]
    for thread_id in threads:
        submit_turn(store, thread_id, "charge")
    config = WorkerConfig(store_url=store.url, agent="tests.runs.agents:counter_agent", owner="w-1",
                          poll_interval=0.01, lease_ttl=5, concurrency=6, exit_when_idle=True, quiet=True)
    worker = Worker(counter_agent(), store, config, report=lambda kind, text: None)
    commits: list[Commits] = []

    async def main() -> None:
        commits.append(Commits.of(store))
        await asyncio.wait_for(worker.run(), WAIT)

    started = time.monotonic()
    asyncio.run(main())
    took = time.monotonic() - started
    lines = outside_lines(tmp_path / "outside.txt")
    assert sorted(line[0] for line in lines) == sorted(threads), "each call ran exactly once"
    starts = sorted(float(line[4]) for line in lines)
    # Twelve 1 s calls, six at a time: two waves (about 2 s); one at a time would take 12 s.
    assert took < 8, f"{took:.1f}s: the turns did not run side by side"
    assert max(sum(1 for t in starts if t <= s < t + 1.0) for s in starts) <= 6, "more than 6 calls at once"
    assert starts[5] - starts[0] < 0.9, "the first six calls did not start together"
    assert all(thread_state(store, thread_id)["status"] == "idle" for thread_id in threads)
    assert worker.stats.finished == 12 and worker.stats.errors == 0
    assert commits[0].commits < commits[0].appends, "the turns did not share commits"
    for thread_id in threads:
        assert store.verify(f"thread/{thread_id}").valid
    store.close()


def test_a_turn_a_live_process_owns_is_put_back_for_later_untouched() -> None:
    store = MemoryStore()
    thread_id = create_thread_for(store, counter_agent())
    ThreadLog.load(store, thread_id).start_turn("charge", owner="app-process", ttl=30)
    store.enqueue(thread_work_key(thread_id), "default")
    events = len(store.read(f"thread/{thread_id}"))
    said = run_worker(store, lambda: store.list_work()[0].epoch >= 1 and store.list_work()[0].state == "pending")
    [item] = store.list_work()
    assert item.ready_at > store.now(), "requeued with a delay, not spun on"
    assert len(store.read(f"thread/{thread_id}")) == events
    assert any(kind == "requeue" and "another process owns the turn" in text for kind, text in said)


def test_an_expired_turn_waits_for_an_operator_unless_takeover_is_safe(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JIXU_TEST_OUTSIDE", str(tmp_path / "outside.txt"))
    store = MemoryStore()
    thread_id = create_thread_for(store, counter_agent())
    ThreadLog.load(store, thread_id).start_turn("charge", owner="dead-worker", ttl=1)
    store.advance_clock(2)  # the owner stopped renewing
    store.enqueue(thread_work_key(thread_id), "default")
    events = len(store.read(f"thread/{thread_id}"))
    said = run_worker(store, lambda: (item := store.list_work()[0]).epoch >= 1 and item.state == "pending")
    assert len(store.read(f"thread/{thread_id}")) == events, "never taken over without an explicit decision"
    assert any(kind == "operator" and "recover the turn explicitly" in text for kind, text in said)
    # Not finished: looked at again after a lease's time, so a recovery, or the holder letting go, is acted on.
    [item] = store.list_work()
    assert item.state == "pending" and item.ready_at > store.now(), item
    # takeover="safe": nothing is in doubt (no effect was dispatched), so the worker continues it.
    enqueue_thread(store, thread_id)
    run_worker(store, lambda: thread_state(store, thread_id)["status"] == "idle", takeover="safe")
    claimed = [e for e in store.read(f"thread/{thread_id}") if e.type == "turn.claimed"]
    assert [(e.data["reason"], e.data["previous_owner"]) for e in claimed] == [("took_over_expired", "dead-worker")]


def test_work_that_is_not_a_thread_is_left_in_the_queue_for_its_own_workers() -> None:
    store = MemoryStore()
    store.enqueue("run/1", "default")
    said = run_worker(store, lambda: store.list_work()[0].epoch >= 1 and store.list_work()[0].state == "pending")
    assert any(kind == "error" and text.startswith("run/1: not a thread: left in the queue") for kind, text in said)
    [item] = store.list_work()
    assert item.key == "run/1" and item.state == "pending", "a run must not be marked done by a thread worker"


# --- the pool and the command ---------------------------------------------------------------------------


def test_a_pool_runs_the_queue_empty_and_exits(sqlite: StoreFactory, tmp_path: Path) -> None:
    store = sqlite()
    assert sqlite.url is not None
    threads = [create_thread_for(store, counter_agent(), project=p) for p in ("a", "b", "a")]
    for thread_id in threads:
        submit_turn(store, thread_id, "charge")
    log = (tmp_path / "pool.log").open("w")
    pool = WorkerPool(counter_agent, sqlite.url, processes=2, owner_prefix="pool", poll_interval=0.02,
                      exit_when_idle=True, env={"JIXU_TEST_OUTSIDE": str(tmp_path / "outside.txt")},
                      stdout=log, stderr=subprocess.STDOUT)
    assert pool.owners == ["pool-1", "pool-2"]
    pool.start()
    try:
        assert pool.wait(WAIT) == [0, 0], (tmp_path / "pool.log").read_text()
    finally:
        pool.stop()
        log.close()
    assert all(thread_state(store, t)["status"] == "idle" for t in threads)
    assert len(outside_lines(tmp_path / "outside.txt")) == 3


def test_a_pool_worker_that_dies_is_started_again_under_its_name_and_one_that_exits_0_is_not(
        sqlite: StoreFactory, tmp_path: Path) -> None:
    store = sqlite()
    assert sqlite.url is not None
    log = (tmp_path / "pool.log").open("w")
    pool = WorkerPool(counter_agent, sqlite.url, processes=2, owner_prefix="pool", poll_interval=0.02,
                      env={"JIXU_TEST_OUTSIDE": str(tmp_path / "outside.txt")}, stdout=log, stderr=subprocess.STDOUT)
    pool.start()
    try:
        first, second = pool.processes
        first.kill()
        first.wait(WAIT)
        started: list[tuple[str, int]] = []
        deadline = time.monotonic() + WAIT
        while not started and time.monotonic() < deadline:
            started += pool.restart_dead()
            time.sleep(0.05)
        assert started == [("pool-1", -signal.SIGKILL)] and pool.restarts == 1
        assert pool.processes[0] is not first and pool.processes[0].poll() is None
        assert pool.processes[1] is second
        thread_id = create_thread_for(store, counter_agent())
        submit_turn(store, thread_id, "charge")
        deadline = time.monotonic() + WAIT
        while thread_state(store, thread_id)["status"] != "idle" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert thread_state(store, thread_id)["status"] == "idle", (tmp_path / "pool.log").read_text()
    finally:
        pool.stop()
        log.close()
    idle = WorkerPool(counter_agent, sqlite.url, processes=1, owner_prefix="idle", poll_interval=0.02,
                      exit_when_idle=True)
    idle.start()
    try:
        assert idle.wait(WAIT) == [0]
        time.sleep(1.5)  # past the first restart delay: a worker that exited 0 stays stopped
        assert idle.restart_dead() == [] and idle.restarts == 0
    finally:
        idle.stop()


@pytest.mark.skipif(not PROC_CHILDREN, reason="reads a process's children from Linux's /proc")
def test_a_sigkilled_pool_leaves_no_orphans_its_children_drain_their_turns_and_exit(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """SIGKILL of `jixu worker --processes 2` while each child is inside an unsafe call: the children notice
    their parent is gone, drain as on SIGTERM (the calls in hand finish and are recorded, the turns go back in
    the queue) and exit, instead of running on as orphans claiming more work under the pool's names; the next
    worker finishes every turn with each call made exactly once."""
    store = sqlite()
    assert sqlite.url is not None
    outside = tmp_path / "outside.txt"
    threads = [create_thread_for(store, counter_agent()) for _ in range(4)]
    for thread_id in threads[:2]:
        submit_turn(store, thread_id, "charge")
    pool = workers(sqlite.url, "pool", "--processes", "2", "--concurrency", "1", "--drain-timeout", "20",
                   env={"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_TOOL_SLEEP": "2.0"})
    wait_until(lambda: len(outside_lines(outside)) == 2, "both children inside their calls")
    children = children_of(pool.pid)
    assert len(children) == 2, pool.output()
    pool.kill()
    for thread_id in threads[2:]:  # queued after the parent died: no orphan may claim these
        submit_turn(store, thread_id, "charge")
    wait_until(lambda: all(process_exited(child) for child in children), "the orphaned children to exit")
    assert "the pool's parent process is gone" in pool.output()
    assert "drained at seq" in pool.output()
    assert sorted(line[0] for line in outside_lines(outside)) == sorted(threads[:2]), "an orphan claimed new work"
    assert store.list_work(state="claimed") == [], "a child left a claim behind"
    unclaimed = {f"thread/{t}" for t in threads[2:]}
    assert all(item.epoch == 0 for item in store.list_work() if item.key in unclaimed), "an orphan claimed new work"
    after = workers(sqlite.url, "after", "--exit-when-idle", env={"JIXU_TEST_OUTSIDE": str(outside)})
    assert after.wait() == 0, after.output()
    assert [thread_state(store, t)["status"] for t in threads] == ["idle"] * 4, after.output()
    assert sorted(line[0] for line in outside_lines(outside)) == sorted(threads), "each call made exactly once"


def test_a_pool_over_a_store_in_memory_is_refused() -> None:
    for url in ("memory://", ":memory:"):
        with pytest.raises(InvalidInput, match="a store they can share"):
            WorkerPool(counter_agent, url, processes=2)


def test_jixu_worker_refuses_bad_options_with_meaningful_exit_codes(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'w.db'}"
    cases = [
        (["--agent", "tests.runs.agents"], 6, "MODULE:FACTORY"),
        (["--agent", "tests.runs.agents:not_an_agent"], 6, "not a jixu Agent"),
        (["--agent", "tests.runs.agents:counter_agent", "--project-limit", "billing"], 6, "PROJECT=N"),
        (["--agent", "tests.runs.agents:counter_agent", "--project-limit", "a=1", "--project-limit", "a=2"], 6,
         "twice"),
        (["--agent", "tests.runs.agents:counter_agent", "--processes", "0"], 2, ""),
    ]
    for args, code, text in cases:
        result = jixu("worker", "--store", db, *args)
        assert result.returncode == code, (args, result.stdout, result.stderr)
        assert text in result.stderr, (args, result.stderr)
    wrong = jixu("worker", "--store", "mysql://db/x", "--agent", "tests.runs.agents:counter_agent")
    assert wrong.returncode == 2 and "not supported" in wrong.stderr
    unusable = jixu("worker", "--store", str(tmp_path / "no-such-dir" / "x.db"), "--agent",
                    "tests.runs.agents:counter_agent")
    assert unusable.returncode == 5, unusable.stderr
    assert not (tmp_path / "w.db").exists(), "nothing was created"
    help_text = jixu("worker", "--help")
    assert help_text.returncode == 0 and "MODULE:FACTORY" in help_text.stdout and "Exit codes" in help_text.stdout


def test_a_pool_stopped_while_a_killed_worker_waits_for_its_restart_exits_0(
        sqlite: StoreFactory, workers: Spawn) -> None:
    """`jixu worker --processes 2`: one worker is SIGKILLed, and the pool is stopped with SIGTERM before it started
    it again (1 s later). The death was reported when it happened; the stop itself stopped every running worker
    cleanly, so the pool exits 0 ("a worker process failed", exit 1, described the earlier death, not the stop)."""
    sqlite()
    assert sqlite.url is not None
    pool = workers(sqlite.url, "pool", "--processes", "2")
    deadline = time.monotonic() + WAIT
    children: list[int] = []
    while len(children) < 2 and time.monotonic() < deadline:
        children = children_of(pool.pid)
        time.sleep(0.05)
    assert len(children) == 2, pool.output()
    time.sleep(1.0)  # both started (their imports done)
    os.kill(children[0], signal.SIGKILL)
    time.sleep(0.4)  # the pool sees the death; its restart is due 1 s after it
    pool.signal(signal.SIGTERM)
    assert pool.wait() == 0, pool.output()


def test_a_pool_stopped_while_its_workers_are_still_starting_exits_0(sqlite: StoreFactory, workers: Spawn) -> None:
    """SIGTERM reaches `jixu worker --processes 2` while its workers are still importing: a worker the forwarded
    SIGTERM ends before it installed its own handler stopped as asked; the pool exited 1 ("some failed")."""
    sqlite()
    assert sqlite.url is not None
    pool = workers(sqlite.url, "early", "--processes", "2")
    deadline = time.monotonic() + WAIT
    while len(children_of(pool.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.signal(signal.SIGTERM)
    assert pool.wait() == 0, pool.output()


@pytest.mark.parametrize("leads_its_group", [True, False])
def test_a_worker_that_does_not_lead_its_process_group_says_so_at_start(sqlite: StoreFactory,
                                                                       leads_its_group: bool) -> None:
    """Started by a program (not a shell, not --processes), a worker stays in its starter's process group: what
    its tools start cannot be told from the starter's after it died, so it is not followed (decision 0056). An
    audit found that silent; the start line says it now."""
    sqlite()
    assert sqlite.url is not None
    started = subprocess.run([sys.executable, "-m", "jixu", "worker", "--store", sqlite.url, "--agent",
                              "tests.runs.agents:prepared_agent", "--exit-when-idle"], capture_output=True, text=True,
                             cwd=ROOT, env=python_env(), timeout=WAIT, start_new_session=leads_its_group, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    line = next(line for line in (started.stdout + started.stderr).splitlines() if "started on" in line)
    assert ("does not lead its process group" in line) is not leads_its_group, line
