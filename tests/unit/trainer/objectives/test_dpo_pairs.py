"""Preference pairs: from a run's groups (best vs worst) and from a pairs file."""

from __future__ import annotations

import json

import pytest

from agentrl.trainer.objectives.pairs_file import PairsFileError, load_pairs_file
from agentrl.trainer.objectives.preference import build_group_pairs
from tests.helpers.trainer import episode


def _ep(i: int, group: str, reward: float, n_model: int = 2):
    return episode(i, group, [1, 2, 3], [4 + i] * n_model, reward)


def test_group_pairs_best_vs_worst_ties_and_single_groups():
    batch = [
        # g0: best 1.0 (ep1 first of the two), worst -1.0 (ep3)
        _ep(0, "g0", 0.5), _ep(1, "g0", 1.0), _ep(2, "g0", 1.0), _ep(3, "g0", -1.0),
        _ep(4, "g1", 0.3), _ep(5, "g1", 0.3),  # all tied: no pair
        _ep(6, "g2", 1.0),  # one episode: no pair
        _ep(7, "g3", 0.0), _ep(8, "g3", 1.0, n_model=0),  # only one with model tokens
        _ep(9, "g4", 0.0), _ep(10, "g4", 0.0), _ep(11, "g4", 0.2),  # worst: first 0.0
    ]  # fmt: skip
    ps = build_group_pairs(batch)
    got = [(c.episode_id, r.episode_id) for c, r in ps.pairs]
    assert got == [("ep1", "ep3"), ("ep11", "ep9")]
    assert ps.tied_groups == 1
    assert ps.single_groups == 2  # g2, and g3 whose other episode has nothing to score
    assert ps.episodes_without_model_tokens == 1


def test_group_pairs_of_an_empty_batch():
    ps = build_group_pairs([])
    assert ps.pairs == [] and ps.tied_groups == ps.single_groups == 0


def _write(tmp_path, rows) -> str:
    p = tmp_path / "pairs.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(p)


def test_pairs_file_scores_only_the_assistant_tokens(tokenizer, tmp_path):
    path = _write(
        tmp_path,
        [
            {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
            {
                "messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Say hi"}],
                "chosen": [{"role": "assistant", "content": "hi"}],
                "rejected": {"role": "assistant", "content": "hello there"},
            },
        ],
    )  # fmt: skip
    pairs = load_pairs_file(path, tokenizer)
    assert len(pairs) == 2
    (c0, r0), (c1, r1) = pairs

    def trained(t):
        return tokenizer.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m])

    assert trained(c0) == "4<|im_end|>" and trained(r0) == "5<|im_end|>"
    assert trained(c1) == "hi<|im_end|>" and trained(r1) == "hello there<|im_end|>"
    # The same prompt tokens before each side; the prompt is never trained on.
    assert c0.token_ids[: c0.prompt_length] == r0.token_ids[: r0.prompt_length]
    assert not any(c0.loss_mask[: c0.prompt_length])
    assert "Be brief." in tokenizer.decode(c1.token_ids[: c1.prompt_length])
    for t in (c0, r0, c1, r1):
        t.validate()


def test_pairs_file_multi_turn_side_masks_tool_results(tokenizer, tmp_path):
    chosen = [
        {"role": "assistant", "content": "let me check"},
        {"role": "user", "content": "RESULT 7"},
        {"role": "assistant", "content": "7"},
    ]
    path = _write(tmp_path, [{"prompt": "q", "chosen": chosen, "rejected": "8"}])
    ((c, _),) = load_pairs_file(path, tokenizer)
    text = tokenizer.decode([i for i, m in zip(c.token_ids, c.loss_mask, strict=True) if m])
    assert text == "let me check<|im_end|>7<|im_end|>"  # not the in-between message


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([], "holds no rows"),
        ([{"prompt": "q", "chosen": "a"}], r"line 1\): missing rejected"),
        ([{"chosen": "a", "rejected": "b"}], r"missing prompt \(or messages\)"),
        ([{"prompt": "q", "chosen": [], "rejected": "b"}], "'chosen' must be a string or a non"),
        ([{"prompt": "q", "chosen": [{"content": "x"}], "rejected": "b"}], "needs a 'role'"),
        (
            [{"prompt": "q", "chosen": [{"role": "user", "content": "x"}], "rejected": "b"}],
            "'chosen' holds no assistant message",
        ),
        ([7], "a row must be an object"),
    ],
)
def test_pairs_file_errors_name_the_row(tokenizer, tmp_path, rows, match):
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(PairsFileError, match=match):
        load_pairs_file(p, tokenizer)


def test_pairs_file_missing_or_not_json(tokenizer, tmp_path):
    with pytest.raises(PairsFileError, match="does not exist"):
        load_pairs_file(tmp_path / "nope.jsonl", tokenizer)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n{oops\n')
    with pytest.raises(PairsFileError, match=r"line 2.*not valid JSON"):
        load_pairs_file(bad, tokenizer)
