"""A tiny offline verifiers 0.4 taskset for the adapter's tests:
``--env verifiers:agentrl-vf-arith`` with this folder and the verifiers overlay on
``PYTHONPATH`` (tests/unit/adapters/test_verifiers_adapter.py,
tests/integration/test_verifiers_env.py)."""

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= 3)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 10


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            data = ArithData(
                prompt=f"What is {i} + {i}? Answer with the number only.",
                system_prompt="You are a calculator.",
                answer=str(2 * i),
            )
            yield ArithTask(data, self.config.task)


__all__ = ["ArithTaskset"]
