"""The zoo's language models as an lm-evaluation-harness model, registered as `zoo`.

    pip install -e ".[lm-eval]"
    python -m zoo.eval.lm_eval_model --model zoo --model_args name=gru_lm_small.shakespeare_char --tasks ...

`python -m zoo.eval.lm_eval_model` is lm-eval's own command line with this module imported, so
`--model zoo` resolves. lm-eval releases that discover plugins through the `lm_eval.models`
entry point (declared in pyproject.toml) accept `lm_eval --model zoo` directly. From Python:

    import lm_eval
    from zoo.eval.lm_eval_model import ZooLM
    lm_eval.simple_evaluate(model=ZooLM(name="gru_lm_small.shakespeare_char"), tasks=[...])
"""

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from zoo.eval.adapter import ZooLMAdapter


@register_model("zoo")
class ZooLM(LM):
    """lm-eval's `LM` around `ZooLMAdapter`.

    Args:
        name: a zoo model name or folder (`pretrained` is accepted as an alias).
        batch_size: requests per forward; "auto" is taken as 8.
        device: "cpu" (default) or e.g. "cuda"; cuda on a machine without it falls back to cpu.
        stride: transformer sliding-window stride for rolling log-likelihoods.
        max_gen_toks: default generation length.
    """

    def __init__(self, name: str | None = None, pretrained: str | None = None, batch_size=8, device: str | None = None,
                 stride: int | None = None, max_gen_toks: int = 256, max_batch_size=None, **unused):
        super().__init__()
        name = name or pretrained
        if not name:
            raise ValueError("no zoo model given; pass --model_args name=MODEL (a name from 'zoo list' or a folder)")
        batch_size = 8 if str(batch_size).startswith("auto") else int(batch_size)
        if not device or (device.startswith("cuda") and not torch.cuda.is_available()):
            device = "cpu"  # lm-eval's command line asks for cuda by default
        self.adapter = ZooLMAdapter.from_pretrained(name, device=device, batch_size=batch_size,
                                                    stride=int(stride) if stride else None,
                                                    max_gen_toks=int(max_gen_toks))
        self.name = name

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self.adapter.loglikelihood([request.args for request in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        return self.adapter.loglikelihood_rolling([request.args[0] for request in requests])

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        return self.adapter.generate_until([request.args for request in requests])

    def get_model_info(self) -> dict:
        return {"model_name": self.name}


def main() -> None:
    """lm-eval's command line, with the `zoo` model registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
