"""Tuning tables: tuned tilings by TuningKey, used as a context, saved to and loaded from JSON.

Lookups happen when a call is traced and cost a dict lookup. A call consults, in order: its
explicit `tiling` entry for the pass, the table active where it was made (`with tuning:`), the
table shipped for this device kind (kernelhub/tuning/defaults), then the implementation's
heuristic. A miss never starts a measurement; measuring is kernelhub.tuning's autotuner.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib.resources
import json
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any, Protocol

import jax

from kernelhub._grouped_matmul import active_table
from kernelhub._grouped_matmul.problem import Problem
from kernelhub._grouped_matmul.tilings import single


class KernelCall(Protocol):
    """What a table needs of a kernel call (kernelhub/_grouped_matmul/passes.py makes them)."""

    space: Any
    problem: Problem
    epilogue: Any  # the fused epilogue's spec (kernelhub/_grouped_matmul/epilogue.py)

    def key(self, device: str | None = None) -> TuningKey: ...

FORMAT = "kernelhub-tuning"
VERSION = 1


def _bucket(size: int) -> int:
    """The power of two at or above `size`: shapes within a factor of two share an entry."""
    return 1 << max(int(size) - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True, order=True)
class TuningKey:
    """What a tuned tiling is filed under: where and in which pass the kernel runs, and its
    problem with m, k and n rounded up to powers of two. The group counts and scale blocks are
    exact; the counts, with m, describe the group sizes coarsely (their mean). The sizes
    themselves are data, unknown when a call is traced; a table is tuned for one distribution
    of them, which its entries record."""

    device_kind: str
    implementation: str
    op: str
    pass_name: str
    problem: Problem

    @classmethod
    def of(cls, device_kind: str, implementation: str, op: str, pass_name: str,
           problem: Problem) -> TuningKey:
        bucketed = dataclasses.replace(problem, m=_bucket(problem.m), k=_bucket(problem.k),
                                       n=_bucket(problem.n))
        return cls(device_kind, implementation, op, pass_name, bucketed)

    def describe(self) -> str:
        p = self.problem
        blocks = "".join(f", {side} scale blocks {value}" for side, value in
                         (("lhs", p.lhs_blocks), ("rhs", p.rhs_blocks)) if value)
        return (f"{self.op} {self.pass_name} ({p.kernel} {p.m}x{p.k}x{p.n}, "
                f"{p.local_groups}/{p.num_groups} groups, {p.lhs_dtype} x {p.rhs_dtype} -> "
                f"{p.out_dtype}{blocks}) on {self.implementation}, {self.device_kind}")


def _problem_of(key: TuningKey) -> tuple:
    """What a key's kernel call computes, whichever op and pass made it."""
    return key.device_kind, key.implementation, key.problem


def device_kind() -> str:
    """The kind of device jax runs on here ("cpu", "NVIDIA H100 80GB HBM3", "TPU v5 lite")."""
    return jax.devices()[0].device_kind


@dataclasses.dataclass(frozen=True)
class Entry:
    """The tuned tiling of one key, and the measurements behind it (milliseconds, None where a
    candidate failed to compile); `groups` says which group sizes it was timed on."""

    tiling: tuple[int, ...]
    default_tiling: tuple[int, ...]
    tuned_ms: float
    default_ms: float
    groups: str
    candidates: tuple[tuple[tuple[int, ...], float | None], ...] = ()

    @property
    def speedup(self) -> float:
        """The default's time over the tuned one's (1.0 when the default won)."""
        return self.default_ms / self.tuned_ms if self.tuned_ms else 1.0


class Tuning:
    """Tuned tilings, by key. Use it as a context (`with tuning:`) around code that makes or
    traces kernelhub calls; `save(path)` writes it, `kernelhub.tuning.load(path)` reads it.

    Tilings are chosen when a call is traced. The table in force is part of jax's trace
    context, so a jitted function called inside and outside the block is traced for each.
    """

    def __init__(self, entries: Mapping[TuningKey, Entry] | None = None,
                 source: str = "a kernelhub tuning table"):
        self.entries: dict[TuningKey, Entry] = dict(entries or {})
        # Tuning.entry's index by kernel problem, made on first use: a table's entries are
        # fixed once made (merged() makes a new table).
        self._by_problem: dict[tuple, Entry] | None = None
        self.source = source  # where it came from, for messages
        self.refused: set[TuningKey] = set()  # keys whose tiling a kernel refused, warned once
        # The blocks this table is entered in, per thread and task: one table entered from two
        # threads keeps each thread's block apart.
        self._contexts: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
            "kernelhub_tuning_contexts", default=())

    def __enter__(self) -> Tuning:
        context = active_table.activated(self)
        context.__enter__()
        self._contexts.set((*self._contexts.get(), context))
        return self

    def __exit__(self, *exc_info) -> None:
        *outer, context = self._contexts.get()
        self._contexts.set(tuple(outer))
        context.__exit__(*exc_info)

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"Tuning({len(self.entries)} entries)"

    def merged(self, other: Tuning) -> Tuning:
        """A table with both tables' entries; `other`'s win where both have a key."""
        return Tuning({**self.entries, **other.entries}, f"{self.source} + {other.source}")

    def entry(self, key: TuningKey) -> Entry | None:
        """The entry filed under `key`, else one filed for the same kernel problem under
        another op or pass: one kernel runs in several (gmm with the weights transposed is a
        gmm's lhs gradient and the forward of weights stored [G, n, k]; tgmm is a gmm's weight
        gradient and transposed_grouped_matmul's forward), and the problem, not the op or pass
        it came from, decides which tiling is fastest and how long it takes. Among several,
        the first key in sorted order."""
        found = self.entries.get(key)
        if found is not None:
            return found
        if self._by_problem is None:
            by_problem: dict[tuple, Entry] = {}
            for other in sorted(self.entries):
                by_problem.setdefault(_problem_of(other), self.entries[other])
            self._by_problem = by_problem
        return self._by_problem.get(_problem_of(key))

    def lookup(self, key: TuningKey) -> tuple[int, ...] | None:
        entry = self.entry(key)
        return None if entry is None else entry.tiling

    def tiling_for(self, call: KernelCall) -> tuple[int, ...] | None:
        """This table's tiling for `call`, else the shipped one, else None (the heuristic)."""
        return _accepted(self.lookup(call.key()), call, self) or shipped_tiling(call)

    # --- files ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Writes the table as JSON to `path` (only there; nothing else is written)."""
        document = {"format": FORMAT, "version": VERSION,
                    "entries": [_entry_json(key, entry) for key, entry in sorted(self.entries.items())]}
        with open(path, "w", encoding="utf-8") as file:
            json.dump(document, file, indent=1)
            file.write("\n")


def _accepted(tiling: tuple[int, ...] | None, call: KernelCall,
              table: Tuning) -> tuple[int, ...] | None:
    # A key covers shapes within a factor of two, and a call with a fused epilogue as well as
    # without; a tiling tuned for one of them may break a kernel's rule at another (a TPU
    # tile that must divide k, a gated unit's second weight tile beside Mosaic GPU's stages),
    # and a hand-edited table may hold anything: then the heuristic decides, and the table's
    # entry is named once.
    if tiling is None or call.space.accepts(tiling, call.kernel_problem, call.epilogue):
        return tiling
    key = call.key()
    if key not in table.refused:
        table.refused.add(key)
        warnings.warn(
            f"{table.source}: tiling {list(tiling)} for {key.describe()} breaks the kernel's "
            f"rules for this call (its shape, or its fused epilogue); the heuristic's tiling "
            f"is used instead", stacklevel=2)
    return None


def load(path: str | os.PathLike) -> Tuning:
    """Reads a table written by `Tuning.save` (or `kernelhub tune --output`).

    Raises FileNotFoundError for a missing file, and a ValueError naming the file and what is
    wrong (not JSON, not a tuning table, another format version, a malformed entry).
    """
    with open(path, encoding="utf-8") as file:
        text = file.read()
    return parse(text, str(path))


def parse(text: str, source: str) -> Tuning:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source} is not a kernelhub tuning file: invalid JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"{source} is not a kernelhub tuning file: it has no "
                         f"\"format\": \"{FORMAT}\"")
    if document.get("version") != VERSION:
        raise ValueError(f"{source}: tuning format version {document.get('version')!r} is not "
                         f"supported; this kernelhub reads version {VERSION} (tune again)")
    entries = document.get("entries")
    if not isinstance(entries, list):
        raise ValueError(f"{source}: \"entries\" must be a list")
    table = {}
    for index, item in enumerate(entries):
        key, entry = _entry_from_json(item, f"{source}: entry {index}")
        table[key] = entry
    return Tuning(table, source)


# An entry's key, flat in its JSON object: where the kernel runs, then its problem's fields.
_PLACE_FIELDS = tuple(field for field in dataclasses.fields(TuningKey) if field.name != "problem")
_PROBLEM_FIELDS = dataclasses.fields(Problem)
# Fields with a default (the scale blocks) are written only when they differ from it, and
# read as it when absent: tables from before them read as they were meant.
_OPTIONAL_FIELDS = {field.name: field.default for field in _PROBLEM_FIELDS
                    if field.default is not dataclasses.MISSING}
_KEY_FIELDS = tuple(field.name for field in (*_PLACE_FIELDS, *_PROBLEM_FIELDS)
                    if field.name not in _OPTIONAL_FIELDS)
_FIELD_TYPES = {"int": int, "str": str, "bool": bool, "Kernel": str}


def _entry_json(key: TuningKey, entry: Entry) -> dict[str, Any]:
    place = {field.name: getattr(key, field.name) for field in _PLACE_FIELDS}
    problem = {name: value for name, value in dataclasses.asdict(key.problem).items()
               if name not in _OPTIONAL_FIELDS or value != _OPTIONAL_FIELDS[name]}
    return {**place, **problem, "tiling": list(entry.tiling),
            "default_tiling": list(entry.default_tiling),
            "tuned_ms": round(entry.tuned_ms, 4), "default_ms": round(entry.default_ms, 4),
            "groups": entry.groups,
            "candidates": [[list(tiling), None if ms is None else round(ms, 4)]
                           for tiling, ms in entry.candidates]}


def _tiling(value: Any, where: str) -> tuple[int, ...]:
    """A tiling read from a file: a list the ops' `tiling` argument would take as a tuple."""
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of ints, got {value!r}")
    try:
        return single(tuple(value), where)
    except TypeError as error:
        raise ValueError(str(error)) from None


def _entry_from_json(item: Any, where: str) -> tuple[TuningKey, Entry]:
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be an object, got {type(item).__name__}")
    missing = [name for name in (*_KEY_FIELDS, "tiling", "default_tiling", "tuned_ms",
                                 "default_ms", "groups") if name not in item]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")
    item = {**_OPTIONAL_FIELDS, **item}
    for field in (*_PLACE_FIELDS, *_PROBLEM_FIELDS):
        expected = _FIELD_TYPES[field.type if isinstance(field.type, str) else field.type.__name__]
        value = item[field.name]
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ValueError(f"{where}: {field.name} must be {expected.__name__}, got {value!r}")
    for name in ("tuned_ms", "default_ms"):
        if not isinstance(item[name], (int, float)) or isinstance(item[name], bool) or item[name] < 0:
            raise ValueError(f"{where}: {name} must be a non-negative number, got {item[name]!r}")
    candidates = []
    for position, candidate in enumerate(item.get("candidates", [])):
        if not (isinstance(candidate, list) and len(candidate) == 2):
            raise ValueError(f"{where}: candidates[{position}] must be [tiling, ms]")
        ms = candidate[1]
        if ms is not None and not isinstance(ms, (int, float)):
            raise ValueError(f"{where}: candidates[{position}] time must be a number or null")
        candidates.append((_tiling(candidate[0], f"{where}: candidates[{position}]"), ms))
    try:
        problem = Problem(**{field.name: item[field.name] for field in _PROBLEM_FIELDS})
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None
    key = TuningKey(**{field.name: item[field.name] for field in _PLACE_FIELDS}, problem=problem)
    entry = Entry(_tiling(item["tiling"], f"{where}: tiling"),
                  _tiling(item["default_tiling"], f"{where}: default_tiling"),
                  float(item["tuned_ms"]), float(item["default_ms"]), str(item["groups"]),
                  tuple(candidates))
    return key, entry


# --- the tables shipped with kernelhub ---------------------------------------------------------


def _file_name(device_kind: str) -> str:
    """defaults/<device kind, lower case, runs of other characters as '-'>.json"""
    return re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-") + ".json"


@functools.lru_cache(maxsize=None)
def shipped(device_kind: str) -> Tuning:
    """The table kernelhub ships for `device_kind` (empty when there is none)."""
    # Read as files of the kernelhub package: importing kernelhub.tuning (the autotuner) is not
    # needed to read a table.
    resource = (importlib.resources.files("kernelhub") / "tuning" / "defaults"
                / _file_name(device_kind))
    if not resource.is_file():
        return Tuning()
    return parse(resource.read_text(encoding="utf-8"), f"kernelhub/tuning/defaults/{resource.name}")


def shipped_tiling(call: KernelCall) -> tuple[int, ...] | None:
    key = call.key()
    table = shipped(key.device_kind)
    return _accepted(table.lookup(key), call, table)


def measured_entry(table: Any, call: KernelCall) -> Entry | None:
    """The entry whose tiling `call` runs with under `table` (a Tuning, or None for the shipped
    tables) and whose time was measured with it; None where there is none, or where the
    kernel would not take its tiling for this call (the heuristic's then runs, not timed)."""
    if not call.problem.static:
        return None
    key = call.key()
    entry = table.entry(key) if isinstance(table, Tuning) else None
    if entry is None:
        entry = shipped(key.device_kind).entry(key)
    if entry is None or not call.space.accepts(entry.tiling, call.kernel_problem, call.epilogue):
        return None
    return entry


class Observer:
    """The table in force while one implementation's share of a call is traced to learn its
    measured time (kernelhub/_grouped_matmul/measured.py): the kernel calls made
    (kernelhub/_grouped_matmul/passes.py) are recorded in `calls`, and each gets the tiling
    `table` gives it. A new object each time: jax's trace caches key on the table in force,
    so the implementation is traced again rather than taken from a cache."""

    def __init__(self, table: Any):
        self.table = table
        self.calls: list[KernelCall] = []

    def tiling_for(self, call: KernelCall) -> tuple[int, ...] | None:
        return choose(None, self.table, call)


def observe(call: KernelCall) -> None:
    """Records `call` when an Observer is the table in force."""
    observer = active_table.value()
    if isinstance(observer, Observer):
        observer.calls.append(call)


@functools.lru_cache(maxsize=8)
def _from_file(path: str) -> Tuning:
    """The table KERNELHUB_TUNING names, or one line naming the variable and what is wrong."""
    try:
        return load(path)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ValueError(f"KERNELHUB_TUNING={path!r} cannot be used as a tuning table: "
                         f"{reason}") from None


def active() -> Any:
    """The table in force here: a Tuning, a recorder (inside autotune), HEURISTIC, or None
    (the tables shipped for this device); a KERNELHUB_TUNING path is loaded on first use."""
    value = active_table.value()
    if isinstance(value, str):
        return _from_file(value) if value else None
    return value


def choose(explicit: Any, table: Any, call: KernelCall) -> Any:
    """The tiling `call` runs with: its explicit one, else `table`'s (a Tuning, a recorder, or
    HEURISTIC; None for the shipped tables), else None for the heuristic. A call whose m is
    symbolic (shape-polymorphic export) consults no table: the heuristic's tiling."""
    if explicit is not None:
        return explicit
    if not call.problem.static:
        # A key buckets sizes, and a symbolic m has no bucket: the heuristic takes it as it is.
        return None
    if table is None:
        return shipped_tiling(call)
    return table.tiling_for(call)

