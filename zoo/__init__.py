"""zoo: sequence models from recurrence to attention, with pretrained weights."""

from zoo.hub import Pretrained, load
from zoo.registry import list_models

__all__ = ["Pretrained", "list_models", "load"]
__version__ = "0.1.0"
