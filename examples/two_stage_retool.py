"""OpenOneRec's two-stage turns on retool: think, then answer with other sampling.

Each model turn is two generations: the reasoning stage samples at temperature 1.0
until the model writes ``</think>`` (or its 192-token budget runs out, when agentrl
closes the thought with a ``</think>`` the model did not sample: loss mask 0); the
answer stage then samples at temperature 0.3 within 64 tokens. Both stages' tokens
are the model's (loss mask 1), with their own logprobs and weight versions.

    agentrl train --env examples/two_stage_retool.py:TwoStageRetool

The same stages can be set for any env in the config (``rollout.stages``, see
configs/two-stage-retool.yaml).
"""

from agentrl.envs.retool import RetoolEnv
from agentrl.envs.retool.env import SYSTEM_PROMPT
from agentrl.rollout.stages import Stage

THINK_THEN_ANSWER = (
    Stage(name="think", stop=("</think>",), temperature=1.0, max_tokens=192, on_budget="</think>"),
    Stage(name="answer", temperature=0.3, max_tokens=64),
)


class TwoStageRetool(RetoolEnv):
    """Retool whose turns are generated as THINK_THEN_ANSWER."""

    stages = THINK_THEN_ANSWER

    def __init__(self, **kwargs):
        kwargs.setdefault(
            "system_prompt", SYSTEM_PROMPT + " Think inside <think></think> before each reply."
        )
        super().__init__(**kwargs)
