"""TaskStream: seeded epochs, and resume without losing or duplicating tasks."""

from __future__ import annotations

from agentrl.orchestration.tasks import TaskStream

TASKS = [{"q": i} for i in range(5)]


def test_each_epoch_is_a_permutation_and_seeded():
    s = TaskStream(TASKS, seed=3)
    first = [t["q"] for _, t in s.take(5)]
    second = [t["q"] for _, t in s.take(5)]
    assert sorted(first) == sorted(second) == [0, 1, 2, 3, 4]
    assert first != second  # a new permutation each epoch (seed 3 gives different ones)
    again = TaskStream(TASKS, seed=3)
    assert [t["q"] for _, t in again.take(10)] == first + second


def test_resume_reissues_in_flight_tasks_once():
    s = TaskStream(TASKS, seed=0)
    got = s.take(4)  # indices 0..3 handed out
    s.mark_done([0, 2])  # 1 and 3 were still in flight when the run stopped
    state = s.state_dict()
    assert state["outstanding"] == [1, 3]

    r = TaskStream(TASKS, seed=0)
    r.load_state_dict(state)
    resumed = r.take(3)
    assert [i for i, _ in resumed] == [1, 3, 4]
    assert resumed[0][1] == got[1][1] and resumed[1][1] == got[3][1]
    # Every index trained exactly once across the two runs.
    r.mark_done([1, 3, 4])
    assert r.state_dict()["outstanding"] == []


def test_the_default_model_gets_the_tasks_it_can_learn_from():
    import pytest

    from agentrl.config import load_config
    from agentrl.loading.envs import resolve_env
    from agentrl.orchestration.startup import load_tasks_for

    retool = resolve_env("retool")
    small = load_config(None, ["eval.num_tasks=8"])  # the default model, smollm2-135m
    train, held = load_tasks_for(small, retool)
    assert {r["id"].endswith("-tiny") for r in train + held} == {True}
    assert len(held) == 8 and not {r["id"] for r in held} & {r["id"] for r in train}
    own = load_config(None, ["model.path=/some/model", "eval.num_tasks=8"])
    assert not any(r["id"].endswith("-tiny") for r in load_tasks_for(own, retool)[1])
    chosen = load_config(None, ["task_kwargs={level: standard}", "eval.num_tasks=8"])
    assert not any(r["id"].endswith("-tiny") for r in load_tasks_for(chosen, retool)[1])
    bad = load_config(None, ["task_kwargs={difficulty: 3}"])
    with pytest.raises(ValueError, match="difficulty"):
        load_tasks_for(bad, retool)
