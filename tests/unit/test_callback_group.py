"""The template's callbacks run as one (project/toolkit/callbacks/group.py): each hook reaches the members that
override it, in their order; their state is saved and restored under each one's own key."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from project.toolkit.callbacks.group import CallbackGroup, each_callback, find_callback, grouped


class Counting(Callback):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls, self.state = name, calls, {"seen": 0}

    def on_train_batch_end(self, *args: Any) -> None:
        self.calls.append(self.name)
        self.state["seen"] += 1

    @property
    def state_key(self) -> str:
        return self.name

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = dict(state_dict)


class Quiet(Callback):
    """Overrides no hook: the group never calls it."""


def test_a_group_calls_each_hook_on_its_members_that_override_it_in_order() -> None:
    calls: list[str] = []
    group = CallbackGroup([Counting("a", calls), Quiet(), Counting("b", calls)])
    group.on_train_batch_end(None, None, None, None, 0)
    group.on_train_epoch_end(None, None)  # nobody's: nothing runs
    assert calls == ["a", "b"]
    assert [len(group._calls[hook]) for hook in ("on_train_batch_end", "on_train_epoch_end", "setup")] == [2, 0, 0]


def test_a_group_keeps_each_members_state_under_its_own_key() -> None:
    calls: list[str] = []
    saved = CallbackGroup([Counting("a", calls), Counting("b", calls)])
    saved.on_train_batch_end(None, None, None, None, 0)
    state = saved.state_dict()
    assert state == {"a": {"seen": 1}, "b": {"seen": 1}}
    restored = CallbackGroup([Counting("a", calls), Counting("b", calls)])
    restored.load_state_dict(state)
    assert [m.state for m in restored.members] == [{"seen": 1}, {"seen": 1}]


def test_grouped_gathers_the_kinds_where_the_first_stood_and_finds_them() -> None:
    calls: list[str] = []
    first, other, last = Counting("a", calls), Quiet(), Counting("b", calls)
    callbacks = grouped([other, first, Callback(), last], (Counting,))
    assert [type(c) for c in callbacks] == [Quiet, CallbackGroup, Callback]
    trainer = type("T", (), {"callbacks": callbacks})()
    assert list(each_callback(trainer))[1:3] == [first, last]
    assert find_callback(trainer, Counting) is first and find_callback(trainer, CallbackGroup) is None
