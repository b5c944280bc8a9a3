"""One line for jsonargparse's refusals, above all around a class chosen by its path (``--data=package.module.Class``):
in LightningCLI's subclass mode they come back as a refusal of the whole ``data`` value with the real cause nested
inside; these functions take that cause out. Examples of the texts: tests/unit/test_cli_bench.py."""

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
_MAPPING = 'a config file must be a mapping of options (key: value), e.g. "trainer: {max_epochs: 5}"'


def with_option_hints(message: str, options: Iterable[str]) -> str:
    """A parser's message about unknown options, with the nearest known option to each of them."""
    _, _, unrecognized = message.partition("unrecognized arguments:")
    unknown = re.findall(r"(--[\w.-]+)", unrecognized)
    unknown += [f"--{key}" for key in re.findall(r"does not accept option '([^']+)'", message)]
    options = list(options)
    near = [match[0] for name in unknown if (match := difflib.get_close_matches(name, options, n=1))]
    return f"{message}; did you mean {' or '.join(dict.fromkeys(near))}?" if near else message


def config_shape_error(message: str, argv: Iterable[str]) -> str | None:
    """For ``Unexpected config: - a - b`` (a config file that is no mapping), a line naming the file; else None."""
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
                return f"{path}: {_MAPPING}; this one holds {kind}: {found}"
    return f"{_MAPPING}; found: {found}"


def unwrap_class_option_error(message: str) -> str:
    """A refusal of one option of a class chosen by its path as that option's own (``data.image_size``); else as is."""
    key, first = re.match(r'Parser key "([^"]+)":', message), _FIRST_ERROR.search(message)
    given = _GIVEN_CLASS.match(first.group(3)) if key and first else None
    if not (given and given.group(2).startswith("Parser key ")):
        return message
    return re.sub(r'^Parser key "', f'Parser key "{key.group(1)}.', given.group(2))


def class_path_error_line(message: str) -> str | None:
    """The one line for a class path that names no usable class, or for an option the chosen class does not have
    (with the nearest it has); None for any other message."""
    key, value = re.match(r'Parser key "([^"]+)":', message), re.search(r"Given value: (.*?)\s*$", message)
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
        reason = one_line(given.group(2))
    elif "dot import path" in problem:
        reason = "not a dotted path"
    elif "Import path" in problem:
        reason = f"not a {base} subclass"
    else:
        return None
    return f"{key}={value} is not allowed: it must name a {base} subclass as package.module.Class ({reason})"


def project_error_within(err: BaseException) -> ProjectError | None:
    """The :class:`ProjectError` a class raised while jsonargparse built it, in its error's chain; None if none."""
    seen: BaseException | None = err
    while seen is not None and not isinstance(seen, ProjectError):
        seen = seen.__cause__ or seen.__context__
    return seen


def init_parameters(cls: type) -> list[str]:
    """The parameters of the ``__init__`` of ``cls`` and its bases: the options LightningCLI gives it."""
    inits = [list(inspect.signature(k.__init__).parameters.values())[1:] for k in cls.__mro__ if "__init__" in vars(k)]
    return list(dict.fromkeys(p.name for ps in inits for p in ps if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)))


def worker_error_line(message: str) -> str:
    """A DataLoader worker's error (in its traceback) as its last line, less the exception's name; others as is."""
    if "Original Traceback" not in message:
        return message
    return message.rstrip().splitlines()[-1].partition(": ")[2]


def one_line(message: str) -> str:
    """``message`` with its line breaks and indentation folded into single spaces."""
    return re.sub(r"\s*\n\s*", " ", message.strip())


def parse_error_line(message: str) -> str:
    """jsonargparse's message for a value of the wrong type as one line: the option, the value, the types allowed;
    other messages only folded onto one line."""
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
