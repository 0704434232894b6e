"""Task sources: Hugging Face ``datasets`` directories, ``.arrow`` files and ``hf:`` specs
(with the real ``datasets`` package), ``task_columns``, ``eval.tasks``, and their errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import datasets  # the real package: pip install 'agentrl[hf]'
import pytest

from agentrl import Env, Message, StepResult
from agentrl.config import load_config
from agentrl.envs.retool.data import load_tasks as retool_load_tasks
from agentrl.errors import TaskSpecError, UserError
from agentrl.loading.envs import resolve_env
from agentrl.loading.hf_tasks import is_hf_source, load_dataset_rows, parse_hf_spec
from agentrl.loading.task_files import read_rows
from agentrl.loading.task_sources import read_task_source
from agentrl.orchestration.startup import load_tasks_for

RETOOL = resolve_env("retool")


def gsm_rows(n: int, tag: str = "") -> list[dict[str, Any]]:
    """GSM8K-style rows: ``question``/``answer`` plus a column retool does not know."""
    return [
        {"question": f"{tag}What is {i} + {i}?", "answer": str(2 * i), "source": "synthetic"}
        for i in range(n)
    ]


def problem_rows(n: int, tag: str = "") -> list[dict[str, Any]]:
    """Rows whose columns retool does not read without task_columns."""
    return [
        {"uid": f"{tag}{i}", "problem": f"{tag}Compute {i} * 3.", "solution": str(3 * i)}
        for i in range(n)
    ]


@pytest.fixture(autouse=True)
def _offline_and_private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub is never asked (as offline), and datasets' cache is the test's own."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def save_dict(path: Path, **splits: list[dict[str, Any]]) -> Path:
    datasets.DatasetDict(
        {name: datasets.Dataset.from_list(rows) for name, rows in splits.items()}
    ).save_to_disk(str(path))
    return path


def save_one(path: Path, rows: list[dict[str, Any]]) -> Path:
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cfg(*overrides: str, **kv: Any):
    return load_config(None, [*overrides, *(f"{k}={v}" for k, v in kv.items())])


# ----------------------------------------------------------------------------- the sources


def test_a_saved_dataset_directory_is_read(tmp_path: Path) -> None:
    rows = gsm_rows(3)
    saved = save_one(tmp_path / "gsm", rows)
    assert is_hf_source(saved) and is_hf_source(str(saved))
    assert [r for _, r in read_rows(saved)] == rows  # once refused as "does not exist"
    assert read_task_source(str(saved)) == rows
    assert read_task_source(f"hf:{saved}") == rows


def test_a_dataset_dict_gives_train_for_tasks_and_test_or_validation_for_eval(
    tmp_path: Path,
) -> None:
    both = save_dict(tmp_path / "both", train=gsm_rows(4, "tr"), test=gsm_rows(2, "te"))
    assert read_task_source(str(both), setting="tasks") == gsm_rows(4, "tr")
    assert read_task_source(str(both), setting="eval.tasks") == gsm_rows(2, "te")
    val = save_dict(tmp_path / "val", train=gsm_rows(4, "tr"), validation=gsm_rows(2, "va"))
    assert read_task_source(str(val), setting="eval.tasks") == gsm_rows(2, "va")
    # An explicit split wins, whichever the setting.
    assert read_task_source(f"hf:{both}:test", setting="tasks") == gsm_rows(2, "te")
    assert read_task_source(f"hf:{both}:train", setting="eval.tasks") == gsm_rows(4, "tr")
    assert [r for _, r in read_rows(both)] == gsm_rows(4, "tr")
    data = load_dataset_rows(both, splits=("test",))
    assert (data.split, data.label, data.name) == ("test", f"{both} (split 'test')", "both-test")
    assert data.columns == ["question", "answer", "source"]


def test_an_arrow_file_is_read(tmp_path: Path) -> None:
    rows = gsm_rows(3)
    saved = save_one(tmp_path / "gsm", rows)
    (arrow,) = saved.glob("*.arrow")
    assert [r for _, r in read_rows(arrow)] == rows  # once refused as an unknown type
    assert read_task_source(str(arrow)) == rows
    assert read_task_source(f"hf:{arrow}") == rows
    assert read_task_source(str(arrow), limit=2) == rows[:2]


def test_hf_specs_read_data_files_and_folders_of_them(tmp_path: Path) -> None:
    rows = gsm_rows(3)
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "t.parquet"))
    ds.to_json(str(tmp_path / "t.jsonl"))
    (tmp_path / "t.json").write_text(json.dumps(rows))
    for name in ("t.parquet", "t.jsonl", "t.json"):
        assert read_task_source(f"hf:{tmp_path / name}") == rows, name
    folder = tmp_path / "splits"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", gsm_rows(4, "tr"))
    write_jsonl(folder / "test.jsonl", gsm_rows(2, "te"))
    assert read_task_source(f"hf:{folder}") == gsm_rows(4, "tr")
    assert read_task_source(f"hf:{folder}", setting="eval.tasks") == gsm_rows(2, "te")
    assert read_task_source(f"hf:{folder}:test") == gsm_rows(2, "te")


def test_hf_specs_parse() -> None:
    assert parse_hf_spec("hf:data/gsm8k").split is None
    spec = parse_hf_spec("hf:data/gsm8k:test")
    assert (spec.path, spec.split) == ("data/gsm8k", "test")
    assert parse_hf_spec("hf:/abs/dir").split is None
    assert parse_hf_spec("plain/dir").path == "plain/dir"


def test_plain_task_files_need_no_datasets(tmp_path: Path, monkeypatch) -> None:
    rows = gsm_rows(3)
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    saved = save_one(tmp_path / "saved", rows)
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now fails
    assert [r for _, r in read_rows(path)] == rows
    mapped = cfg(tasks=path, task_columns="{prompt: question, answer: answer}")
    train, held = load_tasks_for(mapped, RETOOL)
    assert len(train) + len(held) == 3
    with pytest.raises(UserError, match=r"^tasks=.*datasets package: pip install 'agentrl\[hf\]'$"):
        load_tasks_for(cfg(tasks=saved), RETOOL)
    with pytest.raises(TaskSpecError, match="agentrl\\[hf\\]"):
        read_rows(saved)


# ----------------------------------------------------------------------------- task_columns


def test_task_columns_map_a_dataset_to_retool(tmp_path: Path) -> None:
    saved = save_dict(tmp_path / "probs", train=problem_rows(20))
    # Without the mapping, retool's error names the source (not a temporary file) and the fix.
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(cfg(tasks=saved), RETOOL)
    msg = str(e.value)
    assert msg.startswith(f"tasks={saved} (split 'train'), row 0: missing field 'prompt'")
    assert "task_columns" in msg and "agentrl-tasks-" not in msg and "\n" not in msg
    train, held = load_tasks_for(
        cfg(tasks=saved, task_columns="{prompt: problem, answer: solution}"), RETOOL
    )
    assert len(held) == 2 and len(train) == 18  # no eval.tasks: the first tenth held out
    assert held[0]["prompt"] == [{"role": "user", "content": "Compute 0 * 3."}]
    assert held[0]["reward_model"] == {"ground_truth": "0"}
    assert held[0]["id"] == "probs-train-0"  # named after the source and its split
    with_ids = cfg(tasks=saved, task_columns="{prompt: problem, answer: solution, id: uid}")
    assert load_tasks_for(with_ids, RETOOL)[1][0]["id"] == "0"
    # A GSM8K-style dataset: question/answer, and a column the env is not given.
    gsm = save_dict(tmp_path / "gsm8k", train=gsm_rows(10))
    seen = read_task_source(str(gsm), columns={"prompt": "question", "answer": "answer"})
    assert seen[3] == {"prompt": "What is 3 + 3?", "answer": "6"}


def test_task_columns_select_exactly_the_mapped_fields(tmp_path: Path) -> None:
    saved = save_one(tmp_path / "gsm", gsm_rows(3))
    got = read_task_source(str(saved), columns={"q": "question", "a": "answer", "a2": "answer"})
    assert got == [{"q": r["question"], "a": r["answer"], "a2": r["answer"]} for r in gsm_rows(3)]
    # An agent (agent.solve) gets the mapped rows as they are.
    agent = cfg(tasks=saved, task_columns="{q: question}", **{"agent.solve": "x.py:solve"})
    train, held = load_tasks_for(agent, RETOOL)
    assert held + train == [{"q": r["question"]} for r in gsm_rows(3)]


def test_a_missing_mapped_column_names_it_the_columns_and_the_setting(tmp_path: Path) -> None:
    saved = save_dict(tmp_path / "gsm", train=gsm_rows(3))
    bad = cfg(tasks=saved, task_columns="{prompt: problem, answer: answer}")
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(bad, RETOOL)
    assert str(e.value) == (
        f"task_columns: no column 'problem' (for field 'prompt') in tasks={saved} "
        "(split 'train'); its columns: question, answer, source"
    )
    # A plain file: the row is named, with its own columns.
    path = write_jsonl(tmp_path / "t.jsonl", [*gsm_rows(2), {"question": "q?"}])
    with pytest.raises(TaskSpecError, match=r"task_columns: no column 'answer' .*row 2; its "):
        load_tasks_for(cfg(tasks=path, task_columns="{prompt: question, answer: answer}"), RETOOL)
    with pytest.raises(TaskSpecError, match=r"task_columns=.*neither is set"):
        load_tasks_for(cfg(task_columns="{prompt: question}"), RETOOL)
    with pytest.raises(ValueError, match="task_columns"):
        cfg(task_columns="{prompt: ''}")


# ----------------------------------------------------------------------------- eval.tasks


def test_eval_tasks_is_a_separate_held_out_source(tmp_path: Path) -> None:
    saved = save_dict(tmp_path / "gsm8k", train=problem_rows(10, "tr"), test=problem_rows(6, "te"))
    mapping = "{prompt: problem, answer: solution, id: uid}"
    both = cfg(tasks=saved, task_columns=mapping, **{"eval.tasks": saved, "eval.num_tasks": 4})
    train, held = load_tasks_for(both, RETOOL)
    assert [r["id"] for r in train] == [f"tr{i}" for i in range(10)]  # none held out of tasks
    assert [r["id"] for r in held] == [f"te{i}" for i in range(4)]  # eval.num_tasks of test
    # The same for rows used as they are, and across kinds of sources.
    held_file = write_jsonl(tmp_path / "held.jsonl", problem_rows(5, "h"))
    agent = cfg(
        tasks=f"hf:{saved}:train",
        task_columns="{uid: uid}",
        **{"eval.tasks": held_file, "eval.num_tasks": 3, "agent.solve": "x.py:solve"},
    )
    train, held = load_tasks_for(agent, RETOOL)
    assert [r["uid"] for r in held] == ["h0", "h1", "h2"] and len(train) == 10
    # With the env's built-in training tasks.
    builtin = cfg(task_columns=mapping, **{"eval.tasks": saved, "eval.num_tasks": 2})
    train, held = load_tasks_for(builtin, RETOOL)
    assert len(train) > 100 and [r["id"] for r in held] == ["te0", "te1"]


def test_without_eval_tasks_the_first_tenth_is_held_out_as_before(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"question": f"{i}?", "answer": i} for i in range(30)]
    )
    train, held = load_tasks_for(cfg(tasks=path, **{"eval.num_tasks": 64}), RETOOL)
    assert [r["id"] for r in held] == ["t-0", "t-1", "t-2"] and len(train) == 27
    one = write_jsonl(tmp_path / "one.jsonl", [{"question": "1?", "answer": 1}])
    with pytest.raises(TaskSpecError, match=r"^tasks=.*none to train on.*eval\.tasks="):
        load_tasks_for(cfg(tasks=one), RETOOL)


# ----------------------------------------------------------------------------- errors


def one_line(e: pytest.ExceptionInfo[BaseException], prefix: str) -> str:
    msg = str(e.value)
    assert isinstance(e.value, TaskSpecError) and "\n" not in msg and msg.startswith(prefix), msg
    return msg


def test_a_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for source, setting in (
        (missing, "tasks"),
        (f"hf:{missing}", "tasks"),
        (missing, "eval.tasks"),
    ):
        with pytest.raises(TaskSpecError) as e:
            load_tasks_for(cfg(**{setting: source}), RETOOL)
        assert "does not exist" in one_line(e, f"{setting}={source}: ")


def test_an_empty_dataset(tmp_path: Path) -> None:
    empty = datasets.Dataset.from_dict({"question": [], "answer": []})
    empty.save_to_disk(str(tmp_path / "empty"))
    datasets.DatasetDict(train=empty).save_to_disk(str(tmp_path / "empty-dict"))
    (tmp_path / "empty.jsonl").write_text("")
    for name in ("empty", "empty-dict", "empty.jsonl"):
        source = tmp_path / name
        for setting in ("tasks", "eval.tasks"):
            with pytest.raises(TaskSpecError) as e:
                load_tasks_for(
                    cfg(**{setting: f"hf:{source}:train" if name == "empty-dict" else source}),
                    RETOOL,
                )
            assert one_line(e, f"{setting}=").endswith(("holds no rows", "holds no tasks"))
    # An empty split does not stand in the way of the others.
    mixed = save_dict(tmp_path / "mixed", train=gsm_rows(3), validation=[])
    assert read_task_source(str(mixed)) == gsm_rows(3)


def test_an_unknown_split_lists_the_splits(tmp_path: Path) -> None:
    saved = save_dict(tmp_path / "d", train=gsm_rows(3), dev=gsm_rows(2))
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(cfg(tasks=f"hf:{saved}:tset"), RETOOL)
    assert one_line(e, f"tasks=hf:{saved}:tset: ").endswith(
        "no split 'tset'; its splits: train, dev"
    )
    with pytest.raises(TaskSpecError) as e:  # no default split for eval.tasks
        load_tasks_for(cfg(**{"eval.tasks": saved}), RETOOL)
    msg = one_line(e, f"eval.tasks={saved}: no 'test' or 'validation' split; its splits: ")
    assert f"hf:{saved}:train" in msg
    with pytest.raises(TaskSpecError) as e:  # one dataset has no splits to name
        load_tasks_for(cfg(tasks=f"hf:{save_one(tmp_path / 'one', gsm_rows(2))}:test"), RETOOL)
    assert "drop ':test'" in one_line(e, "tasks=hf:")


def test_a_row_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"question": "q", "answer": 1}, "just text"]))
    agent = cfg(tasks=path, **{"agent.solve": "x.py:solve"})
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(agent, RETOOL)
    assert one_line(e, f"tasks={path}, row 1: a str, not a mapping")
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(cfg(tasks=path, task_columns="{prompt: question}"), RETOOL)
    assert one_line(e, f"tasks={path}, row 1: a str, not a mapping")
    with pytest.raises(TaskSpecError) as e:  # the env's own reading says so too
        load_tasks_for(cfg(tasks=path), RETOOL)
    assert "must be a mapping" in one_line(e, f"tasks={path}")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ('"hf:"', "no path"),
        ('"hf::train"', "no path"),
        ('"hf:data/x:"', "bad split ''"),
        ('"hf:data/x:train[:10]"', "bad split"),
        ('"hf:./no/such/dir"', "does not exist"),
        ('"hf:no_such_file.parquet"', "does not exist"),
    ],
)
def test_a_bad_hf_spec(spec: str, says: str) -> None:
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(cfg(tasks=spec), RETOOL)
    assert says in one_line(e, "tasks=hf:")


def test_a_hub_id_says_the_hub_cannot_be_reached() -> None:
    for setting in ("tasks", "eval.tasks"):
        with pytest.raises(TaskSpecError) as e:
            load_tasks_for(cfg(**{setting: "hf:openai/gsm8k:test"}), RETOOL)
        msg = one_line(e, f"{setting}=hf:openai/gsm8k:test: 'openai/gsm8k' is no local path")
        assert "hub cannot be reached" in msg and "HF_HUB_OFFLINE" in msg and "save_to_disk" in msg


def test_a_hub_id_without_offline_mode_names_the_connection_error(monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)

    def unreachable(*_a: Any, **_k: Any) -> Any:  # what datasets raises without a network
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(cfg(tasks="hf:openai/gsm8k"), RETOOL)
    msg = one_line(e, "tasks=hf:openai/gsm8k: ")
    assert "hub cannot be reached" in msg and "Couldn't reach" in msg


def test_a_directory_that_is_no_dataset(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(cfg(tasks=tmp_path / "d", task_columns="{prompt: q}"), RETOOL)
    assert "hf:DIR" in one_line(e, f"tasks={tmp_path / 'd'}: a directory")
    with pytest.raises(TaskSpecError) as e:  # an empty folder of data files
        load_tasks_for(cfg(tasks=f"hf:{tmp_path / 'd'}"), RETOOL)
    assert "cannot read this folder of data files" in one_line(e, "tasks=hf:")


def test_a_column_the_env_cannot_be_handed_is_named(tmp_path: Path) -> None:
    rows = [{"question": "q?", "answer": "1", "blob": b"\x00\x01"}]
    saved = save_one(tmp_path / "bin", rows)
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(cfg(tasks=saved, **{"eval.tasks": saved}), RETOOL)
    assert "column 'blob' holds a bytes" in one_line(e, f"tasks={saved}, row 0: ")
    train, held = load_tasks_for(
        cfg(tasks=saved, task_columns="{question: question, answer: answer}",
            **{"eval.tasks": saved}),
        RETOOL,
    )  # fmt: skip
    assert train[0]["reward_model"] == {"ground_truth": "1"} and len(held) == 1


class Words(Env):
    """An env whose load_tasks reads .jsonl only, the way a user's might."""

    def reset(self, task: Any, *, seed: int | None = None) -> list[Message]:
        return [Message.user(task["word"])]

    def step(self, action: Any) -> StepResult:
        return StepResult(reward=1.0, terminated=True)

    @classmethod
    def load_tasks(cls, path: str) -> list[dict[str, Any]]:
        assert path.endswith(".jsonl"), path
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        for i, r in enumerate(rows):
            if "word" not in r:
                raise ValueError(f"{path} (line {i + 1}), row {i}: no 'word'")
        return rows


def test_any_env_with_load_tasks_gets_datasets_rows(tmp_path: Path) -> None:
    saved = save_dict(tmp_path / "w", train=[{"w": "a"}, {"w": "b"}], test=[{"w": "c"}])
    train, held = load_tasks_for(
        cfg(tasks=saved, task_columns="{word: w}", **{"eval.tasks": saved}), Words
    )
    assert (train, held) == ([{"word": "a"}, {"word": "b"}], [{"word": "c"}])
    with pytest.raises(TaskSpecError) as e:
        load_tasks_for(cfg(tasks=saved, **{"eval.tasks": saved}), Words)
    msg = one_line(e, f"tasks={saved} (split 'train'), row 0: no 'word' (task_columns=")
    assert "line" not in msg


def test_the_retool_loader_reads_datasets_sources(tmp_path: Path) -> None:
    rows = [{"question": "What is 2 + 2?", "answer": 4}]
    saved = save_dict(tmp_path / "r", train=rows, test=rows)
    (task,) = retool_load_tasks(saved)  # e.g. `agentrl doctor reward --tasks DIR`
    assert task["reward_model"] == {"ground_truth": "4"}
    assert retool_load_tasks(f"hf:{saved}:test")[0]["prompt"][0]["content"] == "What is 2 + 2?"
