"""The plain-data codec: a value as a JSON-able tree of plain data, and back into fresh objects.

Guest code, and the host's too: :mod:`collab_env.sandbox.harness` imports :func:`encode_value` and
:func:`decode_value` from here, and prepends this file's text to the candidate server
(``server.py``) and the call harness (``call_harness.py``), which run where ``collab_env`` cannot
be imported. Standard library only; the same source on both sides.
"""

import math as _math
import re as _re

_GENERATOR = type(_v for _v in ())  # type: ignore[var-annotated]
_HEX = _re.compile(r"-?[0-9a-f]+")

_TAGS = ("t", "s", "fs", "d", "f", "c", "b", "ba", "i", "g")

#: Items of a generator the candidate returns that cross (materialised on the candidate's side,
#: rebuilt as a fresh generator on the trusted side); a longer one is not plain data.
GENERATOR_ITEMS = 100_000
_BIG = 1 << 64  # ints at least this large cross as hex: JSON's decimal ints stop at 4,300 digits


def encode_value(x, _depth=0):
    """x as a JSON-able tree of plain data; TypeError for anything else."""
    if _depth > 200:
        raise TypeError("value nested too deeply")
    if x is None or x is True or x is False:
        return x
    t = type(x)
    if isinstance(x, int) and t is not bool:
        i = int.__int__(x) if t is not int else x
        return i if -_BIG < i < _BIG else {"i": int.__format__(i, "x")}
    if isinstance(x, float):
        v = float.__float__(x)
        return v if _math.isfinite(v) else {"f": repr(v)}
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, complex):
        return {"c": [encode_value(complex.__getattribute__(x, "real")),
                      encode_value(complex.__getattribute__(x, "imag"))]}
    if isinstance(x, bytes):
        return {"b": bytes.hex(x)}
    if isinstance(x, bytearray):
        return {"ba": bytearray.hex(x)}
    if isinstance(x, list):
        return [encode_value(v, _depth + 1) for v in list.__iter__(x)]
    if isinstance(x, tuple):
        return {"t": [encode_value(v, _depth + 1) for v in tuple.__iter__(x)]}
    if isinstance(x, frozenset):
        return {"fs": [encode_value(v, _depth + 1) for v in frozenset.__iter__(x)]}
    if isinstance(x, set):
        return {"s": [encode_value(v, _depth + 1) for v in set.__iter__(x)]}
    if isinstance(x, dict):
        return {"d": [[encode_value(k, _depth + 1), encode_value(v, _depth + 1)]
                      for k, v in dict.items(x)]}
    if t is _GENERATOR:
        items: list = []
        for v in x:
            if len(items) >= GENERATOR_ITEMS:
                raise TypeError(f"a generator of more than {GENERATOR_ITEMS} items is not plain data")
            items.append(encode_value(v, _depth + 1))
        return {"g": items}
    if type(x).__module__ == "numpy" and hasattr(x, "tolist"):
        return encode_value(x.tolist(), _depth + 1)  # numpy scalars and arrays, by value
    raise TypeError(f"a {t.__name__} is not plain data")


def decode_value(tree, _depth=0):
    """Fresh plain objects from an encoded tree; ValueError for anything malformed."""
    if _depth > 200:
        raise ValueError("value nested too deeply")
    t = type(tree)
    if tree is None or t in (bool, int, float, str):
        return tree
    if t is list:
        return [decode_value(v, _depth + 1) for v in tree]
    if t is not dict or len(tree) != 1:
        raise ValueError("malformed value")
    (tag, v), = tree.items()
    if tag == "f" and v in ("nan", "inf", "-inf"):
        return float(v)
    if tag == "i" and type(v) is str and _HEX.fullmatch(v):
        return int(v, 16)  # hex has no digit limit
    if tag in ("b", "ba") and type(v) is str:
        return (bytes if tag == "b" else bytearray).fromhex(v)
    if type(v) is not list:
        raise ValueError("malformed value")
    if tag == "c" and len(v) == 2:
        re_, im = (decode_value(p, _depth + 1) for p in v)
        if type(re_) is not float and type(re_) is not int or type(im) is not float and type(im) is not int:
            raise ValueError("malformed complex")
        return complex(re_, im)
    items = [decode_value(p, _depth + 1) for p in v]
    if tag == "t":
        return tuple(items)
    if tag == "g":
        return (v for v in items)
    if tag == "s":
        return set(items)
    if tag == "fs":
        return frozenset(items)
    if tag == "d":
        if not all(type(p) is list and len(p) == 2 for p in items):
            raise ValueError("malformed dict")
        return {k: val for k, val in items}
    raise ValueError("malformed value")
