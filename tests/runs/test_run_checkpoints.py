"""Run records load from checkpoints: the same record as a full replay, whatever came after the checkpoint."""

from __future__ import annotations

from pathlib import Path

from jixu.ledger import Store, project
from jixu.runs import Runs, ScriptedProvider
from jixu.runs.journal import RunLog
from jixu.runs.model import run_stream
from jixu.runs.projection import RunProjection
from tests.runs.run_helpers import fix, make_origin, register, run


def replayed(store: Store, run_id: str) -> dict[str, object]:
    projection = RunProjection()
    return projection.dump(project(store, run_stream(run_id), projection, use_checkpoint=False).state)


def test_a_finished_run_loads_from_its_checkpoint_exactly_as_a_replay(store: Store, tmp_path: Path) -> None:
    register(store, make_origin(tmp_path))
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
    run_id = run(runs.create_run("calc", "fix add()", provider="scripted"))
    assert run(runs.execute(run_id)).status == "succeeded"
    checkpoint = store.read_checkpoint(run_stream(run_id), RunProjection.name)
    assert checkpoint is not None and checkpoint.seq == store.stream_info(run_stream(run_id)).head_seq
    loaded = project(store, run_stream(run_id), RunProjection())
    assert loaded.checkpoint == "used" and loaded.events_applied == 0
    assert RunProjection().dump(RunLog(store, run_id).record) == replayed(store, run_id)
    # Events after the checkpoint (a publication of the finished run) are applied on top of it.
    request_id = run(runs.request_publication(run_id))
    assert run(runs.execute_request(request_id)).status == "succeeded"
    after = project(store, run_stream(run_id), RunProjection())
    assert after.checkpoint == "used" and after.events_applied == 4
    assert RunProjection().dump(RunLog(store, run_id).record) == replayed(store, run_id)
    assert [s.run_id for s in run(runs.list_runs())] == [run_id]
