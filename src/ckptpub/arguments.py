"""The command line of ``ckptpub``: ``ckptpub COMMAND [OPTIONS] ARGUMENTS``, parsed without argparse.

Every ``ckptpub`` run is a fresh process, and verifying a 2 GB checkpoint takes
about a quarter of a second, so start-up is part of every run. Importing argparse
and building its parsers for the five commands took 3.7 ms (argparse pulls in
shutil, gettext and locale and formats help text while it is being built); this
module takes about 0.1 ms. The grammar is small and fixed:

* one command, then long options (``--name`` or ``--name=value``, exact names, in any order,
  before or after the positional arguments; a repeated option keeps its last
  value) and the command's positional arguments;
* ``--`` ends the options; ``-h``/``--help`` prints help; ``--version`` (before
  a command) prints the version;
* anything else is a ``UsageError`` whose message is one line.
"""

from __future__ import annotations

from typing import NamedTuple

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see records.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


class UsageError(Exception):
    """A command line that cannot be run; ``command`` is the command it was for, if known."""

    def __init__(self, message: str, command: str | None = None) -> None:
        super().__init__(f"{command}: {message}" if command else message)
        self.command = command


class HelpRequested(Exception):
    """``--help`` or ``--version``: print ``str(self)`` to stdout and exit 0."""


class Option(NamedTuple):
    """A long option: a switch (``metavar`` is None, the value is True when given) or one with a value."""

    flag: str
    help: str
    metavar: str | None = None
    convert: Callable[[str], object] = str

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")


class Command(NamedTuple):
    """A command: what it runs, its positional arguments (name, help) and its options."""

    name: str
    help: str
    run: Callable[[Arguments], int]
    positionals: tuple[tuple[str, str], ...]
    options: tuple[Option, ...]


class Arguments:
    """The parsed command line: one attribute per positional argument and option."""

    def __init__(self, values: dict[str, object]) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        return f"Arguments({self.__dict__!r})"


def parse(
    program: str, description: str, version: str, commands: Sequence[Command], argv: Sequence[str]
) -> tuple[Command, Arguments]:
    """The command ``argv`` names and its ``Arguments``; raises ``UsageError`` or ``HelpRequested``."""
    by_name = {command.name: command for command in commands}
    if not argv:
        raise UsageError(f"a command is required ({', '.join(by_name)})")
    if argv[0] in ("-h", "--help"):
        raise HelpRequested(program_help(program, description, commands))
    if argv[0] == "--version":
        raise HelpRequested(f"{program} {version}")
    if argv[0].startswith("-"):
        raise UsageError(f"unrecognized option {argv[0]} (a command comes first)")
    command = by_name.get(argv[0])
    if command is None:
        raise UsageError(f"invalid choice: {argv[0]!r} (choose from {', '.join(by_name)})")
    return command, _parse_command(program, command, argv[1:])


def _parse_command(program: str, command: Command, argv: Sequence[str]) -> Arguments:
    options = {option.flag: option for option in command.options}
    values: dict[str, object] = {option.dest: None if option.metavar else False for option in command.options}
    positionals: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            positionals.extend(tokens)
            break
        if token in ("-h", "--help"):
            raise HelpRequested(command_help(program, command))
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            continue
        flag, has_value, value = token.partition("=")
        option = options.get(flag)
        if option is None:
            raise UsageError(f"unrecognized option {flag}", command.name)
        if option.metavar is None:
            if has_value:
                raise UsageError(f"{flag} takes no value", command.name)
            values[option.dest] = True
            continue
        if not has_value:
            value = next(tokens, None)
            if value is None or (
                value.startswith("-") and value != "-"
            ):  # "--threads --json": no value given
                raise UsageError(f"{flag} needs a value ({option.metavar})", command.name)
        try:
            values[option.dest] = option.convert(value)
        except ValueError as error:
            raise UsageError(f"{flag}: {error}", command.name) from None
    names = [name for name, _ in command.positionals]
    if len(positionals) < len(names):
        missing = " ".join(name.upper() for name in names[len(positionals) :])
        raise UsageError(f"the following arguments are required: {missing}", command.name)
    if len(positionals) > len(names):
        raise UsageError(f"unrecognized arguments: {' '.join(positionals[len(names) :])}", command.name)
    values.update(zip(names, positionals))
    return Arguments(values)


def program_help(program: str, description: str, commands: Sequence[Command]) -> str:
    sections = {
        "commands": [(command.name, command.help) for command in commands],
        "options": [
            ("-h, --help", "show this help (after a command: that command's help)"),
            ("--version", "print the version"),
        ],
    }
    return f"usage: {program} COMMAND [OPTIONS] ARGUMENTS\n\n{description}\n\n{_sections(sections)}"


def command_help(program: str, command: Command) -> str:
    sections = {
        "arguments": [(name.upper(), text) for name, text in command.positionals],
        "options": [(f"{o.flag} {o.metavar}" if o.metavar else o.flag, o.help) for o in command.options]
        + [("-h, --help", "show this help")],
    }
    usage = " ".join([program, command.name, "[OPTIONS]", *(name.upper() for name, _ in command.positionals)])
    return f"usage: {usage}\n\n{command.help}\n\n{_sections(sections)}"


def _sections(sections: dict[str, list[tuple[str, str]]]) -> str:
    width = max(len(left) for rows in sections.values() for left, _ in rows) + 2
    return "\n".join(
        line
        for title, rows in sections.items()
        for line in [f"{title}:", *(f"  {left:<{width}}{right}".rstrip() for left, right in rows)]
    )
