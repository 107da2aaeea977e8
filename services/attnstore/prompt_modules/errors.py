"""Errors of the PML language. Each names the line, the element and what is wrong; all are
client mistakes (`InvalidArgument`), which the server edge maps to INVALID_ARGUMENT."""

from __future__ import annotations

from attnstore.errors import InvalidArgument


class PmlError(InvalidArgument):
    """A PML document is wrong. `line` is 1-based (0 where no line applies, e.g. a size limit)
    and `element` is how the element is written (`<module name="doc">`)."""

    def __init__(self, line: int, element: str, problem: str) -> None:
        super().__init__(f"line {line}, {element}: {problem}")
        self.line = line
        self.element = element
        self.problem = problem


class MalformedPml(PmlError):
    """Not well-formed XML, an unknown element or attribute, or an element where it may not be."""


class IllegalName(PmlError):
    """A name that is not a PML identifier, or that is reserved (a PML tag)."""


class DuplicateName(PmlError):
    """Two siblings, params, scaffolds (or a repeated import) with one name."""


class ParamAtRoot(PmlError):
    """A <param> outside every module: arguments are passed on a module's import."""


class UnknownModule(PmlError):
    """A prompt or scaffold names a module the schema does not declare there."""


class UnionConflict(PmlError):
    """Two members of one <union> imported (or scaffolded) together."""


class ArgumentError(PmlError):
    """An argument for no parameter of the module, or a parameter without an argument."""


class ArgumentTooLong(PmlError):
    """An argument tokenizes to more positions than its parameter's `len`."""


class SchemaMismatch(PmlError):
    """A prompt names another schema than the one it is checked against."""


class PmlLimitExceeded(PmlError):
    """A document breaks one of the caller's `PmlLimits`."""
