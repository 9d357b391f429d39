"""zoo: sequence models from recurrence to attention, with pretrained weights."""

from zoo.generation import generate, stream
from zoo.hub import Pretrained, load
from zoo.registry import list_models

__all__ = ["Pretrained", "generate", "stream", "lightning_module", "list_models", "load"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # `zoo.lightning_module` imports Lightning, so it is loaded on first use, not by `import zoo`.
    if name == "lightning_module":
        from zoo.finetune import lightning_module

        return lightning_module
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
