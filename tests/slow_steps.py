"""A callback that slows training down, so a test can interrupt a run partway (see test_training)."""

import time

from lightning.pytorch import Callback


class SlowSteps(Callback):
    """Sleeps `seconds` after every training batch."""

    def __init__(self, seconds: float = 0.2):
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)
