"""Everything ``timing.json`` holds, measured without slowing what it measures: the callback (:mod:`.callback`) and
its report (:mod:`.report`, :mod:`.table`); the clocks (:mod:`.clocks`) and each rank's records (:mod:`.records`); where
a step's time goes (:mod:`.anatomy`, :mod:`.probes`, the pipeline's :mod:`.bubble`); the work done (:mod:`.flops`,
:mod:`.network`) against a GPU's peaks (:mod:`.peaks`); the machine (:mod:`.environment`). :mod:`.step_profile` is the
profiler a user adds to a run."""
