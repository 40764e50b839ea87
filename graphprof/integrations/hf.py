"""Profiling the steps of a Hugging Face ``Trainer`` in one line.

    import graphprof.integrations.hf as gp_hf
    profiler = gp_hf.profile_trainer(trainer)      # before trainer.train()
    trainer.train()
    print(profiler.get_profile().report())

``Trainer.training_step(model, inputs, num_items_in_batch)`` is the
forward and backward of one micro-batch; the Trainer clips gradients, steps
the optimizer and the scheduler, and zeroes gradients outside it. A
``TrainerCallback`` alone cannot profile it (callbacks never see the
trainer, only its state), so ``profile_trainer`` replaces the instance's
``training_step`` with a graphprof-traced one and registers a callback that
restores the original when training ends. What the step computes is what
eager execution computes: losses and parameters equal an unprofiled run
bitwise on CPU (graphprof's own rule, tested on a tiny GPT-2).

The profile records:

- the eager comparison: the first ``eager_steps`` training steps run the
  Trainer's own ``training_step`` eagerly and are timed (the first of them
  is cold and left out), then graphprof takes over;
- the workload: tokens (elements of ``input_ids``) and samples (its first
  dimension) of the last profiled micro-batch, for tokens/s and samples/s.

Keyword arguments go to ``graphprof.trace`` (``peaks=``, ``schedule=``,
``max_steps=``, ...). Gradient accumulation works: each micro-batch is one
call of the step.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import graphprof
from graphprof.profile.model import Profile
from graphprof.profile.step_facts import with_eager_times, with_workload

#: Eager training steps timed before graphprof takes over (the first is cold and left out).
DEFAULT_EAGER_STEPS = 3


def _batch_shape(inputs: Any) -> tuple[int | None, int | None]:
    """(tokens, samples) of a batch: ``input_ids`` elements and first dimension, when it has them."""
    ids = inputs.get("input_ids") if isinstance(inputs, dict) else None
    shape = getattr(ids, "shape", None)
    if ids is None or shape is None or len(shape) == 0:
        return None, None
    return int(ids.numel()), int(shape[0])


class TrainerProfiler:
    """The traced ``training_step`` of one Trainer, and its eager timings."""

    def __init__(self, trainer: Any, eager_steps: int = DEFAULT_EAGER_STEPS, **trace_options: Any) -> None:
        if eager_steps < 0:
            raise ValueError("eager_steps must be 0 or more")
        self.trainer = trainer
        self.eager_steps = eager_steps
        self._original: Callable[..., Any] = trainer.training_step
        self._eager_s: list[float] = []
        self._batch: tuple[int | None, int | None] = (None, None)
        original = self._original

        def training_step(model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            return original(model, inputs, num_items_in_batch)

        training_step.__name__ = f"{type(trainer).__name__}.training_step"
        self.traced = graphprof.trace(training_step, **trace_options)

    def __call__(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        self._batch = _batch_shape(inputs)
        if len(self._eager_s) < self.eager_steps:
            start = time.perf_counter()
            result = self._original(model, inputs, num_items_in_batch)
            self._eager_s.append(time.perf_counter() - start)
            return result
        return self.traced(model, inputs, num_items_in_batch)

    def install(self) -> "TrainerProfiler":
        """Route the trainer's training steps through graphprof until training ends."""
        from transformers import TrainerCallback

        profiler = self

        class _Restore(TrainerCallback):
            def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                profiler.uninstall()

        self.trainer.training_step = self
        self._callback: TrainerCallback | None = _Restore()
        self.trainer.add_callback(self._callback)
        return self

    def uninstall(self) -> None:
        """Give the trainer its own ``training_step`` back (the profile stays available)."""
        if self.trainer.__dict__.get("training_step") is self:
            del self.trainer.training_step
        callback = getattr(self, "_callback", None)
        if callback is not None:
            self.trainer.remove_callback(callback)
            self._callback = None

    def get_profile(self, all: bool = False) -> Any:
        """The profile of the traced steps (``all``: as ``TracedFunction.get_profile``), with eager times and workload."""
        found = self.traced.get_profile(all=all)
        return [self._annotate(p) for p in found] if isinstance(found, list) else self._annotate(found)

    def _annotate(self, profile: Profile) -> Profile:
        if self._eager_s:
            profile = with_eager_times(profile, self._eager_s, first_is_cold=True)  # type: ignore[assignment]  # dataclasses.replace keeps the subclass; typed in profile/
        tokens, samples = self._batch
        if tokens or samples:
            profile = with_workload(profile, tokens_per_step=tokens, samples_per_step=samples)  # type: ignore[assignment]  # dataclasses.replace keeps the subclass; typed in profile/
        return profile


def profile_trainer(trainer: Any, eager_steps: int = DEFAULT_EAGER_STEPS, **trace_options: Any) -> TrainerProfiler:
    """Profile ``trainer``'s training steps from the next ``trainer.train()``; returns the profiler."""
    return TrainerProfiler(trainer, eager_steps, **trace_options).install()
