"""Does bf16 autocast train like fp32 on this CPU, and how much faster is it?

Trains the same recipe twice from the same seed, once per precision, for a fixed number of steps,
and prints wall time, tokens/s and the validation loss of each side by side:

    python benchmarks/bf16_convergence.py --recipe gru_lm_small.shakespeare_char --steps 300
"""

import argparse
import time

import lightning as L
import yaml

from zoo.cli import resolve_recipe
from zoo.data import LMDataModule
from zoo.lit import CausalLMModule


def train(recipe: dict, precision: str, steps: int, val_batches: int) -> dict:
    L.seed_everything(recipe.get("seed_everything", 0), verbose=False)
    data_args = recipe["data"]["init_args"]
    datamodule = LMDataModule(**data_args)
    module = CausalLMModule(**{**recipe["model"]["init_args"], "warmup_steps": min(100, steps // 10)})
    trainer = L.Trainer(accelerator="cpu", devices=1, precision=precision, max_steps=steps,
                        limit_val_batches=val_batches, val_check_interval=steps, check_val_every_n_epoch=None,
                        gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    seconds = time.perf_counter() - start
    tokens = steps * data_args["batch_size"] * data_args["seq_len"]
    return {"seconds": seconds, "tokens_per_s": tokens / seconds, "val_loss": float(trainer.callback_metrics["val_loss"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="gru_lm_small.shakespeare_char")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--val_batches", type=int, default=20)
    args = parser.parse_args()
    with open(resolve_recipe(args.recipe)) as handle:
        recipe = yaml.safe_load(handle)
    results = {precision: train(recipe, precision, args.steps, args.val_batches) for precision in ("32-true", "bf16-mixed")}
    print(f"{args.recipe}, {args.steps} steps, same seed and data")
    print(f"{'precision':<12}{'wall s':>10}{'tokens/s':>12}{'val loss':>10}")
    for precision, r in results.items():
        print(f"{precision:<12}{r['seconds']:>10.1f}{r['tokens_per_s']:>12.0f}{r['val_loss']:>10.4f}")
    speedup = results["32-true"]["seconds"] / results["bf16-mixed"]["seconds"]
    print(f"bf16 speed-up: {speedup:.2f}x; val loss difference: "
          f"{results['bf16-mixed']['val_loss'] - results['32-true']['val_loss']:+.4f} nats")


if __name__ == "__main__":
    main()
