"""Pickles the lab reads from files others can write, restricted to data.

A pickle names the functions that rebuild its objects, and loading it calls them: a file
in a shared data folder could run any command in every rank. The published formats the
lab reads are pickles all the same (adj_mx.pkl of DCRNN's graphs, CIFAR-10's batches, the
attributes PyTables keeps in a pandas HDF5 file), so they are read here by an unpickler
that builds containers, strings, numbers and numpy arrays, and nothing else unless the
caller names it (pandas' time offsets for HDF5 attributes). Anything more is refused with
the name it asked for, before it is called.

`guarded_pytables()` makes PyTables, while a file is read, unpickle its attributes and
object columns through the same restriction.
"""

from __future__ import annotations

import contextlib
import io
import pickle

# (module, name) a data pickle may name: what numpy writes for an array, a dtype and a scalar, under numpy 1's
# and numpy 2's module names, and Python 2's spelling of the builtin containers
NUMPY_GLOBALS = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),  # protocol 5's arrays
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }
)
BUILTIN_GLOBALS = frozenset(
    {("__builtin__", n) for n in ("set", "frozenset", "list", "dict", "tuple")}
    | {("builtins", n) for n in ("set", "frozenset", "list", "dict", "tuple")}
    | {("_codecs", "encode")}
)  # how protocol 2 spells bytes under Python 3
# pandas writes a DatetimeIndex's frequency into an HDF5 attribute as a pickled offset (Minute, Hour, ...)
PANDAS_OFFSETS = "pandas._libs.tslibs.offsets"


class RefusedPickle(pickle.UnpicklingError):
    """A pickle asked for something that is not data; `name` is what it asked for."""

    def __init__(self, name: str):
        super().__init__(f"it asks for {name}, which is not data (a pickle naming a function can run any code)")
        self.name = name


class DataUnpickler(pickle.Unpickler):
    def __init__(self, f, *, extra: frozenset = frozenset(), offsets: bool = False, **kw):
        super().__init__(f, **kw)
        self.allowed = NUMPY_GLOBALS | BUILTIN_GLOBALS | extra
        self.offsets = offsets

    def find_class(self, module: str, name: str):
        if (module, name) in self.allowed or (self.offsets and module == PANDAS_OFFSETS and _is_offset(name)):
            return super().find_class(module, name)
        raise RefusedPickle(f"{module}.{name}")


def _is_offset(name: str) -> bool:
    import pandas._libs.tslibs.offsets as offsets

    cls = getattr(offsets, name, None)
    return isinstance(cls, type) and issubclass(cls, offsets.BaseOffset)


def loads(data: bytes, *, encoding: str = "ASCII", offsets: bool = False):
    """pickle.loads for data: RefusedPickle when the pickle names anything else."""
    return DataUnpickler(io.BytesIO(data), encoding=encoding, offsets=offsets).load()


def load(f, *, encoding: str = "ASCII"):
    """pickle.load for data from an open binary file."""
    return DataUnpickler(f, encoding=encoding).load()


class _PickleForPyTables:
    """Stands in for the pickle module inside PyTables' attribute and atom modules. PyTables swallows an
    unpickling error (the attribute then reads as its raw bytes), so each refusal is also kept in `refused`."""

    UnpicklingError = pickle.UnpicklingError
    HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL
    dumps = staticmethod(pickle.dumps)

    def __init__(self):
        self.refused: list[str] = []

    def loads(self, data, **kw):
        try:
            return loads(bytes(data), offsets=True, **kw)
        except RefusedPickle as e:
            self.refused.append(e.name)
            raise


@contextlib.contextmanager
def guarded_pytables():
    """While inside, PyTables unpickles HDF5 attributes and object columns as data only; yields the list of what
    was refused (RefusedPickle is raised too, but PyTables hides it for attributes). It swaps the `pickle` name
    in two PyTables modules: read the file in one thread while inside."""
    import tables.atom
    import tables.attributeset

    mods = (tables.attributeset, tables.atom)
    saved = [m.pickle for m in mods]
    shim = _PickleForPyTables()
    for m in mods:
        m.pickle = shim
    try:
        yield shim.refused
    finally:
        for m, p in zip(mods, saved):
            m.pickle = p
