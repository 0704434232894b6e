"""The ``agentrl`` command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from agentrl.cli.errors import cli_app_class

app = cli_app_class()(  # a plain typer.Typer whose app() prints user errors as one line
    name="agentrl",
    help="Reinforcement learning for multi-turn, tool-using LLM agents. "
    "A mistake in the input prints one line; --debug (anywhere) shows its traceback.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
doctor_app = typer.Typer(help="Check a tokenizer, an env or a config without running anything.")
sandbox_app = typer.Typer(help="Build and inspect sandbox images.")
app.add_typer(doctor_app, name="doctor")
app.add_typer(sandbox_app, name="sandbox")
console = Console(soft_wrap=not sys.stdout.isatty())  # piped: full lines, never wrapped


def _add_model_app() -> None:
    from agentrl.cli.export import export_cmd
    from agentrl.cli.model import model_app

    app.add_typer(model_app, name="model")
    app.command("export")(export_cmd)


_add_model_app()


def _fail(message: str) -> typer.Exit:
    from rich.markup import escape

    # The message is text: an error it quotes may hold "[...]" that is no markup.
    console.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code=2)


def _preset(config: str | None, items: list[str]) -> str | None:
    """``--config``, else the preset of the env the overrides name (``retool`` when none),
    if that env declares one (:attr:`agentrl.Env.preset`); a run of an own agent
    (``agent.solve``) starts from the built-in defaults."""
    if config is not None or any(i.startswith("agent.solve=") for i in items):
        return config
    import yaml

    from agentrl.config import RunConfig
    from agentrl.loading.envs import EnvNotFoundError, InvalidEnvError, env_preset

    env = RunConfig.model_fields["env"].default
    for item in items:  # the last env= wins, its value read as load_config reads it
        key, _, raw = item.partition("=")
        if key.strip() == "env":
            env = str(yaml.safe_load(raw)) if raw else ""
    try:
        path = env_preset(env)
    except (EnvNotFoundError, InvalidEnvError) as e:
        raise _fail(str(e)) from e
    return str(path) if path else None


def _next_steps(run_dir: Path) -> str:
    """What to do after a run: the commands that look at it, evaluate it, go further."""
    import yaml

    final = run_dir / "final_model"
    model = final if final.is_dir() else run_dir / "checkpoints" / "latest"
    try:
        env = str((yaml.safe_load((run_dir / "config.yaml").read_text()) or {})["env"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        env = "SPEC"
    return "\n".join(
        [
            "what next:",
            f"  agentrl view {run_dir}               one episode, token by token",
            f"  agentrl view {run_dir} --web         the trajectory inspector in a browser",
            f"  agentrl doctor run {run_dir}         red flags of the run's metrics",
            f"  agentrl eval --env {env} --model {model}   evaluate the trained model",
            "  agentrl train --config configs/retool-gpu.yaml   a 1.5B model on a GPU",
        ]
    )


def _load_tokenizer(model: str) -> Any:
    if model == "tiny":
        from agentrl.models.tokenizer import build_tokenizer

        return build_tokenizer()
    from agentrl.models.gguf import ModelImportError
    from agentrl.models.registry import resolve_model

    try:
        model = resolve_model(model)
    except ModelImportError as e:
        raise _fail(str(e)) from e
    path = Path(model)
    if not path.exists():
        raise _fail(f"model path {model!r} does not exist (give a directory with a tokenizer)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@app.command("envs")
def envs_cmd() -> None:
    """List the environments ``--env`` accepts by name."""
    from agentrl.loading.envs import list_envs

    for name in list_envs():
        console.print(name)


@doctor_app.command(
    "tokenizer",
    help="Check how the chat template can be trained on. Renders probe conversations (tool "
    "calls, tool results, reasoning, env feedback) and prints where the tokens the model saw "
    "differ from what the template renders at inference, the end-of-turn tokens, a capability "
    "line (tool schemas, calls, results, reasoning), the verdict and the training strategy "
    "(as_sampled or per_turn).\n\nExit status: 0 consistent; 1 not consistent (trained with "
    "the strategy shown, or refused when it says none); 3 could not check (no usable chat "
    "template); 2 bad arguments.",
)
def doctor_tokenizer(
    model: Annotated[
        str, typer.Option("--model", help="Model/tokenizer directory, or 'tiny' for the default.")
    ] = "tiny",
) -> None:
    """Check how the chat template can be trained on (verdict, strategy, capabilities)."""
    from agentrl.chat.templates import inspect_template

    report = inspect_template(_load_tokenizer(model))
    console.print(report.summary(), markup=False)
    raise typer.Exit(code=report.exit_code)


@doctor_app.command("env")
def doctor_env(
    env: Annotated[str, typer.Option("--env", help="Env name, pkg.module:Class or file.py:Class.")],
    task: Annotated[
        str | None,
        typer.Option(
            "--task", help='One task as reset gets it, a JSON object: \'{"prompt": "2+2"}\'.'
        ),
    ] = None,
    tasks: Annotated[
        str | None,
        typer.Option(
            "--tasks",
            help="Check every row of a task source, read as tasks= reads it (parquet/jsonl/json, "
            "a datasets directory, hf:PATH[:SPLIT]).",
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Check only the first N rows of --tasks.")
    ] = None,
) -> None:
    """Run ``agentrl.testing.check_env`` on an env: on its example task, one --task or every
    row of --tasks (the first bad row is named, with the field it lacks)."""
    import json

    from agentrl.env import provides
    from agentrl.errors import TaskSpecError
    from agentrl.loading.envs import EnvNotFoundError, InvalidEnvError, resolve_env
    from agentrl.loading.task_sources import read_task_source
    from agentrl.testing import EnvCheckError, check_env, check_env_on_tasks

    if task is not None and tasks is not None:
        raise _fail("give --task JSON or --tasks FILE, not both")
    try:
        cls = resolve_env(env)
        if task is None and tasks is None:
            check_env(cls)
            console.print(f"{env}: ok")
            return
        if task is not None:
            try:
                rows: list[Any] = [json.loads(task)]
            except json.JSONDecodeError as e:
                raise TaskSpecError(f"--task is not valid JSON ({e}): {task!r:.80}") from e
            if not isinstance(rows[0], dict):
                raise TaskSpecError(f"--task must be a JSON object, got {task!r:.80}")
            label = "--task"
        else:
            assert tasks is not None
            own = cls if provides(cls, "load_tasks") else None  # as a run reads tasks=
            rows, label = read_task_source(tasks, env_cls=own, limit=limit), f"tasks={tasks}"
        found = check_env_on_tasks(cls, rows, label=label)
    except (EnvNotFoundError, InvalidEnvError, EnvCheckError, TaskSpecError) as e:
        raise _fail(str(e)) from e
    for warning in found:
        console.print(f"warning: {warning}", markup=False)
    console.print(f"{env}: ok on {len(rows)} task{'s' * (len(rows) != 1)} ({label})", markup=False)


@app.command("train", context_settings={"allow_extra_args": False})
def train_cmd(
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Config overrides, e.g. trainer.optim.lr=1e-6 rollout.group_size=16."),
    ] = None,
    env: Annotated[
        str | None, typer.Option("--env", help="Env name, pkg.module:Class or file.py:Class.")
    ] = None,
    config: Annotated[str | None, typer.Option("--config", help="A YAML preset.")] = None,
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            help="Train your own agent: path/to/file.py:solve or pkg.module:solve "
            "(async def solve(task, client: openai.AsyncOpenAI) -> float | None).",
        ),
    ] = None,
    tasks: Annotated[
        str | None, typer.Option("--tasks", help="Task file (parquet/jsonl); sets tasks=FILE.")
    ] = None,
    resume: Annotated[
        str | None, typer.Option("--resume", help="Continue the run in this directory.")
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address", help="Place components on this Ray cluster ('auto', host:port)."
        ),
    ] = None,
) -> None:
    """Train a policy. With no arguments: SmolLM2-135M-Instruct on retool, on this CPU
    (the env's preset, configs/retool.yaml; --config replaces it)."""
    from agentrl.config import ConfigError
    from agentrl.orchestration.run import ComponentError, train_from_cli

    items = list(overrides or [])
    if env:
        items.append(f"env={env}")
    if agent:
        items.append(f"agent.solve={agent}")
    if tasks:
        items.append(f"tasks={tasks}")
    if ray_address:
        items.append(f"ray.address={ray_address}")
    config = _preset(config, items) if resume is None else config
    try:
        result = train_from_cli(config, items, resume, lambda m: console.print(m, markup=False))
    except ConfigError as e:
        raise _fail(str(e)) from e
    except ComponentError as e:
        raise _fail(str(e)) from e
    if result.eval_after:
        console.print(eval_summary(result.eval_before, result.eval_after, result.steps_done))
    if result.early_stop:
        console.print(f"stopped early: {result.early_stop}", markup=False)
    console.print(f"run directory: {result.run_dir}", markup=False)
    if not result.interrupted:
        console.print(_next_steps(Path(result.run_dir)), markup=False)


def eval_summary(before: dict[str, float], after: dict[str, float], steps: int) -> str:
    """The run's closing line on held-out success (a resumed run has no "before"; an
    evaluation whose episodes were all discarded is "not measured", never 0.000)."""
    from agentrl.reporting.discards import held_out_line

    return held_out_line(before, after, steps)


@app.command("eval")
def eval_cmd(
    overrides: Annotated[list[str] | None, typer.Argument(help="Config overrides.")] = None,
    env: Annotated[str | None, typer.Option("--env", help="Env spec.")] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model directory or name (default: the env's preset's)."),
    ] = None,
    config: Annotated[str | None, typer.Option("--config", help="A YAML preset.")] = None,
    k: Annotated[int, typer.Option("--k", help="Episodes per task (pass@k).")] = 1,
) -> None:
    """Evaluate a model on an env's held-out tasks: success rate, pass@k, mean reward."""
    import asyncio

    from agentrl.config import ConfigError, load_config
    from agentrl.orchestration.run import ComponentError, evaluate_model

    items = list(overrides or [])
    items += [f"env={env}"] if env else []
    items += [f"model.path={model}"] if model else []
    items += [f"eval.samples_per_task={k}"]
    config = _preset(config, items)
    try:
        cfg = load_config(config, items)
        res = asyncio.run(evaluate_model(cfg, say=lambda m: console.print(m, markup=False)))
    except (ConfigError, ComponentError) as e:
        raise _fail(str(e)) from e
    for key, value in res.items():
        console.print(f"{key}: {value:.4g}")


@app.command("view")
def view_cmd(
    run_dir: Annotated[str, typer.Argument(help="A run directory.")],
    step: Annotated[int | None, typer.Option(help="Step to show (default: the last).")] = None,
    episode: Annotated[int, typer.Option(help="Index of the episode in that step.")] = 0,
    web: Annotated[
        bool,
        typer.Option(
            "--web",
            help="Serve the trajectory inspector, a local web page of the whole run (episodes "
            "filterable by step, reward, stop reason and task; tokens coloured by loss mask "
            "and rollout probability; tool calls, turn rewards; charts of the step metrics) "
            "until Ctrl-C. --step and --episode choose the episode it opens on.",
        ),
    ] = False,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="--web: port (0: a free one).")
    ] = 8765,
    host: Annotated[
        str, typer.Option("--host", help="--web: address to listen on (local only by default).")
    ] = "127.0.0.1",
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="--web: model directory whose tokenizer turns token ids into text, or 'tiny' "
            "(default: the run's final_model/, else its model.path, else the tiny model's).",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="AGENTRL_INSPECTOR_TOKEN",
            show_envvar=True,
            help="--web: secret every request must carry (open the page once with "
            "?token=SECRET; a cookie keeps it). Required with a --host other machines can "
            "reach.",
        ),
    ] = None,
) -> None:
    """Show one recorded episode: messages, reasoning, reward, stop, tokens, strategy.

    With --web, serve the trajectory inspector for the whole run instead.
    """
    if web:
        _view_web(
            run_dir, step, episode if step is not None else None, port, host, tokenizer, token
        )
        return
    from agentrl.reporting.run_dir import read_trajectories

    files = sorted(Path(run_dir, "trajectories").glob("step_*.parquet"))
    if not files:
        raise _fail(f"no trajectories in {run_dir}")
    path = files[-1] if step is None else Path(run_dir, "trajectories", f"step_{step:06d}.parquet")
    if not path.exists():
        raise _fail(f"no trajectories for step {step} in {run_dir}")
    trajs = read_trajectories(path)
    if not 0 <= episode < len(trajs):
        raise _fail(f"{path.name} has {len(trajs)} episodes")
    t = trajs[episode]
    console.print(
        f"{path.name} episode {episode}/{len(trajs)}: task {t.task_id} reward {t.reward} "
        f"stop {t.stop_reason} turns {t.num_turns} tokens {len(t)} (model {t.num_model_tokens})",
        markup=False,
    )
    samples = f" ({len(t.samples())} samples)" if t.strategy == "per_turn" else ""
    console.print(f"strategy {t.strategy}{samples}", markup=False)
    for m in t.messages:
        calls = "".join(f"\n  -> {c.name}({c.arguments})" for c in m.tool_calls)
        if m.reasoning:
            console.print(f"[{m.role} reasoning] {m.reasoning}", markup=False)
        console.print(f"[{m.role}] {m.content}{calls}", markup=False)
    if t.error:
        console.print(f"error: {t.error}", markup=False)


def _view_web(
    run_dir: str,
    step: int | None,
    episode: int | None,
    port: int,
    host: str,
    tok: str | None,
    token: str | None = None,
) -> None:
    from urllib.parse import urlencode

    from agentrl.inspector import (
        NotARunDirError,
        RunData,
        ServeError,
        TokenizerNotFoundError,
        bind,
        create_app,
        find_decoder,
        serve,
    )
    from agentrl.inspector.serve import TokenGate, check_host

    try:
        check_host(host, token)
        run = RunData(run_dir)
        sock = bind(host, port)
    except (NotARunDirError, ServeError) as e:
        raise _fail(str(e)) from e
    try:
        decoder, note = find_decoder(run.path, tok)
    except (TokenizerNotFoundError, OSError, ValueError) as e:
        sock.close()
        raise _fail(str(e)) from e
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    query: dict[str, str] = {"step": str(step)} if step is not None else {}
    if step is not None and episode is not None:
        query["episode"] = f"{step}-{episode}"
    url = f"http://{shown}:{bound}/" + (f"?{urlencode(query)}" if query else "")
    console.print(f"inspector for {run.path} at {url}", markup=False, soft_wrap=True)
    console.print(f"{note}; Ctrl-C stops it", markup=False, soft_wrap=True)
    web_app = create_app(run, decoder, note)
    if token:
        web_app.add_middleware(TokenGate, token=token)
        console.print(
            "every request needs the token: open the page once with token=SECRET added to "
            "its query (a cookie keeps it)",
            markup=False,
        )
    serve(web_app, sock, on_stop=lambda: console.print("inspector stopped"))


@app.command("sft")
def sft_cmd(
    from_dir: Annotated[
        str, typer.Option("--from", help="A run directory written by agentrl train.")
    ],
    min_reward: Annotated[
        float, typer.Option("--min-reward", help="Keep episodes with reward >= this.")
    ] = 1.0,
    output: Annotated[
        str | None, typer.Option("--output", help="Model directory (default RUN_DIR/sft_model).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model to fine-tune (default: the run's model.path)."),
    ] = None,
    epochs: Annotated[int, typer.Option("--epochs", min=1, help="Passes over the episodes.")] = 1,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Episodes per optimizer step.")
    ] = 8,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate.")] = 1e-5,
) -> None:
    """Rejection-sampling fine-tuning: train on the model tokens of a run's good episodes."""
    from agentrl.orchestration.rft import SFTError, run_sft

    try:
        res = run_sft(
            from_dir, min_reward=min_reward, output_dir=output, model=model, epochs=epochs,
            batch_size=batch_size, lr=lr, say=lambda m: console.print(m, markup=False),
        )  # fmt: skip
    except SFTError as e:
        raise _fail(str(e)) from e
    console.print(
        f"trained on {res.episodes_kept} of {res.episodes_total} episodes, {res.steps} steps "
        f"(nll {res.nll_first:.4f} → {res.nll_last:.4f}); model: {res.output_dir}",
        markup=False,
    )


@app.command("make-tiny-model")
def make_tiny_model(
    seed: Annotated[int, typer.Option(help="Seed of the tokenizer, init and SFT data.")] = 0,
) -> None:
    """Build (or find in the cache) the tiny default model and print its directory."""
    from agentrl.models.tiny import TinyRecipe, ensure_tiny_model

    console.print(str(ensure_tiny_model(TinyRecipe(seed=seed))))


@sandbox_app.command("build")
def sandbox_build(
    name: Annotated[str, typer.Argument(help="Image recipe under sandboxes/ (e.g. python).")],
    force: Annotated[bool, typer.Option(help="Rebuild even if the recipe is unchanged.")] = False,
) -> None:
    """Build a sandbox image (cached by its recipe's hash)."""
    from agentrl.sandbox.images import ImageBuildError, build_image

    try:
        console.print(build_image(name, force=force))
    except ImageBuildError as e:
        raise _fail(str(e)) from e


@doctor_app.command("config")
def doctor_config(
    overrides: Annotated[list[str] | None, typer.Argument(help="Config overrides.")] = None,
    config: Annotated[str | None, typer.Option("--config", help="A YAML preset.")] = None,
    env: Annotated[
        str | None, typer.Option("--env", help="Env name, pkg.module:Class or file.py:Class.")
    ] = None,
) -> None:
    """Validate a config (preset + overrides) and print it resolved: with no --config, the
    preset of the env the overrides name (what `agentrl train` would run)."""
    import yaml

    from agentrl.config import ConfigError, load_config

    items = list(overrides or []) + ([f"env={env}"] if env else [])
    config = _preset(config, items)
    try:
        cfg = load_config(config, items)
    except ConfigError as e:
        raise _fail(str(e)) from e
    console.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), markup=False)


@doctor_app.command("run")
def doctor_run(
    run_dir: Annotated[str, typer.Argument(help="A run directory (with metrics.jsonl).")],
) -> None:
    """Red flags of a run's dashboard, each with the step it began, failure mode and levers.

    Exit code 1 when there is a red flag, 0 when there is none.
    """
    from agentrl.reporting.doctor import diagnose, read_metrics, unchecked

    try:
        rows = read_metrics(run_dir)
    except (FileNotFoundError, ValueError) as e:
        raise _fail(str(e)) from e
    flags = diagnose(rows)
    steps = sum(1 for r in rows if r.get("kind", "train") == "train")
    for f in flags:
        console.print(f.render(), markup=False)
    console.print(f"{run_dir}: {steps} steps, {len(flags)} red flag(s)", markup=False)
    if missing := unchecked(rows):
        console.print(f"not checked (metrics absent): {', '.join(missing)}", markup=False)
    if flags:
        raise typer.Exit(code=1)


@doctor_app.command("reward")
def doctor_reward(
    env: Annotated[str, typer.Option("--env", help="Env name, pkg.module:Class or file.py:Class.")],
    tasks: Annotated[
        str | None, typer.Option("--tasks", help="Task file (default: the env's own tasks).")
    ] = None,
    n: Annotated[int, typer.Option("--n", min=1, help="Tasks to probe.")] = 3,
    answer_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="How an answer is written, with ANSWER in it, e.g. '\\boxed{ANSWER}' for retool.",
        ),
    ] = "ANSWER",
    env_kwargs: Annotated[
        str, typer.Option("--env-kwargs", help="JSON object of env constructor arguments.")
    ] = "{}",
) -> None:
    """Pre-flight check of an env's scorer: what do an empty, a one-token, a format-only and
    a correct answer (alone and buried in padding) score? Exit code 1 on a red flag."""
    import asyncio
    import json

    from agentrl.env import provides
    from agentrl.loading.envs import EnvNotFoundError, InvalidEnvError, resolve_env
    from agentrl.loading.task_files import read_rows
    from agentrl.testing.reward_probe import probe_reward

    try:
        cls = resolve_env(env)
        kwargs = json.loads(env_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError(f"--env-kwargs must be a JSON object, got {env_kwargs!r}")
        if tasks:
            own = provides(cls, "load_tasks")
            rows = list(cls.load_tasks(tasks) if own else [r for _, r in read_rows(tasks)])
        elif provides(cls, "default_tasks"):
            rows = list(cls.default_tasks(split="test", n=n, seed=0))
        elif provides(cls, "example_task"):
            rows = [cls(**kwargs).example_task()]
        else:
            raise ValueError(f"env {env!r} has no built-in tasks: give --tasks FILE")
        report = asyncio.run(probe_reward(cls, rows[:n], env_kwargs=kwargs,
                                          answer_format=answer_format))  # fmt: skip
    except (EnvNotFoundError, InvalidEnvError, ValueError, OSError) as e:
        raise _fail(str(e)) from e
    console.print(report.summary(), markup=False)
    if report.flags:
        raise typer.Exit(code=1)


def main() -> None:
    from agentrl.cli.errors import run_cli

    run_cli(app)  # user errors as one line (--debug: traceback); SIGTERM unwinds cleanly


if __name__ == "__main__":
    main()
