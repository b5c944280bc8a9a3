"""The blocks a network splits into, for ``fsdp`` (one FSDP unit per block) and ``pipeline`` (stages made of
consecutive blocks): what a network declares, the generic default, and the checks on a declaration.

A network declares its blocks as an ordered list of ``(name, module)`` pairs:

- each ``module`` is made of the network's OWN submodules (not copies): one submodule (``layer1.0``), or an
  ``nn.Sequential`` of several (ResNet's stem: ``conv1, bn1, relu, maxpool``), to which parameter-free glue
  the network does in its ``forward`` may be added (a pooling, a flatten). So a block's parameters are the
  network's, under the network's own names, and a checkpoint keeps the network's keys;
- applied one after the other, the modules compute the network's ``forward`` (``pipeline`` runs them so);
- every parameter of the network is in one block (``pipeline`` needs that; under ``fsdp`` parameters outside
  every block are sharded with the root).

Where the declaration comes from (:func:`module_blocks`): the LightningModule's ``network_blocks()`` if it has
one (the template's ``ImageClassifier`` calls ``project.nets.network_blocks``, which knows torchvision's
ResNets and MobileNetV2); else :func:`default_blocks` of its ``net``: the network's own ``network_blocks()``
method, or an ``nn.Sequential``'s children. Anything else is refused in one line saying what to declare.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from project.toolkit.errors import ProjectError

DOCS = "docs/strategies.md#what-a-network-declares"


@dataclass(frozen=True, eq=False)
class Block:
    """One declared block: its ``name``, its ``module`` (made of the network's own submodules) and
    ``paths``, the network's submodules it holds, named as in the network (the outermost ones)."""

    name: str
    module: nn.Module
    paths: tuple[str, ...]

    @property
    def parameter_count(self) -> int:
        """How many parameter elements the block holds (its share of the network's)."""
        return sum(p.numel() for p in self.module.parameters())


def default_blocks(net: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The generic declaration: the network's own ``network_blocks()`` if it defines one, else an
    ``nn.Sequential``'s children; None for a network that declares nothing.

    >>> default_blocks(nn.Sequential(nn.Linear(2, 3), nn.ReLU()))
    [('0', Linear(in_features=2, out_features=3, bias=True)), ('1', ReLU())]
    >>> default_blocks(nn.Linear(2, 3)) is None
    True
    """
    own = getattr(net, "network_blocks", None)
    if callable(own):
        return list(own())
    if isinstance(net, nn.Sequential):
        return list(net.named_children())
    return None


def declared_blocks(module: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """What ``module`` declares of its ``net``'s blocks: its ``network_blocks()`` if it has one, else
    :func:`default_blocks`; None where nothing is declared. Unchecked (:func:`module_blocks` checks)."""
    declare = getattr(module, "network_blocks", None)
    if callable(declare):
        return declare()
    net = getattr(module, "net", None)
    return default_blocks(net) if isinstance(net, nn.Module) else None


def checked_blocks_or_none(module: nn.Module) -> list[Block] | None:
    """The checked blocks of ``module``'s network for a measurement that can do without them: None where
    none are declared or the declaration is wrong (the strategies that need blocks say so in one line)."""
    if not isinstance(getattr(module, "net", None), nn.Module):
        return None
    try:
        return module_blocks(module, "fsdp")
    except ProjectError:  # nothing declared, or declared wrongly: module_blocks' one line, not needed here
        return None


def module_blocks(module: nn.Module, strategy_name: str) -> list[Block]:
    """The blocks of ``module.net``, from the module's ``network_blocks()`` or :func:`default_blocks`, checked;
    one ``error:`` line naming ``strategy_name`` when the network declares none or declares them wrongly."""
    net = module.net
    declared = declared_blocks(module)
    if declared is None:
        raise ProjectError(
            f"--trainer.strategy={strategy_name} splits the network into blocks, and {type(net).__name__} declares "
            "none: make it an nn.Sequential, or give it a method network_blocks() returning [(name, module), ...] "
            f"in forward order ({DOCS}); or use ddp, which needs nothing"
        )
    return as_blocks(net, declared, strategy_name)


def as_blocks(net: nn.Module, declared: Iterable[tuple[str, nn.Module]], strategy_name: str = "fsdp") -> list[Block]:
    """``declared`` as :class:`Block` objects, each with the paths of the network's submodules it holds;
    refused in one line if the pairs are malformed, a name repeats, a block holds a parameter that is not
    the network's (a copy) or two blocks share one.

    >>> net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    >>> blocks = as_blocks(net, [("a", net[0]), ("b", nn.Sequential(net[1], net[2]))])
    >>> [(b.name, b.paths, b.parameter_count) for b in blocks]
    [('a', ('0',), 9), ('b', ('1', '2'), 4)]
    """
    where = f"--trainer.strategy={strategy_name}: the blocks {type(net).__name__} declares"
    pairs = list(declared)
    if not pairs or not all(
        isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], nn.Module)
        for pair in pairs
    ):
        raise ProjectError(f"{where} must be a non-empty list of (name, nn.Module) pairs ({DOCS})")
    names = [name for name, _ in pairs]
    repeated = sorted({name for name in names if names.count(name) > 1 or not name})
    if repeated:
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
    """The network's outermost submodules that are part of ``block``, by their path in the network."""
    inside = {id(m) for m in block.modules()}
    paths: list[str] = []
    for path, submodule in net.named_modules():
        if id(submodule) in inside and not any(path.startswith(p + ".") for p in paths if p):
            if path == "":  # the whole network as one block
                return ("",)
            paths.append(path)
    return tuple(paths)


def check_covers(net: nn.Module, blocks: list[Block], strategy_name: str) -> None:
    """Refuse blocks that leave some of the network's parameters out (a stage would never train them).

    >>> net = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    >>> check_covers(net, as_blocks(net, [("first", net[0])]), "pipeline")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    project.toolkit.errors.ProjectError: ... Sequential declares leave out the parameters 1.weight, 1.bias; ...
    """
    inside = {id(p) for block in blocks for p in block.module.parameters()}
    missing = [name for name, p in net.named_parameters() if id(p) not in inside]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ProjectError(
            f"--trainer.strategy={strategy_name}: the blocks {type(net).__name__} declares leave out the parameters "
            f"{shown}; every parameter must be in one block ({DOCS})"
        )


def short_count(n: int) -> str:
    """A parameter count for the console: ``950``, ``12.8k``, ``23.5M``.

    >>> short_count(950), short_count(12_800), short_count(23_520_842)
    ('950', '12.8k', '23.5M')
    """
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
