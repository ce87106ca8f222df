"""A Lightning callback that sends ddprun progress beacons.

    from ddprun.lightning import ProgressCallback

    trainer = Trainer(callbacks=[ProgressCallback()])

Every training batch reports trainer.global_step together with the time this
rank spent on its own work (loading the batch and the forward pass; the
backward pass, where DDP waits for the other ranks, is left out). Validation
batches report the same step, which shows the job is alive. Setup and
checkpoint saving and loading announce a phase, which may be slow.

The callback subclasses the Callback of lightning.pytorch and of
pytorch_lightning, whichever are installed; with neither, it is a plain class
whose hook methods can still be called.
"""

import importlib
import time

import ddprun

__all__ = ["ProgressCallback"]


def _callback_bases():
    bases = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            base = importlib.import_module(name).Callback
        except Exception:
            continue
        if isinstance(base, type) and base not in bases:
            bases.append(base)
    return bases


def _make_class(bases):
    # Both packages' Callback, when both are installed, so that either Trainer
    # accepts the callback; a combination that cannot be made falls back.
    namespace = {"__module__": __name__, "__doc__": _ProgressHooks.__doc__}
    for extra in (tuple(bases), tuple(bases[:1]), ()):
        try:
            return type("ProgressCallback", (_ProgressHooks,) + extra, namespace)
        except TypeError:
            continue
    return _ProgressHooks


def _global_step(trainer):
    step = getattr(trainer, "global_step", None)
    return step if isinstance(step, int) else None


class _ProgressHooks(object):
    """Lightning callback: sends ddprun progress beacons.

        trainer = Trainer(callbacks=[ProgressCallback()])
    """

    def __init__(self):
        super().__init__()
        self._last_batch_end = None  # perf_counter() at the previous train batch end
        self._segment_start = None  # start of the forward pass now running
        self._busy_s = 0.0
        self._backward_seen = False

    def _forget_batch_end(self):
        # Time since the last batch end that was spent elsewhere (validation,
        # a checkpoint, the end of an epoch) is not data loading.
        self._last_batch_end = None

    def setup(self, trainer, pl_module, stage):
        self._forget_batch_end()
        ddprun.phase("setup")

    def on_train_epoch_start(self, trainer, pl_module):
        self._forget_batch_end()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        try:
            now = time.perf_counter()
            # Loading this batch is this rank's own work.
            self._busy_s = 0.0 if self._last_batch_end is None else now - self._last_batch_end
            self._segment_start = now
            self._backward_seen = False
        except Exception:
            pass

    def on_before_backward(self, trainer, pl_module, loss):
        try:
            if self._segment_start is not None:
                # The forward pass is this rank's own work; the backward pass
                # includes DDP's wait for the gradients of the other ranks.
                self._busy_s += time.perf_counter() - self._segment_start
                self._segment_start = None
            self._backward_seen = True
        except Exception:
            pass

    def on_after_backward(self, trainer, pl_module):
        # With several backward passes in one batch, the next forward starts here.
        self._segment_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        try:
            busy = self._busy_s if self._backward_seen else None
            self._segment_start = None
            ddprun.progress(_global_step(trainer), busy)
            self._last_batch_end = time.perf_counter()
        except Exception:
            pass

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                                dataloader_idx=0):
        self._forget_batch_end()
        ddprun.progress(_global_step(trainer), None)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._forget_batch_end()
        ddprun.phase("save_checkpoint")

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        self._forget_batch_end()
        ddprun.phase("load_checkpoint")


ProgressCallback = _make_class(_callback_bases())
