"""Strategies Lightning 2 lacks or refuses on CPUs, one module each: ``dp`` and ``dp_balanced`` (:mod:`.dp`), ``fsdp``
as FSDP2 (:mod:`.fsdp`), ``pipeline`` (:mod:`.pipeline`), XLA without a TPU (:mod:`.xla`), DeepSpeed's refusal off CUDA
(:mod:`.deepspeed`); their names (:mod:`.registry`); what they need of a module (:mod:`.contract`); the pipeline's
stages (:mod:`.stages`, :mod:`.balance`). The blocks a network declares: :mod:`project.toolkit.blocks`."""
