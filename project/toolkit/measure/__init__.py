"""The one measuring core of the template: device clocks and memory (:mod:`.devices`), statistics
(:mod:`.stats`), tables (:mod:`.tables`), each rank's records and their summary (:mod:`.recorders`,
:mod:`.summary`), where a figure was taken (:mod:`.environment`), how much work it stands for
(:mod:`.flops`), per-step stamps for the benchmarks (:mod:`.stamps`), where a training step's time goes
(:mod:`.anatomy`, with the per-strategy probes of :mod:`.probes` and the pipeline's :mod:`.bubble`), what the
network weighs (:mod:`.network`) and the link between processes (:mod:`.link`). The timing callback,
``python -m project bench`` and the benchmarks under ``benchmarks/`` all measure through these
modules, so they agree on what a number means. Importing this package is cheap: each module imports
only what it needs."""
