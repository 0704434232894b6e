"""examples/hello_env.py: the hello-world env stays tiny and passes check_env."""

from __future__ import annotations

from agentrl import Action, Message
from agentrl.loading.envs import resolve_env
from agentrl.testing import check_env
from tests.helpers.paths import REPO

EXAMPLE = REPO / "examples" / "hello_env.py"


def test_hello_env_is_at_most_20_lines() -> None:
    assert len(EXAMPLE.read_text().splitlines()) <= 20


def test_hello_env_passes_check_env_and_rewards_the_word() -> None:
    cls = resolve_env(f"{EXAMPLE}:SayWord")
    check_env(cls(), {"word": "banana"})
    env = cls()
    assert env.reset({"word": "banana"}) == [Message.user("Reply with the word 'banana'.")]
    assert env.step(Action(text="Banana!")).reward == 1.0
    env.reset({"word": "banana"})
    step = env.step(Action(text="apple"))
    assert (step.reward, step.terminated) == (0.0, True)
