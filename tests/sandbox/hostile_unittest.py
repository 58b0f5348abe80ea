"""Issue 43's hostile set against unittest suites (our own forms): programs that never compute
the task and try to be scored as if they did. Each is a complete program defining ``task_func``.

The task: ``task_func(n)`` returns the list of the squares of ``range(n)``. :data:`MOCK_SUITE`
must run beside the program (it patches with ``unittest.mock``); :data:`PLAIN_SUITE` only calls it
(it runs in the trusted harness, and falls back to running beside the program when a result
cannot cross); :data:`FORMS_SUITE` holds two forms today's main did not recognise.
"""

from __future__ import annotations

RIGHT = "def task_func(n):\n    return [i * i for i in range(n)]\n"

MOCK_SUITE = '''
import unittest
from unittest.mock import patch


class TestSquares(unittest.TestCase):
    def test_three(self):
        with patch("os.getcwd", return_value="/x"):
            r = task_func(3)
        self.assertEqual(r, [0, 1, 4])
        self.assertIn(4, r)

    def test_len(self):
        r = task_func(5)
        self.assertIsInstance(r, list)
        self.assertEqual(len(r), 5)
        self.assertTrue(16 in r)
'''

PLAIN_SUITE = MOCK_SUITE.replace("from unittest.mock import patch\n", "").replace(
    '        with patch("os.getcwd", return_value="/x"):\n            r = task_func(3)\n', "        r = task_func(3)\n")

#: Two forms today's main did not recognise (so any program passed them): a base imported under
#: another name, and a class defined under an ``if``.
FORMS_SUITE = '''
import sys
import unittest
from unittest import TestCase as TC


class Squares(TC):
    def test_three(self):
        self.assertEqual(task_func(3), [0, 1, 4])


if sys.version_info >= (3,):
    class MoreSquares(unittest.TestCase):
        def test_four(self):
            self.assertEqual(task_func(4)[-1], 9)
'''

_ALWAYS_SRC = (
    "class R(list):\n"
    "    def __eq__(self, o): return True\n"
    "    def __ne__(self, o): return False\n"
    "    def __contains__(self, o): return True\n"
    "    __hash__ = None\n"
)

#: name -> program. Each one scored 1.0 on at least one suite on main before issue 43.
HOSTILE: dict[str, str] = {
    # --- record an error through something the runner did not pin --------------------------
    "case_add_error_noop": '''\
import unittest.case
unittest.case._addError = lambda *a, **k: None
def task_func(n):
    return None
''',
    "case_add_error_in_call": '''\
def task_func(n):
    import unittest.case
    unittest.case._addError = lambda *a, **k: None
    return None
''',
    "sys_exc_info_blank": '''\
import sys
_e = sys.exc_info
def task_func(n):
    sys.exc_info = lambda: (None, None, None)
    return None
''',
    # --- values equal to anything, from the standard library or compiled from a string --------
    "mock_any": '''\
from unittest import mock
def task_func(n):
    return mock.ANY
''',
    "list_of_any": '''\
from unittest.mock import ANY
def task_func(n):
    return [ANY] * n
''',
    "magicmock_eq_return_value": '''\
from unittest.mock import MagicMock
def task_func(n):
    m = MagicMock(spec=list)
    m.__eq__.return_value = True
    m.__contains__.return_value = True
    m.__len__.return_value = n
    return m
''',
    "magicmock_eq_side_effect": '''\
from unittest.mock import MagicMock
def task_func(n):
    m = MagicMock()
    m.__eq__.side_effect = lambda other: True
    m.__contains__.side_effect = lambda other: True
    m.__len__.return_value = n
    m.__class__ = list
    return m
''',
    "exec_string_class": '''\
_SRC = ('class R(list):\\n    def __eq__(self, o): return True\\n'
        '    def __ne__(self, o): return False\\n'
        '    def __contains__(self, o): return True\\n    __hash__ = None\\n')
_ns = {}
exec(_SRC, _ns)
def task_func(n):
    return _ns['R']([0] * n)
''',
    "eval_lambda_type": '''\
R = type('R', (list,), {'__eq__': eval('lambda s, o: True'),
    '__contains__': eval('lambda s, o: True'), '__hash__': None})
def task_func(n):
    return R([0] * n)
''',
    "library_file_name": '''\
import json.decoder
_SRC = ('class R(list):\\n    def __eq__(self, o): return True\\n'
        '    def __ne__(self, o): return False\\n'
        '    def __contains__(self, o): return True\\n    __hash__ = None\\n')
_ns = {}
exec(compile(_SRC, json.decoder.__file__, 'exec'), _ns)
def task_func(n):
    return _ns['R']([0] * n)
''',
    "module_from_a_file": '''\
import importlib.util, os, tempfile
_p = os.path.join(tempfile.mkdtemp(), 'helper_mod.py')
_SRC = ('class R(list):\\n    def __eq__(self, o): return True\\n'
        '    def __ne__(self, o): return False\\n'
        '    def __contains__(self, o): return True\\n    __hash__ = None\\n')
open(_p, 'w').write(_SRC)
_s = importlib.util.spec_from_file_location('helper_mod', _p)
_m = importlib.util.module_from_spec(_s)
_s.loader.exec_module(_m)
def task_func(n):
    return _m.R([0] * n)
''',
    "builtin_as_dunder": '''\
class R(list):
    __eq__ = bool
    __contains__ = bool
def task_func(n):
    return R([0] * n)
''',
    "swapped_c_slot": '''\
class R(list):
    __eq__ = list.__ne__
    __ne__ = list.__eq__
    __contains__ = list.__ne__
def task_func(n):
    return R([7] * n)
''',
    "trusted_function_as_eq": '''\
import unittest.mock
class R(list):
    __eq__ = type(unittest.mock.ANY).__eq__
    __contains__ = type(unittest.mock.ANY).__eq__
def task_func(n):
    return R([0] * n)
''',
    "int_items_from_string": '''\
_ns = {}
exec('class I(int):\\n    def __eq__(s, o): return True\\n'
     '    __hash__ = int.__hash__\\n', _ns)
def task_func(n):
    return [_ns['I'](7)] * n
''',
    "len_and_member_lie": '''\
_ns = {}
exec('class R(list):\\n    def __len__(s): return 5\\n'
     '    def __contains__(s, o): return True\\n'
     '    def __eq__(s, o): return True\\n', _ns)
def task_func(n):
    return _ns['R']()
''',
    # --- the namespace the tests are built in ------------------------------------------------
    "builtins_build_class": '''\
import builtins
_bc = builtins.__build_class__
def _build(func, name, *bases, **kw):
    cls = _bc(func, name, *bases, **kw)
    for k in list(vars(cls)):
        if k.startswith('test'):
            setattr(cls, k, lambda self: None)
    return cls
_d = dict(builtins.__dict__)
_d['__build_class__'] = _build
globals()['__builtins__'] = _d
def task_func(n):
    return None
''',
    "builtins_quiet_methods": '''\
import builtins
_bc = builtins.__build_class__
def _quiet(f):
    def run(self, *a, **k):
        try:
            f(self, *a, **k)
        except BaseException:
            pass
    return run
def _build(func, name, *bases, **kw):
    cls = _bc(func, name, *bases, **kw)
    for k, v in list(vars(cls).items()):
        if k.startswith('test'):
            setattr(cls, k, _quiet(v))
    return cls
globals()['__builtins__'] = dict(vars(builtins), __build_class__=_build)
def task_func(n):
    return []
''',
    # --- forging the verdict from inside the process -----------------------------------------
    "frame_walk_forge": '''\
import sys, os, json
def task_func(n):
    f = sys._getframe()
    while f is not None:
        for v in list(f.f_locals.values()):
            cl = getattr(v, '__closure__', None)
            if callable(v) and cl:
                c = dict(zip(v.__code__.co_freevars, (x.cell_contents for x in cl)))
                if 'nonce' in c and c.get('nonce'):
                    rec = {'kind': 'unittest', 'nonce': c['nonce'], 'status': 'passed', 'detail': ''}
                    fd = c.get('status_fd', c.get('fd'))
                    os.write(fd, (json.dumps(rec) + '\\n').encode())
                    os._exit(0)
        f = f.f_back
    return None
''',
    "frame_walk_call_writers": '''\
import sys
def task_func(n):
    f = sys._getframe()
    while f is not None:
        for k, v in list(f.f_locals.items()):
            if k in ('emit', 'send', 'report') and callable(v):
                try:
                    v('passed', '') if k == 'emit' else None
                except BaseException:
                    pass
        f = f.f_back
    return None
''',
    # --- suite forms main did not run at all (any program passed them) -----------------------
    "nothing_at_all": '''\
def task_func(n):
    return None
''',
}

#: The suites each program is scored against (name -> text).
SUITES = {"mock": MOCK_SUITE, "plain": PLAIN_SUITE, "forms": FORMS_SUITE}
