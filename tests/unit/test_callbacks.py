"""Pure functions of the callbacks, on known inputs."""

from __future__ import annotations

from project.toolkit.callbacks.guards import out_of_memory_message
from project.toolkit.timing.report import format_duration


def test_durations_read_as_a_person_says_them() -> None:
    assert [format_duration(s) for s in (20, 150, 5400, 150.0 + 60 * 60)] == [
        "20 s",
        "3 min",
        "1 h 30 min",
        "1 h 3 min",
    ]


def test_out_of_memory_is_one_line_with_what_to_lower_and_other_errors_are_not() -> None:
    host = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:121] . DefaultCPUAllocator: can't allocate memory: you tried to allocate "
        "30000000000 bytes. Error code 12"
    )
    assert out_of_memory_message(host) == (
        "out of host memory: the run tried to allocate 30.0 GB more; lower --data.batch_size or --data.image_size"
    )
    device = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)")
    line = out_of_memory_message(device, {"batch_size": 256, "image_size": 112})
    assert line.startswith("out of CUDA device memory: the run tried to allocate 2.00 GiB more; lower ")
    assert "--data.batch_size (now 256)" in line and "--data.image_size (now 112)" in line
    assert out_of_memory_message(RuntimeError("Connection reset by peer")) is None
