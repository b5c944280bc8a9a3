"""The template's callbacks, one module per concern: :mod:`.checkpoints` (atomic writes, signals, the
final checkpoint, checks and lookup), :mod:`.guards` (non-finite loss, a lost rank), :mod:`.timing`,
:mod:`.reproducibility` and :mod:`.predictions`. The CLI turns each on by default (see
``configs/default.yaml``)."""
