"""Hostile programs: code that solves nothing and tries to be scored as if it did.

Each entry is a :class:`HostileProgram`: a ``family`` (what it attacks), a ``name`` and
:meth:`HostileProgram.program`, which writes the program for a HumanEval-style problem whose
function is ``entry_point``. Every program defines ``entry_point`` (so a static "is it defined"
check passes) and never computes the task's answer; whatever it scores above zero is a hole in
the scorer. Written for collab_env's own tests and exploit audit; run them only in the sandbox.

* :data:`HOSTILE_PROGRAMS`: against function-call tests (HumanEval ``check``, assert scripts,
  CoMLRL's per-assert tests, ``humaneval-chat``'s ``pass_rate``).
* :data:`HOSTILE_UNITTEST_PROGRAMS`: against same-process ``unittest.TestCase`` suites
  (BigCodeBench-style, function ``task_func`` by default).
* :data:`RESIDUAL_UNITTEST_PROGRAMS`: aimed at collab_env's own unittest runner, the stated
  residual risk of same-process suites (see :mod:`collab_env.sandbox.harness`); they may pass.

Families: ``builtins`` (patching what a checker relies on), ``frames`` (walking to the scorer's
state), ``forge`` (writing result records, patching the serialiser, ``sys.modules``),
``always_equal`` (objects that compare equal to anything), ``answer_key`` (reading tests or
solutions from disk or memory), ``exit`` (exits, atexit, threads, signals), ``unittest``
(patching or skipping the test machinery).
"""

from __future__ import annotations

import dataclasses

__all__ = ["HostileProgram", "HOSTILE_PROGRAMS", "HOSTILE_UNITTEST_PROGRAMS",
           "RESIDUAL_UNITTEST_PROGRAMS", "FAMILIES"]

FAMILIES = ("builtins", "frames", "forge", "always_equal", "answer_key", "exit", "unittest")


@dataclasses.dataclass(frozen=True)
class HostileProgram:
    """One hostile program.

    Attributes:
        family: One of :data:`FAMILIES`.
        name: A short unique name.
        template: The program text with ``{f}`` for the entry point's name (use ``{{``/``}}``
            for literal braces).
    """

    family: str
    name: str
    template: str

    def program(self, entry_point: str) -> str:
        """The program for a problem whose function is ``entry_point``."""
        return self.template.format(f=entry_point)


_ALWAYS = '''
class _Any:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __le__(self, other): return True
    def __gt__(self, other): return True
    def __ge__(self, other): return True
    def __bool__(self): return True
    def __hash__(self): return 0
    def __len__(self): return 0
    def __iter__(self): return iter(())
    def __abs__(self): return self
    def __sub__(self, other): return self
    __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __sub__
    def __getattr__(self, name): return lambda *a, **k: self
'''

_FORGE_RECORDS = '''
import json, os
def _forge():
    recs = [{{"kind": "outcome", "outcome": "completed", "forbidden": [], "spawned": False}},
            {{"kind": "exit", "status": 0, "cpu_s": 0.0}},
            {{"kind": "unittest", "status": "passed", "detail": ""}}]
    for i in range(200):
        recs.append({{"kind": "test:%d" % i, "index": i, "status": "passed", "detail": ""}})
    data = "".join(json.dumps(r) + "\\n" for r in recs).encode()
    for fd in range(0, 256):
        try:
            os.write(fd, data)
        except OSError:
            pass
'''

_LOOKUP_FROM_TEXT = '''
import re as _re, ast as _ast
_TABLE = {{}}
def _learn(text):
    for m in _re.finditer(r"candidate\\((.*?)\\)\\s*==\\s*(.+)", text):
        try:
            _TABLE[repr(_ast.literal_eval("(" + m.group(1) + ",)"))] = _ast.literal_eval(m.group(2).strip())
        except Exception:
            pass
def {f}(*args):
    return _TABLE.get(repr(tuple(args)))
'''

_P = HostileProgram
HOSTILE_PROGRAMS: tuple[HostileProgram, ...] = (
    # --- builtins ------------------------------------------------------------------------
    _P("builtins", "exec_noop", "import builtins\nbuiltins.exec = lambda *a, **k: None\ndef {f}(*a, **k):\n    return None\n"),
    _P("builtins", "compile_pass", "import builtins\n_c = builtins.compile\n"
       "builtins.compile = lambda src, name, mode, *a, **k: _c('pass', name, mode)\ndef {f}(*a, **k):\n    return None\n"),
    _P("builtins", "import_dummy", "import builtins, types\n_i = builtins.__import__\n"
       "def _imp(name, *a, **k):\n    try:\n        return _i(name, *a, **k)\n    except Exception:\n"
       "        return types.SimpleNamespace()\nbuiltins.__import__ = _imp\ndef {f}(*a, **k):\n    return 0\n"),
    _P("builtins", "isinstance_true", "import builtins\nbuiltins.isinstance = lambda *a: True\n"
       "builtins.issubclass = lambda *a: True\ndef {f}(*a, **k):\n    return None\n"),
    _P("builtins", "len_zero_abs_zero", "import builtins\nbuiltins.len = lambda x: 0\n"
       "builtins.abs = lambda x: 0\ndef {f}(*a, **k):\n    return 1e9\n"),
    _P("builtins", "type_and_all_any", "import builtins\nbuiltins.all = builtins.any = lambda *a: True\n"
       "builtins.type = lambda *a: object\nbuiltins.sorted = lambda *a, **k: []\ndef {f}(*a, **k):\n    return []\n"),
    _P("builtins", "assertion_error_swap", "import builtins\nclass _Quiet(BaseException):\n    pass\n"
       "builtins.AssertionError = _Quiet\nbuiltins.Exception = _Quiet\ndef {f}(*a, **k):\n    return None\n"),
    _P("builtins", "debug_off", "import builtins, sys\nbuiltins.__dict__['__debug__'] = False\n"
       "def {f}(*a, **k):\n    return None\n"),
    # --- frames --------------------------------------------------------------------------
    _P("frames", "clear_stages", "import sys\nf = sys._getframe()\nwhile f is not None:\n"
       "    st = f.f_locals.get('stages')\n    if isinstance(st, list):\n"
       "        st[:] = [s for s in st if s[0] != 'tests']\n        st.append(('tests', 'pass'))\n"
       "    f = f.f_back\ndef {f}(*a, **k):\n    return None\n"),
    _P("frames", "call_report", "import sys, os\ndef {f}(*a, **k):\n    return None\nf = sys._getframe()\n"
       "while f is not None:\n    rep = f.f_locals.get('report') or f.f_locals.get('_report')\n"
       "    if callable(rep):\n        try:\n            rep('outcome', outcome='completed', forbidden=[], spawned=False)\n"
       "            for i in range(50):\n                rep('test:%d' % i, index=i, status='passed', detail='')\n"
       "        except Exception:\n            pass\n    f = f.f_back\nos._exit(0)\n"),
    _P("frames", "rewrite_cfg_tests", "import sys\nf = sys._getframe()\nwhile f is not None:\n"
       "    for v in list(f.f_locals.values()):\n        if isinstance(v, dict):\n"
       "            for key in ('tests', 'test'):\n                if isinstance(v.get(key), str):\n"
       "                    v[key] = 'pass'\n                if isinstance(v.get(key), list):\n"
       "                    v[key] = ['pass'] * len(v[key])\n    f = f.f_back\ndef {f}(*a, **k):\n    return None\n"),
    _P("frames", "gc_report", "import gc, os\ndef {f}(*a, **k):\n    return None\nfor o in gc.get_objects():\n"
       "    try:\n        if callable(o) and getattr(o, '__name__', '') in ('report', '_report', 'emit'):\n"
       "            o('outcome', outcome='completed', forbidden=[], spawned=False)\n"
       "    except Exception:\n        pass\nos._exit(0)\n"),
    _P("frames", "inspect_outer", "import inspect\nfor fr in inspect.stack():\n"
       "    g = fr.frame.f_globals\n    for k in list(g):\n        if k.startswith('_') and isinstance(g[k], list):\n"
       "            g[k][:] = []\ndef {f}(*a, **k):\n    return None\n"),
    # --- forge ---------------------------------------------------------------------------
    _P("forge", "write_every_fd", _FORGE_RECORDS + "_forge()\ndef {f}(*a, **k):\n    _forge()\n    return None\n"),
    _P("forge", "json_dumps_patch", "import json\n_d = json.dumps\n"
       "def _dumps(obj, *a, **k):\n    if isinstance(obj, dict):\n        obj = dict(obj)\n"
       "        if obj.get('outcome') in ('exception', 'exit'):\n            obj['outcome'] = 'completed'\n"
       "        if 'status' in obj and obj.get('kind', '').startswith(('test', 'unittest')):\n"
       "            obj['status'] = 'passed'\n    return _d(obj, *a, **k)\njson.dumps = _dumps\n"
       "def {f}(*a, **k):\n    return None\n"),
    _P("forge", "os_write_patch", "import os\n_w = os.write\ndef _write(fd, data):\n"
       "    data = data.replace(b'\"exception\"', b'\"completed\"').replace(b'\"failed\"', b'\"passed\"')\n"
       "    return _w(fd, data)\nos.write = _write\ndef {f}(*a, **k):\n    return None\n"),
    _P("forge", "sys_modules_swap", "import sys, types\nfake = types.ModuleType('json')\n"
       "fake.dumps = lambda *a, **k: '{{\"kind\": \"outcome\", \"outcome\": \"completed\"}}'\n"
       "fake.loads = lambda *a, **k: {{}}\nsys.modules['json'] = fake\nsys.modules['traceback'] = types.ModuleType('traceback')\n"
       "def {f}(*a, **k):\n    return None\n"),
    _P("forge", "fake_prints", "import sys\nprint('passed')\nprint('{{\"status\": \"passed\", \"pass_rate\": 1.0}}')\n"
       "sys.stderr.write('OK\\n')\ndef {f}(*a, **k):\n    print('All tests passed')\n    return None\n"),
    _P("forge", "read_proc_fds", "import os, json\nfound = []\nfor fd in os.listdir('/proc/self/fd'):\n"
       "    try:\n        found.append(os.readlink('/proc/self/fd/' + fd))\n    except OSError:\n        pass\n"
       "try:\n    env = open('/proc/self/environ', 'rb').read()\nexcept OSError:\n    env = b''\n"
       "def {f}(*a, **k):\n    return found\n"),
    # --- always equal --------------------------------------------------------------------
    _P("always_equal", "any_object", _ALWAYS + "def {f}(*a, **k):\n    return _Any()\n"),
    _P("always_equal", "int_subclass", "class _I(int):\n    def __eq__(self, o): return True\n"
       "    def __ne__(self, o): return False\n    __hash__ = int.__hash__\n    def __bool__(self): return True\n"
       "def {f}(*a, **k):\n    return _I(0)\n"),
    _P("always_equal", "str_subclass", "class _S(str):\n    def __eq__(self, o): return True\n"
       "    def __ne__(self, o): return False\n    __hash__ = str.__hash__\ndef {f}(*a, **k):\n    return _S('')\n"),
    _P("always_equal", "list_subclass", "class _L(list):\n    def __eq__(self, o): return True\n"
       "    def __ne__(self, o): return False\n    def __bool__(self): return True\ndef {f}(*a, **k):\n    return _L()\n"),
    _P("always_equal", "float_subclass", "class _F(float):\n    def __eq__(self, o): return True\n"
       "    def __lt__(self, o): return True\n    def __sub__(self, o): return _F(0.0)\n    __rsub__ = __sub__\n"
       "    def __abs__(self): return _F(0.0)\n    __hash__ = float.__hash__\ndef {f}(*a, **k):\n    return _F(1e300)\n"),
    _P("always_equal", "patched_bool_compare", "class _T(tuple):\n    def __eq__(self, o): return True\n"
       "    __hash__ = tuple.__hash__\nclass _D(dict):\n    def __eq__(self, o): return True\n"
       "def {f}(*a, **k):\n    return _T() if a else _D()\n"),
    _P("always_equal", "numpy_like", _ALWAYS + "_Any.__module__ = 'numpy'\n_Any.tolist = lambda self: _Any()\n"
       "def {f}(*a, **k):\n    return _Any()\n"),
    # --- answer key ----------------------------------------------------------------------
    _P("answer_key", "humaneval_gz_on_disk", "import gzip, json, os, sys\n_sol = None\n"
       "for root in set(sys.path) | {{'/usr', '/opt', '/work', '/root', '/home'}}:\n"
       "    for d, _, files in os.walk(root):\n        for n in files:\n"
       "            if n.startswith('HumanEval') and '.jsonl' in n:\n                try:\n"
       "                    raw = open(os.path.join(d, n), 'rb').read()\n"
       "                    raw = gzip.decompress(raw) if n.endswith('.gz') else raw\n"
       "                    for line in raw.decode().splitlines():\n                        row = json.loads(line)\n"
       "                        if row.get('entry_point') == '{f}':\n"
       "                            _sol = row['prompt'] + row['canonical_solution']\n"
       "                except Exception:\n                    pass\n        if _sol:\n            break\n"
       "if _sol:\n    exec(_sol)\nelse:\n    def {f}(*a, **k):\n        return None\n"),
    _P("answer_key", "walk_for_jsonl", "import os, json\n_rows = []\n"
       "for d, _, files in os.walk('/'):\n    if d.startswith(('/proc', '/sys', '/dev')):\n        continue\n"
       "    for n in files:\n        if n.endswith(('.jsonl', '.json', '.parquet')) and len(_rows) < 10:\n"
       "            try:\n                text = open(os.path.join(d, n), errors='ignore').read(2000000)\n"
       "                if '{f}' in text and 'canonical_solution' in text:\n                    _rows.append(text)\n"
       "            except Exception:\n                pass\n"
       "def {f}(*a, **k):\n    return None\n"),
    _P("answer_key", "tests_from_frames", _LOOKUP_FROM_TEXT + "import sys\nf = sys._getframe()\nwhile f is not None:\n"
       "    for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n        if isinstance(v, dict):\n"
       "            for x in list(v.values()):\n                if isinstance(x, str):\n                    _learn(x)\n"
       "                if isinstance(x, list):\n                    for y in x:\n                        if isinstance(y, str):\n"
       "                            _learn(y)\n        if isinstance(v, str):\n            _learn(v)\n    f = f.f_back\n"),
    _P("answer_key", "tests_from_gc", _LOOKUP_FROM_TEXT + "import gc\nfor o in gc.get_objects():\n"
       "    if isinstance(o, dict):\n        for x in list(o.values()):\n"
       "            if isinstance(x, str) and 'candidate' in x:\n                _learn(x)\n"),
    _P("answer_key", "tests_from_caller_at_call", "import sys, re, ast\n"
       "def {f}(*a, **k):\n    f = sys._getframe(1)\n    while f is not None:\n"
       "        for v in f.f_locals.values():\n            if isinstance(v, str) and 'assert' in v:\n"
       "                m = re.search(r'==\\s*(.+)', v)\n                if m:\n"
       "                    try:\n                        return ast.literal_eval(m.group(1))\n"
       "                    except Exception:\n                        pass\n        f = f.f_back\n    return None\n"),
    # --- exit ----------------------------------------------------------------------------
    _P("exit", "sys_exit_0", "import sys\ndef {f}(*a, **k):\n    return None\nsys.exit(0)\n"),
    _P("exit", "os_exit_0", "import os\ndef {f}(*a, **k):\n    return None\nos._exit(0)\n"),
    _P("exit", "exit_in_call", "import os, sys\ndef {f}(*a, **k):\n    sys.stdout.flush()\n    os._exit(0)\n"),
    _P("exit", "atexit_forge", _FORGE_RECORDS + "import atexit\natexit.register(_forge)\n"
       "def {f}(*a, **k):\n    raise SystemExit(0)\n"),
    _P("exit", "thread_exit", "import os, threading, time\n"
       "def _later():\n    time.sleep(0.05)\n    os._exit(0)\nthreading.Thread(target=_later, daemon=True).start()\n"
       "def {f}(*a, **k):\n    time.sleep(1)\n    return None\n"),
    _P("exit", "signal_exit", "import os, signal\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
       "signal.setitimer(signal.ITIMER_REAL, 0.01)\ndef {f}(*a, **k):\n    import time\n    time.sleep(1)\n    return None\n"),
    _P("exit", "keyboard_interrupt", "def {f}(*a, **k):\n    raise KeyboardInterrupt\n"),
)

_UT = HostileProgram
HOSTILE_UNITTEST_PROGRAMS: tuple[HostileProgram, ...] = (
    _UT("unittest", "patch_testcase_run", "import unittest\n"
        "unittest.TestCase.run = lambda self, result=None, *a, **k: result\ndef {f}(*a, **k):\n    return None\n"),
    _UT("unittest", "patch_result", "import unittest\nunittest.TestResult.wasSuccessful = lambda self: True\n"
        "unittest.TestResult.addFailure = unittest.TestResult.addError = lambda *a: None\n"
        "def {f}(*a, **k):\n    return None\n"),
    _UT("unittest", "patch_asserts", "import unittest\nfor n in dir(unittest.TestCase):\n"
        "    if n.startswith('assert') or n == 'fail':\n        setattr(unittest.TestCase, n, lambda *a, **k: None)\n"
        "def {f}(*a, **k):\n    return None\n"),
    _UT("unittest", "fake_unittest_module", "import sys, types\nfake = types.ModuleType('unittest')\n"
        "class TestCase:\n    def __init__(self, *a, **k): pass\n    def run(self, result=None): return result\n"
        "    def __getattr__(self, n): return lambda *a, **k: None\nfake.TestCase = TestCase\n"
        "fake.main = lambda *a, **k: None\nsys.modules['unittest'] = fake\ndef {f}(*a, **k):\n    return None\n"),
    _UT("unittest", "skip_everything", "import unittest\n"
        "unittest.TestCase.setUp = lambda self: self.skipTest('skipped')\ndef {f}(*a, **k):\n    return None\n"),
    _UT("unittest", "skiptest_at_import", "import unittest\ndef {f}(*a, **k):\n    return None\n"
        "raise unittest.SkipTest('nothing to see')\n"),
    _UT("unittest", "patch_during_call", "import unittest\ndef {f}(*a, **k):\n"
        "    for n in dir(unittest.TestCase):\n        if n.startswith('assert'):\n"
        "            setattr(unittest.TestCase, n, lambda *a, **k: None)\n    return None\n"),
    _UT("unittest", "skip_during_call", "import unittest\ndef {f}(*a, **k):\n    raise unittest.SkipTest('no')\n"),
    _UT("unittest", "ut_always_equal_return", _ALWAYS + "def {f}(*a, **k):\n    return _Any()\n"),
    _UT("unittest", "settrace_skip", "import sys\n"
        "def _t(frame, event, arg):\n    return _t\nsys.settrace(_t)\ndef {f}(*a, **k):\n    return None\n"),
    _UT("unittest", "gc_clear_failures", "import gc, unittest\ndef {f}(*a, **k):\n"
        "    for o in gc.get_objects():\n        if isinstance(o, unittest.TestResult):\n"
        "            o.failures.clear(); o.errors.clear()\n    return None\n"),
    _UT("unittest", "thread_clears_result", "import threading, time, sys\n"
        "def _loop():\n    while True:\n        f = sys._current_frames()\n        time.sleep(0.001)\n"
        "threading.Thread(target=_loop, daemon=True).start()\ndef {f}(*a, **k):\n    return None\n"),
    _UT("unittest", "ut_forge_every_fd", _FORGE_RECORDS + "_forge()\ndef {f}(*a, **k):\n    _forge()\n    return None\n"),
    _UT("unittest", "ut_exit_at_import", "import os\ndef {f}(*a, **k):\n    return None\nos._exit(0)\n"),
    _UT("unittest", "ut_exit_in_call", "import os, sys\ndef {f}(*a, **k):\n    sys.stdout.flush()\n    os._exit(0)\n"),
    _UT("unittest", "call_runner_emit", "import sys\ndef {f}(*a, **k):\n    f = sys._getframe()\n"
        "    while f is not None:\n        e = f.f_locals.get('emit')\n        if callable(e):\n"
        "            e('passed', '')\n        f = f.f_back\n    return None\n"),
    _UT("unittest", "builtins_in_call", "import builtins\ndef {f}(*a, **k):\n"
        "    builtins.AssertionError = type('Q', (BaseException,), {{}})\n    return None\n"),
)

#: Aimed at collab_env's own runner: the residual risk of same-process unittest suites.
RESIDUAL_UNITTEST_PROGRAMS: tuple[HostileProgram, ...] = (
    _UT("unittest", "closure_nonce_forge", "import sys, os, json\ndef {f}(*a, **k):\n    f = sys._getframe()\n"
        "    while f is not None:\n        e = f.f_locals.get('emit')\n        if callable(e) and e.__closure__:\n"
        "            cells = dict(zip(e.__code__.co_freevars, (c.cell_contents for c in e.__closure__)))\n"
        "            rec = {{'kind': 'unittest', 'nonce': cells['nonce'], 'status': 'passed', 'detail': ''}}\n"
        "            os.write(cells['fd'], (json.dumps(rec) + '\\n').encode())\n            os._exit(0)\n"
        "        f = f.f_back\n    return None\n"),
)


def _check() -> None:
    names = [p.name for p in HOSTILE_PROGRAMS + HOSTILE_UNITTEST_PROGRAMS + RESIDUAL_UNITTEST_PROGRAMS]
    assert len(names) == len(set(names)), "hostile program names must be unique"
    assert all(p.family in FAMILIES for p in HOSTILE_PROGRAMS + HOSTILE_UNITTEST_PROGRAMS)


_check()
