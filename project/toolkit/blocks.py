"""The blocks ``fsdp`` (one unit each) and ``pipeline`` (stages of consecutive ones) split a network into:
``(name, module)`` pairs of the network's own submodules, in forward order, covering every parameter."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from project.toolkit.errors import ProjectError

DOCS = "docs/strategies.md#what-a-network-declares"


@dataclass(frozen=True, eq=False)
class Block:
    """One declared block; ``paths``: the network's outermost submodules it holds, named as in the network."""

    name: str
    module: nn.Module
    paths: tuple[str, ...]

    @property
    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.module.parameters())


def default_blocks(net: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The network's own ``network_blocks()``, else an ``nn.Sequential``'s children; None if it declares nothing."""
    own = getattr(net, "network_blocks", None)
    if callable(own):
        return list(own())
    return list(net.named_children()) if isinstance(net, nn.Sequential) else None


def checked_blocks_or_none(module: nn.Module) -> list[Block] | None:
    """The checked blocks of ``module``'s network, or None (not declared, or wrongly), for a measurement."""
    with contextlib.suppress(ProjectError):
        if isinstance(getattr(module, "net", None), nn.Module):
            return module_blocks(module, "fsdp")
    return None


def module_blocks(module: nn.Module, strategy_name: str) -> list[Block]:
    """The checked blocks of ``module.net``; one ``error:`` line naming ``strategy_name`` if none or wrong."""
    net, declare = module.net, getattr(module, "network_blocks", None)  # the module's own, else its net's
    declared = declare() if callable(declare) else default_blocks(net)
    if declared is None:
        raise ProjectError(
            f"--trainer.strategy={strategy_name} splits the network into blocks, and {type(net).__name__} declares "
            "none: make it an nn.Sequential, or give it a method network_blocks() returning [(name, module), ...] "
            f"in forward order ({DOCS}); or use ddp, which needs nothing"
        )
    return as_blocks(net, declared, strategy_name)


def as_blocks(net: nn.Module, declared: Iterable[tuple[str, nn.Module]], strategy_name: str = "fsdp") -> list[Block]:
    """``declared`` as :class:`Block` objects; refused if malformed, a name repeats, a parameter is a copy or shared."""
    where = f"--trainer.strategy={strategy_name}: the blocks {type(net).__name__} declares"
    pairs = list(declared)
    if not pairs or not all(
        isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], nn.Module)
        for pair in pairs
    ):
        raise ProjectError(f"{where} must be a non-empty list of (name, nn.Module) pairs ({DOCS})")
    names = [name for name, _ in pairs]
    if repeated := sorted({name for name in names if names.count(name) > 1 or not name}):
        raise ProjectError(f"{where} need distinct, non-empty names; repeated or empty: {repeated}")
    network_parameters = {id(p): name for name, p in net.named_parameters()}
    owner: dict[int, str] = {}
    for name, block in pairs:
        for p in block.parameters():
            if id(p) not in network_parameters:
                raise ProjectError(
                    f"{where}: {name!r} holds a parameter that is not the network's (a copy?); "
                    "a block must be made of the network's own submodules"
                )
            if owner.setdefault(id(p), name) != name:
                raise ProjectError(
                    f"{where}: {owner[id(p)]!r} and {name!r} share the parameter {network_parameters[id(p)]}"
                )
    return [Block(name, block, _paths_in(net, block)) for name, block in pairs]


def _paths_in(net: nn.Module, block: nn.Module) -> tuple[str, ...]:
    inside = {id(m) for m in block.modules()}
    paths: list[str] = []
    for path, submodule in net.named_modules():
        if id(submodule) in inside and not any(path.startswith(p + ".") for p in paths if p):
            if path == "":  # the whole network as one block
                return ("",)
            paths.append(path)
    return tuple(paths)


def check_covers(net: nn.Module, blocks: list[Block], strategy_name: str) -> None:
    """Refuse blocks that leave some of the network's parameters out (a stage would never train them)."""
    inside = {id(p) for block in blocks for p in block.module.parameters()}
    if missing := [name for name, p in net.named_parameters() if id(p) not in inside]:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ProjectError(
            f"--trainer.strategy={strategy_name}: the blocks {type(net).__name__} declares leave out the parameters "
            f"{shown}; every parameter must be in one block ({DOCS})"
        )


def short_count(n: int) -> str:
    """A parameter count for the console: ``950``, ``12.8k``, ``23.5M``."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
