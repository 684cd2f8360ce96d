"""The cluster's pieces without a cluster: messages, replay cutting, placement over partitions, the router's request."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from nats.aio.msg import Msg

import kev

from kev.results.result import Result
from kev.distributed.directory import WorkerDirectory
from kev.distributed.messages import DeltaMessage, MalformedMessage, WorkerStatus, WorkItem, decode
from kev.router.placement import PartitionPlacer
from kev.distributed.relay import StreamPosition
from kev.distributed.router_requests import OpenRequest
from kev.distributed.subjects import Topology
from kev.distributed.worker_job import Job
from kev.engine.request import EventListener, StreamEvent
from kev.engine.stats import EngineLoad
from kev.router.features import QuestionFeatures
from kev.backend.bridge import EngineBridge
from kev.backend.metrics import ServerMetrics
from kev.backend.watch import Watch


def item(**changes: object) -> WorkItem:
    fields = {"request_id": "r1", "index": 0, "question": "hi", "reply": "router1", "submitted_at": 1.0,
              "expires_at": 2.0}
    return WorkItem(**{**fields, **changes})  # type: ignore[arg-type]


def test_work_items_round_trip_and_bad_ones_say_why() -> None:
    original = item(question=[{"role": "user", "content": "你好"}], sampling={"max_tokens": 4, "stop": ["\n"]},
                    options={"isolation": "strict"})
    assert decode(WorkItem, original.encode()) == original
    with pytest.raises(MalformedMessage, match="not a valid WorkItem: .*JSON"):
        decode(WorkItem, b"{not json")
    with pytest.raises(MalformedMessage, match="reply: Field required"):
        decode(WorkItem, item().model_copy(update={}).encode().replace(b'"reply":"router1",', b""))
    with pytest.raises(MalformedMessage, match="request_id"):
        decode(WorkItem, item().encode().replace(b'"r1"', b'"r.1"'))  # would be two subject tokens
    with pytest.raises(MalformedMessage, match="not UTF-8|JSON"):
        decode(WorkItem, b"\xff\xfe")


def test_a_replayed_stream_is_cut_and_a_gap_is_dropped() -> None:
    position = StreamPosition()
    assert position.extend(0, "Hel", 0, [1, 2]) == ("Hel", [1, 2])
    assert position.extend(0, "Hello", 0, [1, 2, 3]) == ("lo", [3]), "a redelivered attempt replays from 0"
    assert position.extend(3, "lo", 2, [3]) is None, "nothing new"
    assert position.extend(9, "x", 7, [9]) is None, "a gap: the final answer fills it"
    assert (position.chars, position.tokens) == (5, 3)


def placer(strategy: str = "consistent_hash", partitions: int = 3, **router: object) -> PartitionPlacer:
    config = kev.load_config({"router": {"strategy": strategy, "channel_pool_size": 2, "max_parallel_queries": 2,
                                         "channel_queue_depth": 2, "breaker_threshold": 1, "max_queue": 2, **router}})
    return PartitionPlacer.build(config.router, partitions, encoder=None)


def test_the_strategy_picks_partitions_and_the_breaker_spills() -> None:
    p = placer("semantic_hash")
    features = QuestionFeatures(num_tokens=10, bucket=5)
    first = p.place(features)
    assert first is not None and first.channel_id == 5 % 3 and not first.rerouted
    second = p.place(features)  # its partition has a question waiting: the breaker (threshold 1) is open
    assert second is not None and second.channel_id != first.channel_id and second.rerouted
    assert p.loads.waiting[first.channel_id] == 1 and sum(p.loads.waiting) == 2
    spread = placer("consistent_hash")
    picks = [spread.place(QuestionFeatures(10, 5)) for _ in range(3)]
    assert sorted(x.channel_id for x in picks if x) == [0, 1, 2], "bounded loads: one bucket, every partition"


def test_partitions_without_a_live_worker_take_nothing_and_room_runs_out() -> None:
    p = placer(partitions=2)
    p.loads.live = {1}
    placed = [p.place(QuestionFeatures(10, b)) for b in range(4)]
    assert [x.channel_id for x in placed if x] == [1, 1, 1, 1], "room = pool 2 x depth 2 on the live partition"
    assert p.place(QuestionFeatures(10, 0)) is None, "full: overflow_policy decides"
    assert p.defer() and p.defer() and not p.defer(), "the overflow queue holds router.max_queue"
    p.unplace([1, None])
    assert p.loads.waiting == [0, 3] and p.loads.overflow == 1


def test_a_poll_keeps_what_it_could_not_see_yet() -> None:
    p = placer(partitions=2)
    p.place(QuestionFeatures(10, 0))  # placed, not yet published
    since = p.loads.snapshot()
    late = p.place(QuestionFeatures(10, 1))  # placed while the poll runs
    p.loads.update([0, 0], [0, 0], 0, since)  # JetStream saw neither
    assert sum(p.loads.waiting) == 2 and late is not None
    for partition in range(2):
        while p.loads.unpublished[partition]:
            p.loads.published(partition)
    p.loads.update([1, 1], [0, 0], 0, p.loads.snapshot())
    assert p.loads.waiting == [1, 1]


def result(index: int, text: str = "ab", ids: list[int] | None = None) -> Result:
    return Result("r1", index, text=text, token_ids=ids or [1, 2], channel_id=3)


def test_the_routers_request_keeps_one_answer_per_question_and_closes_streams() -> None:
    events: list[StreamEvent] = []
    request = OpenRequest("r1", 3, "seq_append", "strict", {0, 1, 2}, listeners=[events.append])
    request.add_delta(DeltaMessage(request_id="r1", index=0, reply="x", text="a", token_ids=[1]))
    assert request.add_result(result(0), seq=7)
    assert not request.add_result(result(0, "zz"), seq=9), "a duplicate is dropped"
    request.add_delta(DeltaMessage(request_id="r1", index=0, reply="x", text="b", token_ids=[2]))  # late: dropped
    assert request.add_result(result(2), seq=3) and request.add_result(result(1), seq=5)
    streamed = [(e.text, e.token_ids) for e in events if e.index == 0 and not e.finished]
    assert streamed == [("a", [1]), ("b", [2])], "the answer closes a stream its deltas did not finish"
    assert [r.index for r in request.ordered()] == [2, 1, 0], "seq_append: acceptance order"
    assert request.view.done.is_set() and {e.request_id for e in events} == {"r1"}
    assert list(request.view.iter_events(0)) == events, "stream() gets what the listeners got"


class Subscribable:
    def __init__(self) -> None:
        self.listeners: list[EventListener] = []

    def subscribe(self, listener: EventListener) -> None:
        self.listeners.append(listener)


def test_watch_counts_statuses_for_the_access_line_streamed_or_not() -> None:
    async def scenario() -> None:
        router = Subscribable()
        bridge = EngineBridge(router, ServerMetrics(), 1)  # type: ignore[arg-type]  # only subscribe() is called
        request = OpenRequest("r2", 2, "slot_map", "strict", {0, 1}, listeners=router.listeners)
        request.add_result(result(0), seq=1)  # before the watch: held for it
        watch = bridge.watch("r2", 2, listen=False)  # nobody streams
        finished: list[Watch] = []
        watch.on_finish = finished.append
        request.add_result(Result("r2", 1, status="timeout", finish_reason="timeout"), seq=2)
        await asyncio.wait_for(watch.done.wait(), 5)
        bridge.pool.shutdown()
        assert finished == [watch] and dict(watch.statuses) == {"ok": 1, "timeout": 1}

    asyncio.run(scenario())


def test_a_worker_answer_counts_its_waits_from_the_routers_submit() -> None:
    item = WorkItem(request_id="r3", index=0, question="q", reply="router", submitted_at=100.0, expires_at=999.0)
    engine_result = Result("engine-rid", 0, status="ok", started_at=102.5, queue_ms=500.0, ttft_ms=800.0, tpot_ms=40.0)
    answer = Job(item, Msg(None, subject="work"), "w0").answer(engine_result).result  # a plain NATS message
    waits = (answer["queue_ms"], answer["ttft_ms"], answer["tpot_ms"])
    assert waits == (2500.0, 2800.0, 40.0), "the stream wait included"


def test_cluster_counters_keep_a_gone_workers_count_and_gauges_drop_it() -> None:
    now = [0.0]
    directory = WorkerDirectory(heartbeat_s=0.01, clock=lambda: now[0])
    for worker, used in (("w0", 3), ("w1", 5)):
        directory.on_status(WorkerStatus(worker=worker, partition=0, capacity=8, inflight=0, at=0.0,
                                         alerts={"shadow_mismatch": 1},
                                         load=EngineLoad(1, 0, used, 100, 10, 4, {"a": (10, 4)}).to_counts()).encode())
    load = directory.load()
    assert (load.kv_blocks_used, load.kv_blocks_total, load.num_running, load.prefix_hits) == (8, 200, 2, 8)
    assert load.prefix_by_tenant == {"a": (20, 8)}, "per-tenant prefix counters travel in the heartbeat"
    now[0] += 0.1  # both heartbeats are now older than LIVE_PERIODS x heartbeat_s: the workers are gone
    load = directory.load()
    assert (load.kv_blocks_total, load.num_running, load.prefix_queries, load.prefix_hits) == (0, 0, 20, 8)
    assert directory.totals()[1] == {"shadow_mismatch": 2}, "a counter never goes down when a worker leaves"


def test_names_follow_the_prefix() -> None:
    t = Topology("kev", 2)
    assert t.work_consumers() == [("KEV_p0", "kev.work.p0"), ("KEV_p1", "kev.work.p1"), ("KEV_any", "kev.work.any")]
    assert (t.results_stream, t.requests_bucket, t.out_subject("r9")) == ("KEV_RESULTS", "kev_requests", "kev.out.r9")


def test_the_aggregator_and_placement_import_without_torch() -> None:
    code = ("import sys, kev.distributed.aggregator, kev.router.placement, kev.distributed.router_requests, "
            "kev.cli.aggregator_cmd; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_supervision_backs_off_and_forgives_a_process_that_stayed_up(tmp_path) -> None:
    from kev.distributed.supervisor import ProcessState, read_status, status_table, write_status

    state = ProcessState("worker1", pid=10, started_at=0.0)
    delays = []
    for now in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0):  # dies again right after each restart
        delays.append(state.died(-9, now))
        state.restarted(pid=11, now=now + 0.5)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0] and state.restarts == 7
    assert state.died(-9, now=7.5 + 60) == 1.0, "up for a minute: its next death is a fresh one"
    write_status(tmp_path, [state])
    (read,) = read_status(tmp_path)
    assert (read.name, read.state, read.restarts, read.last_exit) == ("worker1", "restarting", 7, -9)
    assert status_table([read]).splitlines()[1].split() == ["worker1", "restarting", "-", "7", "-9"]


def test_cluster_status_says_starting_until_each_process_is_ready(tmp_path, capsys) -> None:
    """`kev cluster up` writes status.json with every process "starting" before it waits for them; each leaves it,
    with the time recorded, once the router answers or the worker is heard from."""
    from kev.cli.main import main
    from kev.distributed.cluster import Child, LocalCluster
    from kev.distributed.supervisor import ProcessState, read_status

    cluster = LocalCluster({}, 1, tmp_path)
    cluster.children = [Child(name, None, tmp_path / f"{name}.log", [], ProcessState(name, pid, state="starting"))  # type: ignore[arg-type]
                        for name, pid in (("router", 10), ("worker0", 11))]
    cluster.write_status()
    assert main(["cluster", "status", "--workdir", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [row[:2] for row in rows[:2]] == [["router", "starting"], ["worker0", "starting"]], rows
    cluster._mark_running({"router"})
    states = {s.name: s for s in read_status(tmp_path)}
    assert states["router"].state == "running" and states["router"].ready_at is not None
    assert states["worker0"].state == "starting" and states["worker0"].ready_at is None


def test_a_batch_lines_class_and_tenant_travel_to_the_workers_engine() -> None:
    """Cluster mode schedules as single mode does: a server batch's line (work_class="batch", its tenant) keeps both
    through the router's submit (split_submit keeps them as request options, which the work item carries, tagged
    with the rest of it) and the worker hands them to its engine's submit, whose scheduler puts live before batch
    and shares channels between tenants."""
    from types import SimpleNamespace

    from kev.distributed.worker import Worker
    from kev.engine.sampling_params import SamplingParams, split_submit
    from kev.errors import InvalidRequestError

    sampling, options = split_submit(SamplingParams(max_tokens=4), {"tenant": "bob", "work_class": "batch"})
    assert options == {"tenant": "bob", "work_class": "batch"} and sampling.max_tokens == 4
    sent = item(sampling=sampling.to_json(), options=options)
    received = decode(WorkItem, sent.encode())

    class Engine:
        seen: dict[str, object] = {}

        def subscribe(self, listener: object) -> None:
            pass

        def submit(self, queries: list[object], sampling: SamplingParams | None = None, **options: object) -> str:
            Engine.seen = {"queries": queries, "sampling": sampling, **options}
            raise InvalidRequestError("recorded")  # the question's answer is this error: enough here

    class Delivery:  # a JetStream delivery of the work item
        metadata = SimpleNamespace(num_delivered=1)

        async def ack(self) -> None:
            pass

    published: list[tuple[str, bytes]] = []

    async def publish(subject: str, data: bytes) -> None:
        published.append((subject, data))

    worker = Worker(kev.load_config({}), Engine(), "w0", 0)  # type: ignore[arg-type]
    worker.link = SimpleNamespace(js=SimpleNamespace(publish=publish), topology=Topology("kev", 1))  # type: ignore[assignment]
    asyncio.run(worker._run_group([Job(received, Delivery(), "w0")]))  # type: ignore[arg-type]
    assert Engine.seen["work_class"] == "batch" and Engine.seen["tenant"] == "bob"
    assert Engine.seen["queries"] == ["hi"] and Engine.seen["sampling"].max_tokens == 4  # type: ignore[attr-defined]
    assert [subject for subject, _ in published] == ["kev.result.r1"]


def test_a_role_without_a_cluster_secret_warns_once_naming_the_setting(caplog: pytest.LogCaptureFixture) -> None:
    """An operator-run NATS without deploy.cluster_secret: messages go untagged (the config allows it; the NATS
    users and permissions are then the only check), and each role says so once as it starts."""
    import logging

    from kev.config.deploy_config import DeployConfig
    from kev.distributed.connection import connect_forever

    stopping = asyncio.Event()
    stopping.set()  # no connection attempt: only what a role says as it starts
    for secret, expected in ((None, 1), ("s" * 40, 0)):
        caplog.clear()
        deploy = DeployConfig(mode="distributed", nats_url="nats://127.0.0.1:1", cluster_secret=secret)
        with caplog.at_level(logging.WARNING, logger="kev.distributed"):
            assert asyncio.run(connect_forever(deploy, "kev-worker-w0", "worker", stopping)) is None
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == expected and all("deploy.cluster_secret" in w for w in warnings), warnings
