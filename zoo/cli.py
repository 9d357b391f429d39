"""The `zoo` command: `zoo fit|validate|test --config RECIPE` (LightningCLI) and tool commands.

Each tool command is a typed function whose docstring is its `--help` (jsonargparse).
"""

import difflib
import importlib
import os
import sys
from pathlib import Path

# command -> "module:function"; imported only when the command runs.
COMMANDS = {
    "list": "zoo.registry:list_command",
    "download": "zoo.hub:download_command",
    "push": "zoo.hub:push_command",
    "finetune": "zoo.finetune:finetune_command",
    "export": "zoo.export:export_command",
    "card": "zoo.cards:card_command",
    "golden": "zoo.export:golden_command",
    "evaluate": "zoo.eval.runner:evaluate_command",
    "leaderboard": "zoo.eval.leaderboard:leaderboard_command",
    "generate": "zoo.generation:generate_command",
    "translate": "zoo.translate:translate_command",
    "bench": "zoo.generation:bench_command",
}
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def resolve_recipe(value: str) -> str:
    """A recipe path, or a recipe name such as `gru_lm_small.shakespeare_char` under `configs/`."""
    path = Path(value)
    if path.is_file():
        return str(path)
    for candidate in (CONFIG_DIR / value, CONFIG_DIR / f"{value}.yaml"):
        if candidate.is_file():
            return str(candidate)
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    close = difflib.get_close_matches(path.stem, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise SystemExit(f"zoo: no recipe {value!r}{hint} (recipes: {', '.join(names)})")


def lightning_main(argv: list[str]) -> None:
    """Run LightningCLI with the zoo's modules; recipes name them by class path."""
    from lightning.pytorch.cli import LightningCLI

    import lightning as L

    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            argv[i + 1] = resolve_recipe(argv[i + 1])
        elif arg.startswith("--config="):
            argv[i] = "--config=" + resolve_recipe(arg.split("=", 1)[1])
    LightningCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=argv,
        save_config_kwargs={"overwrite": True},
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: zoo COMMAND [options]\n\ncommands:")
        for name in (*LIGHTNING_COMMANDS, *COMMANDS):
            print(f"  {name}")
        print("\n`zoo COMMAND --help` describes each.")
        return
    command, rest = argv[0], argv[1:]
    if command in LIGHTNING_COMMANDS:
        return lightning_main([command, *rest])
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, [*LIGHTNING_COMMANDS, *COMMANDS], n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise SystemExit(f"zoo: unknown command {command!r}{hint} (see 'zoo --help')")
    module, function = COMMANDS[command].split(":")
    from jsonargparse import CLI

    command_function = getattr(importlib.import_module(module), function)
    rest = getattr(command_function, "prepare_args", list)(rest)  # e.g. an optional positional
    try:
        CLI(command_function, args=rest, prog=f"zoo {command}")
    except BrokenPipeError:
        # The reader went away (`zoo generate ... | head`): stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        raise SystemExit(141) from None  # 128 + SIGPIPE, what a shell reports for such a pipeline


if __name__ == "__main__":
    main()
