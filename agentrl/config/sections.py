"""The sections of the run configuration: model, inference, rollout, reward, eval, agent, …

Each section is a strict pydantic model (unknown keys are errors); every field carries its
documentation in ``description``. :class:`agentrl.config.RunConfig` composes them.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = [
    "DEFAULT_LR",
    "DEFAULT_MODEL",
    "AgentConfig",
    "EvalConfig",
    "InferenceConfig",
    "ModelConfig",
    "OrchestrationConfig",
    "RewardConfig",
    "RolloutConfig",
    "StageConfig",
    "Strict",
    "TreeConfig",
]

DEFAULT_MODEL = "smollm2-135m"
"""The model of a run that names none: SmolLM2-135M-Instruct, fetched on first use."""
DEFAULT_LR = 2e-5
"""Learning rate of a run that sets none, tuned for :data:`DEFAULT_MODEL`."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Strict):
    """Which policy to train."""

    path: str | None = Field(
        DEFAULT_MODEL,
        description="HF model directory, hub id, or a name of `agentrl model list` (fetched "
        "and converted on first use); 'tiny' (or null) builds/uses the tiny 1.4M-parameter "
        "test model.",
    )
    tiny_seed: int = Field(0, description="Seed of the tiny model (when path is 'tiny').")


class InferenceConfig(Strict):
    """The vLLM servers that generate rollouts."""

    num_servers: int = Field(1, ge=1, description="Local vLLM servers to launch.")
    urls: list[str] = Field(
        default_factory=list, description="Attach to these running servers instead of launching."
    )
    api_key: SecretStr | None = Field(
        None,
        exclude=True,
        description="Bearer key of the servers in `urls` (vLLM --api-key, or a proxy's), sent "
        "on every request. Never saved to config.yaml; prefer the environment variable "
        "AGENTRL_INFERENCE_API_KEY, read when this is unset (a command line is visible in "
        "`ps`). Launched servers need none: off loopback they get a per-run key of their own.",
    )
    api: Literal["auto", "generate", "completions"] = Field(
        "auto",
        description="Route the rollouts use. generate: vLLM's token-in-token-out "
        "/inference/v1/generate (no detokenization, exact per-token weight versions); "
        "completions: /v1/completions with token-id prompts (any server that takes them); "
        "auto: generate on launched servers and on attached ones whose /openapi.json lists "
        "it, else completions.",
    )
    max_model_len: int = Field(4096, gt=0, description="Context length the servers accept.")
    kv_cache_gb: float = Field(2.0, gt=0, description="KV cache per server, GiB (CPU build).")
    dtype: str = Field(
        "auto",
        description="vLLM --dtype of the servers ('auto': vLLM's choice, which on CPU "
        "downcasts a float32 model to bfloat16; 'float32' matches an fp32 trainer's logprobs).",
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="GPU build only.")
    startup_timeout_s: float = Field(600.0, gt=0, description="Seconds to wait for readiness.")
    request_timeout_s: float = Field(600.0, gt=0, description="Timeout of one generate call.")
    extra_args: list[str] = Field(
        default_factory=list, description="Extra command-line arguments for each vLLM server."
    )
    cpus: list[int] = Field(
        default_factory=list,
        description="CPU ids the launched servers are pinned to (affinity, and on CPU one "
        "vLLM OpenMP thread per CPU); with trainer.cpus disjoint, generation and training "
        "overlap on separate cores. Empty: not pinned.",
    )


class StageConfig(Strict):
    """One stage of a multi-stage model turn (agentrl.rollout.stages.Stage)."""

    name: str = Field("", description="Name, for the stage_tokens/<name> metric.")
    stop: list[str] = Field(
        default_factory=list,
        description="Strings that end the stage; each must be one token of the policy's "
        "vocabulary (e.g. '</think>'). The turn's end-of-turn tokens always end the turn.",
    )
    stop_token_ids: list[int] = Field(
        default_factory=list, description="Token ids that end the stage, beside `stop`."
    )
    temperature: float | None = Field(
        None, ge=0, description="Temperature of this stage (None: rollout.temperature)."
    )
    top_p: float | None = Field(
        None, gt=0, le=1, description="Nucleus mass of this stage (None: rollout.top_p)."
    )
    top_k: int | None = Field(None, description="Top-k of this stage (None: off, -1).")
    max_tokens: int | None = Field(
        None, ge=1, description="Most tokens of this stage (None: what is left of the turn)."
    )
    on_budget: str = Field(
        "",
        description="Text inserted, untrained (loss mask 0), when the stage runs out of its "
        "max_tokens, before the next stage (e.g. '</think>').",
    )
    after: str = Field(
        "",
        description="Text inserted, untrained, after the stage ends on a stop and before "
        "the next stage.",
    )


class TreeConfig(Strict):
    """Tree rollouts (agentrl.rollout.tree; docs/rollout.md#tree-rollouts): each task's group
    is the leaves of trees that branch between turns, the env forked at each branch point."""

    branch_at: Literal["turns", "entropy"] = Field(
        "turns",
        description="Where a tree branches: 'turns' at every turn boundary after the first "
        "turn, breadth first; 'entropy' only after a turn more uncertain than every earlier "
        "turn of the branch since its last branch point, by the mean surprisal -log p of its "
        "sampled tokens (a proxy: only the sampled tokens' logprobs are recorded). Both "
        "branch into every leaf still to give before the episode's last turn.",
    )
    width: int = Field(2, ge=2, description="Children per branch point.")
    max_leaves: int = Field(
        4,
        ge=2,
        description="Leaves per tree. The group's episodes are the leaves: each task runs "
        "rollout.group_size // max_leaves trees (group_size must be a multiple). A branch "
        "that ends before it made its leaves hands them to new trees, so the group keeps "
        "its size unless max_tree_tokens prunes it.",
    )
    max_tree_tokens: int | None = Field(
        None,
        gt=0,
        description="Once a tree has generated this many model tokens, none of its branches "
        "branches again and the leaves it has not made are dropped (the group is smaller); a "
        "turn in progress always finishes, nothing is cut mid-turn. None: no limit.",
    )


class RolloutConfig(Strict):
    """How episodes are sampled."""

    tasks_per_step: int = Field(8, ge=1, description="Tasks (groups) per training step.")
    group_size: int = Field(8, ge=1, description="Episodes per task (G of GRPO).")
    max_turns: int = Field(4, ge=1, description="Most model turns per episode.")
    max_total_tokens: int = Field(1024, gt=0, description="Context budget of one episode.")
    max_tokens_per_turn: int = Field(256, gt=0, description="Most tokens of one model turn.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    episode_timeout_s: float = Field(300.0, gt=0, description="Wall-clock budget per episode.")
    max_concurrency: int = Field(256, ge=1, description="Most episodes in flight.")
    tool_timeout_s: float = Field(10.0, gt=0, description="Timeout of one tool call.")
    max_tool_output_chars: int = Field(1024, gt=0, description="Tool output cut length.")
    tool_parser: str = Field(
        "hermes",
        min_length=1,
        description="Tool-call format of the model: 'hermes' (agentrl's own, no vLLM needed), "
        "any vLLM tool parser name (llama3_json, pythonic, llama4_pythonic, mistral, "
        "deepseek_v3, deepseek_v31, qwen3_xml, kimi_k2, …; 'vllm:NAME' forces vLLM's), or "
        "'auto' (read off the tokenizer's chat template; an ambiguous model stops with the "
        "choices). An unknown name stops the run at startup, naming the nearest.",
    )
    reasoning_parser: str | None = Field(
        None,
        description="Reasoning (thinking) format: None (none), any vLLM reasoning parser name "
        "(deepseek_r1, qwen3, mistral, …) or 'auto' (from the tokenizer; None for a model "
        "without thinking markup). The split-off text is Action.reasoning.",
    )
    template_strategy: Literal["auto", "as_sampled", "per_turn"] = Field(
        "auto",
        description="How the chat template is trained on: 'as_sampled' (one sequence per "
        "episode, exactly the tokens the model saw), 'per_turn' (each model turn its own sample "
        "whose prompt is the template's rendering of the conversation so far, as inference "
        "shows it) or 'auto' (`agentrl doctor tokenizer`'s choice: as_sampled for a consistent "
        "template, per_turn for one that rewrites history).",
    )
    inject_tools: bool | None = Field(
        None,
        description="Put the tool schemas into the system message and tool calls into the "
        "assistant text (Hermes format) for a template that drops them (e.g. plain ChatML); "
        "None: when the start-up check finds the template drops them.",
    )
    cpus: list[int] = Field(
        default_factory=list,
        description="CPU ids the rollout side of the training process is pinned to: its "
        "event loop (agent loops, envs, tool calls, clients) and the local sandboxes it "
        "starts; the trainer then computes on a thread of its own pinned to trainer.cpus "
        "(needed with this). On 2 cores: inference.cpus=[0] rollout.cpus=[0] "
        "trainer.cpus=[1]. Empty: the rollout side shares trainer.cpus.",
    )
    stages: list[StageConfig] = Field(
        default_factory=list,
        description="Generate each model turn as these stages, in order (multi-stage turns, "
        "agentrl.rollout.stages; e.g. think until </think> at temperature 1.0, then answer "
        "at 0.3 within 64 tokens); every sampled token is trainable. Empty: one request per "
        "turn. An env's own `stages` attribute wins.",
    )
    tree: TreeConfig | None = Field(
        None,
        description="Sample each group as tree rollouts (the env must fork, Env.fork; "
        "trainer.advantage.estimator grpo becomes tree_grpo). None: group_size independent "
        "episodes. Evaluation is always flat.",
    )

    @model_validator(mode="after")
    def _tree_fits_the_group(self) -> Self:
        t = self.tree
        if t is not None and self.group_size % t.max_leaves:
            raise ValueError(
                f"rollout.tree.max_leaves ({t.max_leaves}) must divide rollout.group_size "
                f"({self.group_size}): each task's group is group_size // max_leaves trees of "
                "max_leaves leaves; set rollout.group_size to a multiple of max_leaves"
            )
        return self


class RewardConfig(Strict):
    """A reward model as a reward source (agentrl.rewards; docs/rewards.md)."""

    model: str | None = Field(
        None,
        description="Directory of a transformers *ForSequenceClassification reward model "
        "with num_labels=1, served by vLLM's pooling runner; each finished episode's reward "
        "becomes env_weight * env reward + weight * score. None: the env's reward alone.",
    )
    url: str | None = Field(
        None,
        description="Score with a pooling server already running here instead of launching "
        "one (`model` still names the directory, for its tokenizer and checks).",
    )
    weight: float = Field(1.0, description="Weight of the reward model's score.")
    env_weight: float = Field(
        0.0, description="Weight of the env's reward (0: the reward model's score alone)."
    )
    clip: float | None = Field(
        None,
        gt=0,
        description="Clip the score to [-clip, clip] before weighting (None: off). The total's "
        "batch normalisation and clipping are trainer.shaping.reward_normalize / reward_clip.",
    )
    input: Literal["messages", "tokens"] = Field(
        "messages",
        description="What the reward model reads: 'messages' (the conversation rendered with "
        "its own chat template) or 'tokens' (the episode's exact token ids; the reward model "
        "must share the policy's tokenizer).",
    )
    batch_size: int = Field(32, ge=1, description="Most episodes per scoring request.")
    timeout_s: float = Field(
        60.0,
        gt=0,
        description="Timeout of one scoring request; a timeout fails that group's "
        "scoring (reward_error episodes, counted), not the run.",
    )
    dtype: str = Field("auto", description="vLLM --dtype of the reward model's server.")
    max_model_len: int | None = Field(
        None, gt=0, description="Context of the reward model's server (None: the model's)."
    )
    startup_timeout_s: float = Field(
        600.0, gt=0, description="Seconds to wait for the reward model's server."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Extra `vllm serve` arguments for the reward model's server (e.g. "
        "['--enforce-eager']: no torch.compile warm-up, a faster start on a CPU).",
    )


class OrchestrationConfig(Strict):
    """How generation and training interleave."""

    mode: Literal["sync", "one_step_off", "fully_async"] = Field(
        "sync",
        description="sync: generate then train; one_step_off: generate batch n+1 while "
        "training on n; fully_async: a stream of episodes with a staleness bound.",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="fully_async: most weight versions a group may start ahead of the step "
        "that trains it, counted in started groups (AReaL's max_head_offpolicyness): group g "
        "starts only once the servers hold the weights of step g // tasks_per_step - this. "
        "Groups train in the order they finish, so a straggler trained later carries older "
        "tokens (with partial_rollout only the tokens it made before each push): "
        "staleness/max reports the real lag.",
    )
    partial_rollout: bool = Field(
        True, description="fully_async: keep in-flight episodes across a weight sync."
    )
    oversample: float = Field(
        1.0, ge=1.0, description="Tasks sampled per step × this, to refill filtered groups."
    )
    dynamic_filter: bool = Field(
        False, description="Drop groups whose rewards are all equal (DAPO), counted."
    )
    buffer_size: int = Field(64, ge=1, description="fully_async: most groups waiting to train.")
    backfill: Literal["always", "while_training"] = Field(
        "always",
        description="fully_async: when newer groups may start. always: whenever the "
        "staleness bound allows; while_training: only while the trainer updates, so a "
        "trainer waiting for a batch gets the servers for that batch alone (its stragglers "
        "decode in a smaller, faster batch: worth it where decode time grows with the batch, "
        "as on CPU servers).",
    )
    overlap_push: bool = Field(
        True,
        description="fully_async: the trainer snapshots its weights and trains on the next "
        "batch while the servers load them (the push no longer stalls the trainer; holds one "
        "extra CPU copy of the weights until the servers have them). A group still starts "
        "only within max_staleness of the weights the servers hold.",
    )
    max_all_discarded_steps: int = Field(
        3,
        ge=0,
        description="Stop the run (checkpoint, exit status 2, one message with the discard "
        "reasons and the first error) after this many consecutive steps in which every "
        "episode was discarded (agent_error, env_error, llm_error, ...): such steps train on "
        "nothing. 0: never stop. Discarded episodes are saved with their tracebacks in "
        "RUN_DIR/discarded/.",
    )


class EvalConfig(Strict):
    """Held-out evaluation."""

    num_tasks: int = Field(64, ge=1, description="Held-out tasks per evaluation.")
    tasks: str | None = Field(
        None,
        description="A separate held-out source, of the kinds `tasks` takes (a DatasetDict "
        "gives its 'test' split, else 'validation'; task_columns applies): its first "
        "num_tasks rows are the held-out tasks and every row of `tasks` trains. None: the "
        "first tenth of `tasks` (at most num_tasks) is held out, or the env's built-in "
        "held-out split.",
    )
    every: int = Field(5, ge=0, description="Evaluate every N steps (0: only before and after).")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature for evaluation.")
    samples_per_task: int = Field(1, ge=1, description="k of pass@k.")
    success_threshold: float = Field(
        1.0, description="An episode succeeds when its reward is at least this."
    )


class AgentConfig(Strict):
    """A bring-your-own agent trained through the OpenAI-compatible gateway (agentrl.gateway)."""

    solve: str | None = Field(
        None,
        description="Agent spec 'path/to/file.py:solve' or 'pkg.module:solve' (async def "
        "solve(task, client) -> float | None); None trains the env with the AgentLoop.",
    )
    score: str | None = Field(
        None,
        description="Scorer spec for episodes whose solve returns None (score(task, messages) "
        "-> float); None: a `score` function beside solve, if any.",
    )
    host: str = Field("127.0.0.1", description="Interface the gateway listens on.")
    port: int = Field(0, ge=0, le=65535, description="Gateway port (0: a free one).")
    max_temperature: float = Field(
        2.0, ge=0, description="An agent's temperature above this is lowered to it."
    )
    request_timeout_s: float = Field(
        300.0, gt=0, description="Timeout of one HTTP request of the agent's client."
    )
    forced_tool_choice: Literal["resample", "prefill"] = Field(
        "resample",
        description="How an agent's tool_choice 'required' (or a named function) is honoured: "
        "resample (sample the turn again until it holds a call of an allowed function) or "
        "prefill (the tool parser's opening tag, e.g. <tool_call>, starts the turn untrained, "
        "then the model continues; resampled as well). Parsers without an opening tag resample.",
    )
    forced_tool_choice_tries: int = Field(
        3, ge=1, description="Samples one forced turn may take; the last one is kept."
    )
