"""One line for jsonargparse's refusals around a class chosen by its path (``--data=package.module.Class``).

In LightningCLI's subclass mode every refusal under ``--data`` comes back as a refusal of the whole
``data`` value, with the real cause nested inside: the class path names nothing usable, or the class
has no such option, or one of its options has a value of the wrong type, or the class itself refused
a value when it was built. These functions take that cause out, so the user reads which value is
wrong and what is allowed.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Iterable
from pathlib import Path

from project.toolkit.dotted import import_object
from project.toolkit.errors import ProjectError

# The first error jsonargparse lists under the class it expected: (base class name, indentation, text).
_FIRST_ERROR = re.compile(r"Subtypes: \[<class '(?:[\w.]+\.)?(\w+)'>.*?Errors:\n( *)- (.*?)(?=\n(?!\2\s)|\Z)", re.S)
_GIVEN_CLASS = re.compile(r"Problem with given class_path '([^']*)':\s*(.*)", re.S)


def with_option_hints(message: str, options: Iterable[str]) -> str:
    """A parser's message about unknown options, with the nearest known option to each of them.

    >>> with_option_hints("unrecognized arguments: --data.batchsize=64", ["--data.batch_size", "--data.data_dir"])
    'unrecognized arguments: --data.batchsize=64; did you mean --data.batch_size?'
    >>> with_option_hints("Subcommand 'fit' does not accept option 'model.lrr'", ["--model.lr"])
    "Subcommand 'fit' does not accept option 'model.lrr'; did you mean --model.lr?"
    """
    _, _, unrecognized = message.partition("unrecognized arguments:")
    unknown = re.findall(r"(--[\w.-]+)", unrecognized)
    unknown += [f"--{key}" for key in re.findall(r"does not accept option '([^']+)'", message)]
    options = list(options)
    near = [match[0] for name in unknown if (match := difflib.get_close_matches(name, options, n=1))]
    return f"{message}; did you mean {' or '.join(dict.fromkeys(near))}?" if near else message


def config_shape_error(message: str, argv: Iterable[str]) -> str | None:
    """For jsonargparse's ``Unexpected config: - a - b`` (a config file that is a list or a single value,
    not a mapping of options), a line naming the file and what it must hold; None for other messages.

    >>> config_shape_error("Unexpected config: - a", ["fit", "--config=missing.yaml"])
    'a config file must be a mapping of options (key: value), e.g. "trainer: {max_epochs: 5}"; found: - a'
    """
    if not message.startswith("Unexpected config"):
        return None
    import yaml  # only on this error: the commands answer without it otherwise

    found = " ".join(message.partition(":")[2].split())  # the YAML as jsonargparse shows it, on one line
    words = list(argv)
    values = [word.partition("=")[2] if "=" in word else nxt for word, nxt in zip(words, [*words[1:], ""], strict=True)]
    for value in values:
        path = Path(value) if value else None
        if path is not None and path.suffix in (".yaml", ".yml", ".json") and path.is_file():
            try:
                content = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError):
                continue
            if not isinstance(content, dict):
                kind = "a list" if isinstance(content, list) else f"a single value ({type(content).__name__})"
                return (
                    f"{path}: a config file must be a mapping of options (key: value), e.g. "
                    f'"trainer: {{max_epochs: 5}}"; this one holds {kind}: {found}'
                )
    return f'a config file must be a mapping of options (key: value), e.g. "trainer: {{max_epochs: 5}}"; found: {found}'


def unwrap_class_option_error(message: str) -> str:
    r"""A refusal of one option's value of a class chosen by its path, as jsonargparse reports that
    option's refusal itself (keyed ``data.image_size``); any other message unchanged.

    >>> print(unwrap_class_option_error(
    ...     'Parser key "data":\n  Subtypes: [<class \'a.Base\'>]\n  Errors:\n'
    ...     "    - Problem with given class_path 'a.Mine':\n        Parser key \"size\":\n"
    ...     "          Expected a <class 'int'>. Got value: big\n  Given value: NestedArg(key='size', val='big')"
    ... ))
    Parser key "data.size":
              Expected a <class 'int'>. Got value: big
    """
    key, first = re.match(r'Parser key "([^"]+)":', message), _FIRST_ERROR.search(message)
    given = _GIVEN_CLASS.match(first.group(3)) if key and first else None
    if not (given and given.group(2).startswith("Parser key ")):
        return message
    return re.sub(r'^Parser key "', f'Parser key "{key.group(1)}.', given.group(2))


def class_path_error_line(message: str) -> str | None:
    r"""The one line for a class path that names no usable class (``data=x.Y is not allowed: it must
    name a LightningDataModule subclass as package.module.Class (why)``), or for an option the chosen
    class does not have (with the nearest it has); None for any other message.

    >>> class_path_error_line(
    ...     'Parser key "data":\n  Subtypes: [<class \'a.Base\'>]\n  Errors:\n    - Problem with given '
    ...     "class_path 'x.Y':\n        No module named 'x'\n    - Expected None\n  Given value: x.Y"
    ... )
    "data=x.Y is not allowed: it must name a Base subclass as package.module.Class (No module named 'x')"
    """
    key = re.match(r'Parser key "([^"]+)":', message)
    value = re.search(r"Given value: (.*?)\s*$", message)
    first = _FIRST_ERROR.search(message)
    if not (key and value and first):
        return None
    key, value, base, problem = key.group(1), value.group(1), first.group(1), first.group(3)
    given = _GIVEN_CLASS.match(problem)
    unknown = re.match(r"Option '([^']+)' is not accepted", given.group(2)) if given else None
    if unknown:  # the class is fine; it has no such option: name the nearest one it has
        nested = re.fullmatch(r"NestedArg\(key='[^']*', val='(.*)'\)", value)
        typed = f"--{key}.{unknown.group(1)}" + (f"={nested.group(1)}" if nested else "")
        options = [f"--{key}.{name}" for name in init_parameters(import_object(given.group(1)))]
        return with_option_hints(f"unrecognized arguments: {typed}", options)
    in_mapping = re.match(r"\{'class_path': '([^']*)'", value)
    if in_mapping:  # from a config file: name the path, not the whole mapping
        key, value = f"{key}.class_path", in_mapping.group(1)
    if given:
        reason = re.sub(r"\s*\n\s*", " ", given.group(2).strip())
    elif "dot import path" in problem:
        reason = "not a dotted path"
    elif "Import path" in problem:
        reason = f"not a {base} subclass"
    else:
        return None
    return f"{key}={value} is not allowed: it must name a {base} subclass as package.module.Class ({reason})"


def project_error_within(err: BaseException) -> ProjectError | None:
    """The :class:`ProjectError` a class raised while jsonargparse built it (``data.image_size=0``),
    which jsonargparse hands on as the context of an error of its own; None if there is none.

    >>> try:
    ...     try:
    ...         raise ProjectError("data.image_size=0 is not allowed")
    ...     except ProjectError:
    ...         raise ValueError("Does not validate against any of the Union subtypes ...")
    ... except ValueError as err:
    ...     print(project_error_within(err))
    data.image_size=0 is not allowed
    """
    seen: BaseException | None = err
    while seen is not None and not isinstance(seen, ProjectError):
        seen = seen.__cause__ or seen.__context__
    return seen


def init_parameters(cls: type) -> list[str]:
    """The parameters of the ``__init__`` of ``cls`` and of every class it derives from: the options
    LightningCLI gives it.

    >>> import torch
    >>> init_parameters(type("Wider", (torch.nn.Linear,), {}))[:3]
    ['in_features', 'out_features', 'bias']
    """
    names = []
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            for parameter in list(inspect.signature(klass.__init__).parameters.values())[1:]:
                if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                    names.append(parameter.name)
    return list(dict.fromkeys(names))


def one_line(message: str) -> str:
    r"""``message`` with its line breaks and indentation folded into single spaces.

    >>> one_line("first\n  second")
    'first second'
    """
    return re.sub(r"\s*\n\s*", " ", message.strip())


def parse_error_line(message: str) -> str:
    r"""jsonargparse's message for a value of the wrong type, as one line: the option, the value, and
    the types or values allowed; other messages only folded onto one line.

    >>> parse_error_line('Parser key "data.image_size":\n  Expected a <class \'int\'>. Got value: abc')
    'data.image_size=abc is not allowed; expected int'
    >>> parse_error_line(
    ...     'Parser key "trainer.max_epochs":\n  Does not validate against any of the Union subtypes\n'
    ...     "  Subtypes: [<class 'int'>, <class 'NoneType'>]\n  Errors:\n    - Expected a <class 'int'>\n"
    ...     "    - Expected a <class 'NoneType'>\n  Given value type: <class 'str'>\n  Given value: abc"
    ... )
    'trainer.max_epochs=abc is not allowed; expected int or null'
    """
    message = unwrap_class_option_error(message)  # --data.image_size=big: jsonargparse blames all of --data
    if class_path_line := class_path_error_line(message):  # --data=no.such.Class, --data.no_such_option
        return class_path_line
    key = re.match(r'Parser key "([^"]+)":', message)
    value = re.search(r"(?:Given|Got) value: (.*?)\s*$", message)
    expected = re.findall(r"Expected a (.+?)(?:\. Got value|\n|$)", message)
    if not (key and value and expected):
        return one_line(message)
    names = {"<class 'NoneType'>": "null"}
    allowed = [names.get(t, re.sub(r"^<class '(.+)'>$|^typing\.Literal\[(.+)\]$", r"\1\2", t)) for t in expected]
    return f"{key.group(1)}={value.group(1)} is not allowed; expected {' or '.join(allowed)}"
