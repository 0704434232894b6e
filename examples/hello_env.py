"""Hello world: the model must say a word. agentrl train --env examples/hello_env.py:SayWord"""

from agentrl import Env, Message, StepResult


class SayWord(Env):
    max_turns = 1

    def reset(self, task, *, seed=None):
        self.word = task.get("word", "hello")
        return [Message.user(f"Reply with the word '{self.word}'.")]

    def step(self, action):
        said = self.word.lower() in action.text.lower()
        return StepResult(reward=float(said), terminated=True, info={"said": said})
