"""Lightning calls every per-batch hook of every callback at every batch, the ones that do nothing too: for
each, a lookup and a profiler context (PassThroughProfiler's, even with no profiler). With the template's
default callbacks that is 102 calls per training step, 10 of them with work, and 20 per test batch, 4 with
work (Lightning 2.6); the idle ones cost about 0.02 ms per test batch on a 2-core CPU (hand check, a small
network's test run with this callback on and off, alternated).

Lightning skips a callback's hook that is not callable (``lightning.pytorch.trainer.call``), so
:class:`SkipIdleHooks` sets the per-batch hooks a callback's class leaves as :class:`Callback`'s no-op to
``None`` on the callback for the run, and puts them back at its end. A hook the class overrides, or that was
set on the callback itself, is never touched: whatever has work runs as before. Only callbacks: Lightning
reads the signatures of the LightningModule's batch hooks when a loop starts, so the module's stay.
"""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer

# The hooks Lightning calls per batch or per optimizer step; on Callback each does nothing and returns None,
# so skipping one where a callback's class does not override it changes nothing.
PER_BATCH_HOOKS = (
    *(f"on_{stage}_batch_{when}" for stage in ("train", "validation", "test", "predict") for when in ("start", "end")),
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)


def idle_hooks(callback: Callback) -> list[str]:
    """The :data:`PER_BATCH_HOOKS` that ``callback`` leaves as :class:`Callback`'s no-op."""
    return [
        name
        for name in PER_BATCH_HOOKS
        if getattr(type(callback), name) is getattr(Callback, name) and name not in vars(callback)
    ]


class SkipIdleHooks(Callback):
    """For the run, Lightning skips the per-batch hooks no callback has work in (see the module's notes);
    the callbacks get them back when the run ends."""

    def __init__(self) -> None:
        self._skipped: list[tuple[Callback, list[str]]] = []

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # At setup every callback of the run is in place: the Trainer's, the CLI's and the module's own
        # (configure_callbacks), which Lightning adds before it calls setup.
        for callback in trainer.callbacks:
            names = idle_hooks(callback)
            for name in names:  # (Lightning itself sets attributes on every callback: each takes new ones)
                setattr(callback, name, None)
            self._skipped.append((callback, names))

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore()  # Lightning calls no teardown hook after an exception

    def _restore(self) -> None:
        for callback, names in self._skipped:
            own = vars(callback)
            for name in names:
                if name in own and own[name] is None:  # not a hook the callback has set on itself since
                    del own[name]
        self._skipped = []
