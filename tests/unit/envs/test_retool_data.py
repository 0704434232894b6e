"""ReTool tasks: the generator (deterministic, correct, disjoint splits) and the file loader."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentrl.envs.retool.data import (
    TaskFormatError,
    generate_tasks,
    load_tasks,
    parse_task,
    save_tasks,
    split_of,
)


def question(row: dict) -> str:
    return row["prompt"][0]["content"]


def test_generator_is_deterministic_by_seed() -> None:
    a = generate_tasks(50, seed=3)
    assert a == generate_tasks(50, seed=3)
    assert a != generate_tasks(50, seed=4)
    assert generate_tasks(10, seed=3) == a[:10]


def test_generated_answers_are_right() -> None:
    rows = generate_tasks(300, seed=0)
    kinds = {r["kind"] for r in rows}
    assert {"product", "sum", "power_mod", "leftover", "sum_of_squares", "product_minus"} <= kinds
    for r in rows:
        nums = [int(x) for x in re.findall(r"\d+", question(r))]
        answer = int(r["reward_model"]["ground_truth"])
        if r["kind"] == "product":
            a, b = nums
            assert 1000 <= a < 10**6 and 1000 <= b < 10**6
            assert answer == a * b
        elif r["kind"] == "sum":
            terms = nums[1:] if nums[0] == len(nums) - 1 else nums  # "In 5 months ..." counts
            assert 4 <= len(terms) <= 7 and answer == sum(terms)
        elif r["kind"] == "power_mod":
            a, e, m = nums
            assert answer == pow(a, e, m)
        elif r["kind"] == "leftover":
            total, k = nums
            assert answer == total % k


def test_train_and_held_out_never_overlap() -> None:
    train = {question(r) for seed in (0, 1) for r in generate_tasks(1500, seed=seed)}
    test = {question(r) for seed in (0, 1) for r in generate_tasks(300, split="test", seed=seed)}
    assert len(test) > 300  # different seeds give different held-out tasks
    assert not train & test
    assert all(r["split"] == "test" for r in generate_tasks(20, split="test"))


def test_split_of_is_a_fixed_partition() -> None:
    buckets = [split_of("product", (i, 7)) for i in range(2000)]
    assert 100 < buckets.count("test") < 300  # ~10 %
    assert split_of("product", (123, 7)) == split_of("product", (123, 7))


def test_tasks_are_distinct_within_a_split() -> None:
    qs = [question(r) for r in generate_tasks(2000, seed=0)]
    assert len(set(qs)) == len(qs)


def test_generated_rows_round_trip_through_files(tmp_path: Path) -> None:
    rows = generate_tasks(5, seed=0)
    for suffix in ("jsonl", "parquet"):
        path = tmp_path / f"t.{suffix}"
        save_tasks(rows, path)
        loaded = load_tasks(path)
        assert [r["id"] for r in loaded] == [r["id"] for r in rows]
        assert [r["reward_model"] for r in loaded] == [r["reward_model"] for r in rows]
        assert [r["prompt"] for r in loaded] == [r["prompt"] for r in rows]


def test_loads_verl_style_parquet(tmp_path: Path) -> None:
    path = tmp_path / "verl.parquet"
    table = pa.Table.from_pylist(
        [
            {
                "data_source": "math",
                "prompt": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "1+1?"},
                ],
                "reward_model": {"style": "rule", "ground_truth": "2"},
                "extra_info": {"index": 17},
            }
        ]
    )
    pq.write_table(table, path)
    (row,) = load_tasks(path)
    assert row["id"] == "17"
    assert row["reward_model"] == {"ground_truth": "2"}
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]


def test_loads_plain_jsonl_forms(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_text(
        json.dumps({"prompt": "What is 2*3?", "answer": 6})
        + "\n\n"
        + json.dumps({"messages": [{"role": "user", "content": "hi"}], "label": "x"})
        + "\n"
    )
    a, b = load_tasks(path)
    assert a["prompt"] == [{"role": "user", "content": "What is 2*3?"}]
    assert a["reward_model"]["ground_truth"] == "6"
    assert a["id"] == "plain-0"
    assert b["reward_model"]["ground_truth"] == "x"


def test_missing_prompt_names_file_row_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "answer": 1}) + "\n" + json.dumps({"answer": 2}))
    with pytest.raises(TaskFormatError) as e:
        load_tasks(path)
    msg = str(e.value)
    assert "bad.jsonl" in msg and "row 1" in msg and "line 2" in msg
    assert "missing field 'prompt'" in msg


def test_missing_answer_names_row_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a"}, {"prompt": "b"}]), path)
    with pytest.raises(TaskFormatError, match=r"bad.parquet, row 0: missing field 'answer'"):
        load_tasks(path)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"prompt": [{"role": "user"}], "answer": "1"}, r"row 4: field 'prompt'\[0\].*'content'"),
        ({"prompt": 5, "answer": "1"}, "row 4: field 'prompt' must be a list"),
        ({"prompt": [], "answer": "1"}, "row 4: field 'prompt' is an empty list"),
        ({"prompt": "q", "answer": ""}, "row 4: field 'answer' is empty"),
        ({"prompt": "q", "answer": [1]}, "row 4: field 'answer' must be a string or a number"),
        ({"prompt": "q", "reward_model": {}}, "row 4: missing field 'answer'"),
    ],
)
def test_bad_rows(row: dict, match: str) -> None:
    with pytest.raises(TaskFormatError, match=match):
        parse_task(row, index=4, source="tasks.jsonl")


def test_invalid_json_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "q", "answer": 1}\n{not json\n')
    with pytest.raises(TaskFormatError, match=r"broken.jsonl \(line 2\), row 1: not valid JSON"):
        load_tasks(path)


@pytest.mark.parametrize("level", ["standard", "tiny"])
def test_reference_solutions_print_the_answer(level: str) -> None:
    import subprocess
    import sys

    rows = [r for r in generate_tasks(60, seed=2, level=level) if r["kind"] != "sum_of_squares"]
    program = "\n".join(r["solution"] for r in rows)
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [r["reward_model"]["ground_truth"] for r in rows]


def test_tiny_level_states_its_expression_and_keeps_splits_apart() -> None:
    rows = generate_tasks(200, seed=0, level="tiny")
    assert {r["kind"] for r in rows} == {"product", "sum", "product_minus", "leftover"}
    for r in rows:
        expr = r["solution"].removeprefix("print(").removesuffix(")")
        assert expr in question(r)  # the program copies the question's expression
        assert all(1 <= len(n) <= 4 for n in re.findall(r"\d+", expr))
    held = {question(r) for r in generate_tasks(100, split="test", seed=0, level="tiny")}
    assert not held & {question(r) for r in generate_tasks(2000, seed=0, level="tiny")}
    assert rows != generate_tasks(200, seed=0)  # a different stream than standard


def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="hard"):
        generate_tasks(1, level="hard")
