"""Typed configuration of the trainer (pydantic; unknown keys are errors).

Every field says what it does; ``docs/trainer.md`` says where each algorithm comes from.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.trainer.algo.advantages import ADVANTAGE_ESTIMATORS
from agentrl.trainer.algo.losses import AGG_MODES, POLICY_LOSSES, PREFERENCE_LOSSES

__all__ = [
    "ActorConfig",
    "AdvantageConfig",
    "CheckpointConfig",
    "CriticConfig",
    "DPOConfig",
    "KLConfig",
    "LoraConfig",
    "OptimConfig",
    "PolicyLossConfig",
    "RolloutCorrectionConfig",
    "ShapingConfig",
    "TrainerConfig",
    "UpdateConfig",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


_PositiveInt = Annotated[int, Field(gt=0)]


class AdvantageConfig(_Section):
    """How rewards become per-token advantages."""

    estimator: str = Field(
        default="grpo",
        description="Advantage estimator: gae, grpo, dr_grpo, rloo, reinforce_pp, "
        "reinforce_pp_baseline, tree_grpo (tree rollouts: each turn credited by its subtree "
        "against its siblings; grpo without a tree) or any name registered in "
        "ADVANTAGE_ESTIMATORS.",
    )
    gamma: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Discount. GAE discounts per model token; the return-to-go of the other "
        "estimators discounts per model turn.",
    )
    lam: float = Field(default=1.0, ge=0.0, le=1.0, description="GAE λ (Schulman et al. 2016).")
    norm_by_std: bool = Field(
        default=True, description="grpo: divide by the group std; False is the 'no std' switch."
    )
    whiten: bool | None = Field(
        default=None,
        description="Batch-whiten advantages over all model tokens (mean 0, std 1). None = the "
        "estimator's default (on for gae and reinforce_pp*, off for grpo, dr_grpo, rloo).",
    )
    eps: float = Field(default=1e-6, gt=0.0, description="Added to std before dividing.")
    supervision: Literal["auto", "outcome", "process"] = Field(
        default="auto",
        description="grpo's credit for multi-turn episodes. outcome: every turn gets the "
        "episode total's group-normalized advantage (DeepSeekMath §4.1.2); process: each turn "
        "is a step credited by the normalized rewards of the turns from it on (§4.1.3). auto: "
        "process when the env declares Env.process_rewards = True (agentrl train resolves it "
        "at start-up), else outcome. Never decided from the reward values; an in-reward KL "
        "penalty is never a turn reward.",
    )

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, v: str) -> str:
        if v not in ADVANTAGE_ESTIMATORS:
            valid = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
            raise ValueError(f"unknown advantage estimator {v!r}; valid: {valid}")
        return v


class CriticConfig(_Section):
    """The value function used by ``estimator='gae'`` (ignored otherwise)."""

    kind: Literal["value_head", "separate"] = Field(
        default="value_head",
        description="value_head: a linear head on the policy's last hidden state (shared trunk); "
        "separate: its own transformer, initialized from model_path or the policy's weights.",
    )
    model_path: str | None = Field(
        default=None, description="Separate critic's HF model (None = policy's)."
    )
    value_clip: float | None = Field(
        default=0.2,
        description="PPO value clipping range ε_v around the old value (None = no clipping).",
    )
    value_loss_coef: float = Field(
        default=0.5,
        ge=0.0,
        description="Weight of the value loss (value_head: added to the policy loss).",
    )
    lr: float | None = Field(
        default=None,
        description="Separate critic's learning rate (None = optim.lr).",
    )


class PolicyLossConfig(_Section):
    """The policy objective and how per-token losses are aggregated."""

    name: str = Field(
        default="ppo",
        description="Policy loss: ppo (clip, clip-higher), dual_clip, gspo, pg "
        "(or any name registered in POLICY_LOSSES); dpo: preference pairs instead of "
        "advantages (see the dpo section).",
    )
    clip_low: float = Field(
        default=0.2, ge=0.0, description="ε_low: ratio lower bound 1-ε_low (GSPO paper: 3e-4)."
    )
    clip_high: float = Field(
        default=0.2,
        ge=0.0,
        description="ε_high: ratio upper bound 1+ε_high; > clip_low is DAPO's clip-higher "
        "(0.28). GSPO paper: 4e-4.",
    )
    dual_clip_c: float | None = Field(
        default=None,
        gt=1.0,
        description="Dual-clip constant c bounding the loss of A<0 tokens by -c·A (Ye et al. "
        "2020). ppo applies it iff set (3 = verl's PPO loss); the dual_clip loss uses 3 if None.",
    )
    agg: str = Field(
        default="token-mean",
        description="Aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum-norm.",
    )
    loss_norm_constant: int | None = Field(
        default=None,
        gt=0,
        description="seq-mean-token-sum-norm's constant L (Dr. GRPO): the max response length "
        "in model tokens, the same for every mini-batch. None = shaping.max_response_tokens "
        "(an error if that is unset too).",
    )
    entropy_coef: float = Field(
        default=0.0,
        description="Entropy bonus weight (loss -= coef·entropy).",
    )

    @field_validator("name")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        if v not in POLICY_LOSSES and v not in PREFERENCE_LOSSES:
            valid = ", ".join([*sorted(POLICY_LOSSES), *PREFERENCE_LOSSES])
            raise ValueError(f"unknown policy loss {v!r}; valid: {valid}")
        return v

    @field_validator("agg")
    @classmethod
    def _known_agg(cls, v: str) -> str:
        if v not in AGG_MODES:
            raise ValueError(f"unknown loss aggregation {v!r}; valid: {', '.join(AGG_MODES)}")
        return v


class KLConfig(_Section):
    """KL regularization toward a frozen reference model."""

    coef: float = Field(
        default=0.0,
        ge=0.0,
        description="β (initial β when adaptive). 0 and not adaptive = reference-free: "
        "no reference model is loaded.",
    )
    estimator: Literal["k1", "k2", "k3"] = Field(
        default="k3",
        description="KL estimator (Schulman 2020): k1 = log r, k2 = ½(log r)², k3 = r-1-log r.",
    )
    placement: Literal["reward", "loss"] = Field(
        default="loss",
        description="reward: -β·KL per token in the reward; loss: +β·KL in the loss.",
    )
    adaptive: bool = Field(
        default=False,
        description="Adaptive β toward target (Ziegler et al. 2019).",
    )
    target: float = Field(
        default=0.1,
        gt=0.0,
        description="Adaptive controller's target KL per token.",
    )
    horizon: int = Field(
        default=10000,
        gt=0,
        description="Adaptive controller's horizon (samples).",
    )
    ref_model_path: str | None = Field(
        default=None, description="Reference model (None = a frozen copy of the initial policy)."
    )

    @property
    def enabled(self) -> bool:
        """Whether a reference model is needed."""
        return self.coef > 0.0 or self.adaptive


class RolloutCorrectionConfig(_Section):
    """Train/inference mismatch and staleness correction (ρ = π_old / π_rollout)."""

    mode: Literal["decoupled", "bypass"] = Field(
        default="decoupled",
        description="decoupled: π_old recomputed by the trainer before the update, ρ = π_old/μ; "
        "bypass: π_old = μ (rollout logprobs, no extra forward), ρ = sg(π_θ)/μ per micro-batch.",
    )
    is_level: Literal["none", "token", "sequence", "geometric"] = Field(
        default="none",
        description="Truncated importance weights (TIS): min(ρ, is_cap) at this level.",
    )
    is_cap: float = Field(default=2.0, gt=0.0, description="TIS truncation C.")
    mask_level: Literal["none", "token", "sequence", "geometric"] = Field(
        default="none",
        description="Masking outside [mask_low, mask_high]: token = ICEPOP; sequence / "
        "geometric = rejection sampling of whole episodes (with is_level=token: seq-mask-TIS).",
    )
    mask_low: float = Field(default=0.5, ge=0.0, description="Lower bound of kept ρ.")
    mask_high: float = Field(default=5.0, gt=0.0, description="Upper bound of kept ρ.")
    veto_threshold: float | None = Field(
        default=None,
        gt=0.0,
        description="Reject an episode if any token has ρ below this (e.g. 1e-4).",
    )
    batch_normalize: bool = Field(
        default=False,
        description="Rescale IS weights to mean 1 over the batch (decoupled mode only).",
    )
    old_logp: Literal["auto", "prepass"] = Field(
        default="auto",
        description="decoupled mode's π_old. auto: when the update is one pass (1 epoch of "
        "1 mini-batch), π_old = sg(π_θ) from the update's own forward, which is exactly "
        "π_old there, and the pre-pass forward is skipped, unless something needs π_old "
        "before the update (in-reward KL, a value head without a critic, masks, veto, "
        "batch_normalize, dropout); prepass: always recompute π_old before the update.",
    )

    def weight_args(self) -> dict[str, Any]:
        """The keyword arguments of ``compute_correction`` (weights, masks, veto)."""
        return self.model_dump(exclude={"mode", "old_logp"})

    @model_validator(mode="after")
    def _check(self) -> RolloutCorrectionConfig:
        if self.batch_normalize and self.mode == "bypass":
            raise ValueError("batch_normalize needs mode='decoupled' (weights known before update)")
        if self.mask_low >= self.mask_high:
            raise ValueError("mask_low must be < mask_high")
        return self


class ShapingConfig(_Section):
    """Reward shaping and filtering, applied to each episode's total reward."""

    max_response_tokens: int | None = Field(
        default=None,
        gt=0,
        description="L_max of the overlong penalty (model tokens of an episode).",
    )
    overlong_buffer: int | None = Field(
        default=None, gt=0, description="L_cache: the soft ramp's length (DAPO eq. 13); None = off."
    )
    overlong_factor: float = Field(default=1.0, ge=0.0, description="Largest overlong penalty.")
    stop_properly_coef: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="ProRL: truncated episodes' reward × coef (None = off).",
    )
    truncated_reasons: list[str] = Field(
        default_factory=lambda: ["max_tokens"],
        description="Stop reasons that count as truncated (for the penalty and metrics).",
    )
    dynamic_filter: bool = Field(
        default=False, description="DAPO dynamic sampling: drop groups whose rewards are all equal."
    )
    reward_clip: float | None = Field(
        default=None, gt=0.0, description="Clip each episode's reward to [-c, c]."
    )
    reward_normalize: bool = Field(
        default=False,
        description="Z-score episode rewards over the batch (after clipping), with the sample "
        "(Bessel-corrected) std as GRPO's group std.",
    )

    @model_validator(mode="after")
    def _check(self) -> ShapingConfig:
        if self.overlong_buffer is not None:
            if self.max_response_tokens is None:
                raise ValueError("overlong_buffer needs max_response_tokens")
            if self.overlong_buffer > self.max_response_tokens:
                raise ValueError("overlong_buffer must be <= max_response_tokens")
        return self


class OptimConfig(_Section):
    """AdamW and the learning-rate schedule (stepped once per optimizer step)."""

    lr: float = Field(default=1e-6, gt=0.0, description="Peak learning rate.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    eps: float = Field(default=1e-8, gt=0.0, description="AdamW epsilon.")
    weight_decay: float = Field(default=0.0, ge=0.0, description="AdamW decoupled weight decay.")
    max_grad_norm: float | None = Field(
        default=1.0, gt=0.0, description="Clip the global grad norm (None = measure only)."
    )
    warmup_steps: int = Field(
        default=0,
        ge=0,
        description="Linear warm-up length (optimizer steps).",
    )
    schedule: Literal["constant", "linear", "cosine"] = Field(
        default="constant", description="Shape after warm-up."
    )
    total_steps: int | None = Field(
        default=None,
        gt=0,
        description="Optimizer steps for linear/cosine decay (required by them).",
    )
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0, description="Floor of decay, × lr.")

    @model_validator(mode="after")
    def _check(self) -> OptimConfig:
        if self.schedule != "constant" and self.total_steps is None:
            raise ValueError(f"schedule={self.schedule!r} needs total_steps")
        return self


class UpdateConfig(_Section):
    """Epochs, mini-batches and micro-batches of one trainer step."""

    epochs: int = Field(default=1, ge=1, description="Passes over the batch (PPO epochs).")
    mini_batches: int = Field(default=1, ge=1, description="Optimizer steps per epoch.")
    shuffle: bool = Field(default=True, description="Shuffle episodes into mini-batches (seeded).")
    strategy: Literal["token_budget", "fixed"] = Field(
        default="token_budget",
        description="token_budget: micro-batches hold at most token_budget tokens, balanced by "
        "length; fixed: micro_batch_size padded rows each.",
    )
    token_budget: Literal["auto"] | _PositiveInt = Field(
        default="auto",
        description="Tokens per micro-batch per worker. auto: the largest budget whose "
        "estimated peak memory (agentrl.trainer.engine.memory) fits the memory available, at most "
        "2048 on CPU and 65536 on GPU.",
    )
    micro_batch_size: int = Field(
        default=4,
        gt=0,
        description="Rows per micro-batch (strategy=fixed).",
    )
    packing: bool | None = Field(
        default=None,
        description="token_budget: pack episodes into one row (position_ids restart, no padding; "
        "needs varlen attention to avoid cross-episode attention FLOPs); False: length-sorted "
        "padded rows (cost rows × longest). None = pack iff attention is flash_attention_2.",
    )
    share_prefix: bool | None = Field(
        default=None,
        description="Padded micro-batches: a prompt that begins every row (a system prompt, "
        "tool schemas, a group's task) runs once per micro-batch, its keys and values shared "
        "by the rows, instead of once per row; same numbers, fewer FLOPs. None = on where "
        "supported: padded rows (no packing), no gradient checkpointing, one unsharded "
        "worker, every layer full attention; True where unsupported is an error.",
    )
    logprob_chunk: Literal["auto"] | _PositiveInt = Field(
        default="auto",
        description="Tokens per chunk of the lm-head/log-softmax computation. auto: the "
        "power of two (128..4096) whose fp32 (chunk × vocab) logits take at most 128 MiB on "
        "CPU (512 for a 49k vocabulary, 128 for 152k), and on GPU 2% of the worker's memory, "
        "at most 1 GiB and 1,024 tokens (1,024 for 152k on an 80 GB GPU).",
    )


class ActorConfig(_Section):
    """How the HF model is loaded and run."""

    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="Compute dtype: auto = bf16 autocast on GPU, fp32 on CPU."
    )
    attn_implementation: str = Field(
        default="auto",
        description="HF attention: auto = flash_attention_2 if installed on GPU, else sdpa.",
    )
    gradient_checkpointing: Literal["auto"] | bool = Field(
        default="auto",
        description="Recompute activations in backward. auto: on when, without it, the "
        "memory available allows micro-batches of fewer than max(2 × longest episode, 2048) "
        "tokens.",
    )
    temperature: float = Field(
        default=1.0,
        gt=0.0,
        description="Sampling temperature; logits are divided by it. Unset in a run config: "
        "rollout.temperature (the trainer scores what vLLM sampled).",
    )
    fsdp: Literal["auto", "always"] = Field(
        default="auto",
        description="FSDP2 sharding: auto = when the process group has more than one worker; "
        "always = also with one worker (needs an initialized torch.distributed group).",
    )
    trust_remote_code: bool = Field(default=False, description="Passed to from_pretrained.")


class LoraConfig(_Section):
    """A LoRA adapter (Hu et al. 2021) trained over the frozen policy (needs ``agentrl[lora]``).

    Only the adapter (and a value head, if any) is trained; the reference policy for KL
    is the same model with the adapter switched off. With ``serve: adapter`` (default) the
    servers hot-load each new adapter version (megabytes per sync); with ``serve: merged``
    they receive the merged weights W + (alpha/rank)·BA, as with full fine-tuning.

    Example (YAML): ``trainer: {lora: {rank: 16, alpha: 32}}``
    """

    rank: _PositiveInt = Field(default=16, description="r: rank of the update BA.")
    alpha: float = Field(
        default=32.0, gt=0.0, description="α: the update is scaled by alpha / rank."
    )
    dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input (training)."
    )
    target_modules: Literal["all-linear"] | list[str] = Field(
        default="all-linear",
        description="Linear layers of the decoder that get an adapter: all-linear (every "
        "one: attention and MLP projections; never the lm_head) or names such as "
        "[q_proj, v_proj] (a name the model lacks is an error that lists the ones it has).",
    )
    init: Literal["default", "gaussian", "pissa"] = Field(
        default="default",
        description="Adapter initialization (peft's init_lora_weights): default: A Kaiming-"
        "uniform, B = 0 (the start equals the base); gaussian: A normal with std 1/r, B = 0; "
        "pissa: A, B from the top singular vectors of W (the base keeps "
        "the rest; slower start-up).",
    )
    serve: Literal["adapter", "merged"] = Field(
        default="adapter",
        description="How the inference servers get the policy: adapter = vLLM serves the "
        "base model with LoRA on (--enable-lora) and each sync hot-loads only the adapter "
        "as a new version (sync bytes = the adapter's); merged = each sync writes the "
        "whole merged model W + s·BA (on CPU serving with an adapter roughly halves "
        "decode speed, so merged can be the faster choice there). init: pissa needs merged.",
    )
    per_role: bool = Field(
        default=False,
        description="One adapter per role of the env (Env.roles, two or more) over one "
        "shared base: each role's turns are sampled from, credited to and trained into "
        "its own adapter; the reference for KL is still the base. Costs one policy "
        "forward per role on each micro-batch.",
    )
    roles: list[str] = Field(
        default_factory=list,
        description="The roles under per_role, filled from the env's Env.roles when a "
        "run starts; set it only for a Trainer used without a run.",
    )

    @field_validator("target_modules")
    @classmethod
    def _nonempty(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not v:
            raise ValueError("lora.target_modules is empty: list module names or 'all-linear'")
        return v

    @model_validator(mode="after")
    def _servable(self) -> LoraConfig:
        if self.init == "pissa" and self.serve == "adapter":
            raise ValueError(
                "lora.init: pissa changes the base weights, which vLLM serves unchanged "
                "under an adapter; set trainer.lora.serve: merged (or another init)"
            )
        return self


class DPOConfig(_Section):
    """Direct preference optimization (used when ``loss.name='dpo'``).

    Each step trains on pairs (chosen, rejected): the best and the worst episode of each
    group of the step's batch (by raw reward), and/or ``pairs_per_step`` pairs of the
    ``pairs`` file. The reference model is ``kl.ref_model_path`` or a frozen copy of the
    starting weights; ``kl.coef`` is not used.
    """

    beta: float = Field(
        default=0.1,
        gt=0.0,
        description="β: sigmoid: -log σ(β·h) (Rafailov et al. 2023 eq. 7); ipo: "
        "(h - 1/(2β))² (Azar et al. 2023). Also scales the logged implicit rewards.",
    )
    variant: Literal["sigmoid", "ipo"] = Field(
        default="sigmoid", description="sigmoid: DPO's loss; ipo: IPO's squared loss."
    )
    length_norm: bool = Field(
        default=False,
        description="Average log-prob per model token instead of the sum, for policy and "
        "reference alike (SimPO's length normalisation, Meng et al. 2024 eq. 4, with the "
        "reference kept).",
    )
    from_groups: bool = Field(
        default=True,
        description="Build one pair per group of the step's episodes (best vs worst reward; "
        "groups with one episode or no reward spread are skipped and counted).",
    )
    pairs: str | None = Field(
        default=None,
        description="A preference-pairs file (.jsonl/.json/.parquet; rows: prompt or "
        "messages, chosen, rejected as messages or strings, optional tools), tokenized with "
        "the model's chat template; loss on the assistant tokens only.",
    )
    pairs_per_step: int = Field(
        default=8,
        gt=0,
        description="Pairs taken from the ``pairs`` file each step (a seeded shuffle, cycled).",
    )


class CheckpointConfig(_Section):
    """Where and how checkpoints are kept."""

    dir: str | None = Field(default=None, description="Checkpoint root (step_N subdirectories).")
    keep_last: int = Field(default=2, ge=1, description="Checkpoints kept; older ones are deleted.")


class TrainerConfig(_Section):
    """Everything the trainer needs; sections nest."""

    seed: int = Field(default=0, description="Seeds torch/numpy/python and the mini-batch shuffle.")
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig, description="Advantages.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Critic (gae).")
    loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig, description="Policy loss.")
    kl: KLConfig = Field(default_factory=KLConfig, description="KL to the reference model.")
    correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig, description="Rollout correction."
    )
    shaping: ShapingConfig = Field(default_factory=ShapingConfig, description="Reward shaping.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer.")
    update: UpdateConfig = Field(default_factory=UpdateConfig, description="Batching of updates.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Model loading.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints."
    )
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="DPO settings (loss.name='dpo').")
    lora: LoraConfig | None = Field(
        default=None,
        description="Train a LoRA adapter over the frozen policy instead of every weight "
        "(None: full fine-tuning).",
    )
    cpus: list[int] = Field(
        default_factory=list,
        description="CPU ids the trainer computes on, with one torch thread per CPU; without "
        "rollout.cpus the whole training process (rollout driver, envs) is pinned to them. "
        "Empty: not pinned.",
    )
    worker: Literal["thread", "process"] = Field(
        default="thread",
        description="Where a local run's trainer computes: 'thread' (a thread of the training "
        "process) or 'process' (a child process of its own, with its own GIL: the event loop "
        "that drives the rollouts no longer holds up its Python work; it starts ~3 s slower "
        "and sends the weights to the servers through /dev/shm). Ray runs have trainer "
        "workers of their own and ignore it.",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.loss.agg == "seq-mean-token-sum-norm" and self.loss.loss_norm_constant is None:
            if self.shaping.max_response_tokens is None:
                raise ValueError(
                    "loss.agg 'seq-mean-token-sum-norm' (Dr. GRPO) needs a constant L: set "
                    "loss.loss_norm_constant or shaping.max_response_tokens (max response length)"
                )
            self.loss.loss_norm_constant = self.shaping.max_response_tokens
        if self.loss.name == "pg" and self.update.epochs * self.update.mini_batches != 1:
            raise ValueError(
                "loss 'pg' is on-policy: set update.epochs=1 and update.mini_batches=1"
            )
        if self.loss.name == "dpo" and not self.dpo.from_groups and self.dpo.pairs is None:
            raise ValueError("loss 'dpo' with dpo.from_groups=false needs a pairs file: dpo.pairs")
        return self

    @property
    def needs_ref(self) -> bool:
        """Whether a frozen reference model is loaded (KL, or DPO's reference)."""
        return self.kl.enabled or self.loss.name in PREFERENCE_LOSSES

    @property
    def uses_critic(self) -> bool:
        """Whether a value function is trained."""
        return self.advantage.estimator == "gae"
