"""A project file: what to trace, written once by `ctracer project init` for a person to
edit, then used by ``ctracer trace --project FILE``.

The file is TOML::

    struct = "sock"                 # or: union = "..."
    binary = "./sockdemo"           # where the types come from: binary, btf (+ btf_base),
                                    # module; the running kernel's BTF when none
    [functions]
    include = ["tcp_*"]             # globs; every method when absent
    exclude = []
    [fields]
    include = ["__sk_common.skc_state", "sk_wmem_queued"]  # paths or globs; all when absent
    exclude = []
    cachelines = []                 # e.g. [1, 3]
    max_bytes = 64                  # optional
    pointers = false
    [objects]                       # kernel traces: where an object's lifetime starts or ends
    lifetime_rules = ["ends:tcp_destroy_sock"]  # replaces the defaults, as --lifetime-rule
    summary_fields = ["sk_wmem_queued"]  # columns of the report's object list (recorded
                                         # fields: a path, or its last name when unique)

`load` reads and checks the shape of the file (TOML syntax errors and unknown keys name
their line); `Project.check` checks the names against the struct's methods and fields
(an unknown one names its line and the close names); `render` writes a file listing
every method and field.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from ctracer.errors import InputFileError, UsageError

_TOP = ("struct", "union", "binary", "btf", "btf_base", "module", "functions", "fields",
        "objects")
_SECTIONS = {"functions": ("include", "exclude"),
             "fields": ("include", "exclude", "cachelines", "max_bytes", "pointers"),
             "objects": ("lifetime_rules", "summary_fields")}


@dataclass(frozen=True)
class Project:
    """A project file's content (None or empty: the default)."""

    path: str
    text: str
    kind: str
    name: str
    binary: Optional[str] = None
    btf: Optional[str] = None
    btf_base: Optional[str] = None
    module: Optional[str] = None
    functions: tuple[str, ...] = ()
    exclude_functions: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    exclude_fields: tuple[str, ...] = ()
    cachelines: tuple[int, ...] = ()
    max_bytes: Optional[int] = None
    pointers: bool = False
    #: ``--lifetime-rule`` texts replacing the defaults; None: the defaults
    lifetime_rules: Optional[tuple[str, ...]] = None
    #: fields shown as columns of the report's object list, as written
    summary_fields: tuple[str, ...] = ()

    def error(self, message: str, section: str = "", value: str = "") -> UsageError:
        """``FILE:LINE: message``, the line being where ``value`` is written (in
        ``section``), or the section's header."""
        line = _line_of(self.text, section, value)
        where = f"{self.path}:{line}" if line else self.path
        return UsageError(f"{where}: {message}")

    def summary_paths(self, recorded: Sequence[str]) -> tuple[str, ...]:
        """The recorded fields ``summary_fields`` names (a dotted path, or its last
        name when one recorded field has it); an error naming the file's line for one
        the trace does not record."""
        out = []
        for name in self.summary_fields:
            found = [r for r in recorded if r == name] or \
                [r for r in recorded if r.endswith("." + name)]
            if len(found) != 1:
                what = (f"is ambiguous: {', '.join(sorted(found)[:4])}" if found else
                        "is not a recorded field (its [fields] may leave it out; "
                        "ctracer struct --mini lists them)")
                close = difflib.get_close_matches(name, sorted(recorded), n=3, cutoff=0.6)
                hint = f"; did you mean {', '.join(close)}?" if close and not found else ""
                raise self.error(f"[objects] summary_fields: {name!r} {what}{hint}",
                                 "objects", name)
            if found[0] not in out:
                out.append(found[0])
        return tuple(out)

    def check(self, methods: Sequence[str], fields: Sequence[str]) -> None:
        """Every function glob names a method, every field path or glob a recordable
        field (or a struct holding some)."""
        for section, key, globs, known, what in (
                ("functions", "include", self.functions, methods, "method"),
                ("functions", "exclude", self.exclude_functions, methods, "method"),
                ("fields", "include", self.fields, _with_prefixes(fields), "recordable field"),
                ("fields", "exclude", self.exclude_fields, _with_prefixes(fields),
                 "recordable field")):
            for pattern in globs:
                if not any(fnmatch.fnmatchcase(n, pattern) for n in known):
                    close = difflib.get_close_matches(pattern, sorted(known), n=5, cutoff=0.6)
                    hint = f"; did you mean {', '.join(close)}?" if close else ""
                    raise self.error(f"[{section}] {key}: {pattern!r} names no {what} of "
                                     f"{self.kind} {self.name}{hint}", section, pattern)


def _with_prefixes(fields: Sequence[str]) -> set[str]:
    out = set()
    for f in fields:
        parts = f.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def _line_of(text: str, section: str, value: str) -> int:
    """The line (from 1) of ``"value"`` inside ``[section]`` (or the top), else of the
    section header, else 0."""
    lines = text.splitlines()
    start, end = 0, len(lines)
    if section:
        header = re.compile(rf"\s*\[\s*{re.escape(section)}\s*\]")
        found = [i for i, ln in enumerate(lines) if header.match(ln)]
        if not found:
            return 0
        start = found[0]
        later = [i for i, ln in enumerate(lines) if i > start and re.match(r"\s*\[", ln)]
        end = later[0] if later else len(lines)
    if value:
        quoted = (json.dumps(value), f"'{value}'")
        for i in range(start, end):
            code = lines[i].split("#", 1)[0]
            if any(q in code for q in quoted):
                return i + 1
        key = re.compile(rf"\s*{re.escape(value)}\s*=")
        for i in range(start, end):
            if key.match(lines[i]):
                return i + 1
    return start + 1 if section else 0


def load(path: str) -> Project:
    """The project file at ``path``, its shape checked (names are checked by
    `Project.check` once the struct is known)."""
    import tomllib
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise InputFileError(f"project file {path}: no such file") from None
    except IsADirectoryError:
        raise InputFileError(f"project file {path} is a directory") from None
    try:
        text = raw.decode("utf-8")
        doc = tomllib.loads(text)
    except UnicodeDecodeError:
        raise InputFileError(f"{path}: not a UTF-8 text file") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from None
    p = Project(path, text, "struct", "")

    def fail(message: str, section: str = "", value: str = "") -> UsageError:
        return p.error(message, section, value)

    _unknown_keys(doc, _TOP, "", fail)
    for section, keys in _SECTIONS.items():
        if section in doc:
            if not isinstance(doc[section], dict):
                raise fail(f"{section} must be a table ([{section}])", "", section)
            _unknown_keys(doc[section], keys, section, fail)
    if ("struct" in doc) == ("union" in doc):
        raise fail("say which struct to trace: struct = \"NAME\" (or union = \"NAME\")")
    kind = "struct" if "struct" in doc else "union"
    name = _string(doc, kind, "", fail)
    if not name.isidentifier():
        raise fail(f"{name!r} is not a C struct name", "", kind)
    sources = {k: _string(doc, k, "", fail) for k in ("binary", "btf", "btf_base", "module")
               if k in doc}
    here = os.path.dirname(os.path.abspath(path))
    for k in ("binary", "btf", "btf_base"):   # relative paths are the file's neighbours
        if k in sources and not os.path.isabs(sources[k]):
            sources[k] = os.path.normpath(os.path.join(here, sources[k]))
    functions, fields = doc.get("functions", {}), doc.get("fields", {})
    cachelines = fields.get("cachelines", [])
    if not isinstance(cachelines, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in cachelines):
        raise fail("cachelines must be a list of cacheline numbers, e.g. [1, 3]",
                   "fields", "cachelines")
    max_bytes = fields.get("max_bytes")
    if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool)
                                  or max_bytes < 1):
        raise fail("max_bytes must be a number of bytes (1 or more)", "fields", "max_bytes")
    pointers = fields.get("pointers", False)
    if not isinstance(pointers, bool):
        raise fail("pointers must be true or false", "fields", "pointers")
    objects = doc.get("objects", {})
    rules = _globs(objects, "lifetime_rules", "objects", fail) \
        if "lifetime_rules" in objects else None
    summary = _globs(objects, "summary_fields", "objects", fail)
    return Project(path, text, kind, name, functions=_globs(functions, "include", "functions",
                                                             fail),
                   exclude_functions=_globs(functions, "exclude", "functions", fail),
                   fields=_globs(fields, "include", "fields", fail),
                   exclude_fields=_globs(fields, "exclude", "fields", fail),
                   cachelines=tuple(cachelines), max_bytes=max_bytes, pointers=pointers,
                   lifetime_rules=rules, summary_fields=summary, **sources)


def _unknown_keys(table: dict, known: Sequence[str], section: str, fail) -> None:
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else \
                f" (known: {', '.join(known)})"
            where = f"[{section}] " if section else ""
            raise fail(f"{where}unknown key {key!r}{hint}", section, key)


def _string(table: dict, key: str, section: str, fail) -> str:
    value = table[key]
    if not isinstance(value, str) or not value:
        raise fail(f"{key} must be a non-empty string", section, key)
    return value


def _globs(table: dict, key: str, section: str, fail) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise fail(f"[{section}] {key} must be a list of strings", section, key)
    return tuple(value)


# ------------------------------------------------------------------ writing


def render(kind: str, name: str, source: dict, methods: Sequence[tuple[str, str]],
           fields: Sequence[tuple[str, str]], command: str) -> str:
    """A project file listing every method (name, how it reaches the struct) and every
    recordable field (path, what it is), each on its own line to delete or keep; the
    defaults are said in comments.  ``source`` holds the type source keys given."""
    q = json.dumps
    out = [f"# ctracer project: what `ctracer trace --project FILE` records.",
           f"# Written by: {command}",
           "# Delete the lines of what you do not want; a key left out takes its default.",
           "",
           f"{kind} = {q(name)}",
           "# where the types come from, as on the command line: binary = \"...\", "
           "btf = \"...\" (and btf_base), module = \"...\"; the running kernel's BTF when "
           "none"]
    out += [f"{k} = {q(v)}" for k, v in source.items()]
    out += ["", "[functions]",
            f"# globs of function names (name@unit for statics); every method when absent "
            f"({len(methods)} here)",
            "include = ["]
    width = max((len(q(m)) for m, _ in methods), default=0) + 1
    out += [f"  {(q(m) + ','):<{width}}  # {why}" for m, why in methods]
    out += ["]", "exclude = []", "", "[fields]",
            "# paths or globs (a struct's path takes all its fields); the default selection "
            f"when absent ({len(fields)} here)",
            "include = ["]
    width = max((len(q(f)) for f, _ in fields), default=0) + 1
    out += [f"  {(q(f) + ','):<{width}}  # {what}" for f, what in fields]
    out += ["]", "exclude = []",
            "cachelines = []            # e.g. [1, 3]: only fields on these cachelines "
            "(from 0)",
            "# max_bytes = 64           # keep fields in order while the snapshot fits",
            "pointers = false           # also record pointer members, as addresses", "",
            "[objects]",
            "# kernel traces: where an object's lifetime starts or ends, replacing the "
            "defaults (printed",
            "# when recording starts), as --lifetime-rule: "
            "starts|ends:TRACEPOINT[:ARGUMENT=VALUE], or \"none\"",
            "# lifetime_rules = [\"ends:tcp_destroy_sock\"]",
            "# recorded fields shown as columns of the report's object list (a path, or its "
            "last name when",
            "# unique), beside the struct's own (sock: addresses, states, role...)",
            "# summary_fields = [" + (q(fields[0][0]) if fields else '"..."') + "]", ""]
    return "\n".join(out)
