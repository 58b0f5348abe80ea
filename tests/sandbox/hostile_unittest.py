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

#: name -> program. Each one scored above 0 on at least one suite on main before issue 43.
HOSTILE: dict[str, str] = {
    # --- record an error through something the runner did not pin --------------------------
    "case_add_error_noop": "import unittest.case\nunittest.case._addError = lambda *a, **k: None\n"
                           "def task_func(n):\n    return None\n",
    "case_add_error_in_call": "def task_func(n):\n    import unittest.case\n"
                              "    unittest.case._addError = lambda *a, **k: None\n    return None\n",
    "sys_exc_info_blank": "import sys\n_e = sys.exc_info\n"
                          "def task_func(n):\n    sys.exc_info = lambda: (None, None, None)\n    return None\n",
    # --- values equal to anything, from the standard library or compiled from a string --------
    "mock_any": "from unittest import mock\ndef task_func(n):\n    return mock.ANY\n",
    "list_of_any": "from unittest.mock import ANY\ndef task_func(n):\n    return [ANY] * n\n",
    "magicmock_eq_return_value": "from unittest.mock import MagicMock\ndef task_func(n):\n"
                                 "    m = MagicMock(spec=list)\n    m.__eq__.return_value = True\n"
                                 "    m.__contains__.return_value = True\n    m.__len__.return_value = n\n    return m\n",
    "magicmock_eq_side_effect": "from unittest.mock import MagicMock\ndef task_func(n):\n"
                                "    m = MagicMock()\n    m.__eq__.side_effect = lambda other: True\n"
                                "    m.__contains__.side_effect = lambda other: True\n"
                                "    m.__len__.return_value = n\n    m.__class__ = list\n    return m\n",
    "exec_string_class": "_ns = {}\nexec(" + repr(_ALWAYS_SRC) + ", _ns)\n"
                         "def task_func(n):\n    return _ns['R']([0] * n)\n",
    "eval_lambda_type": "R = type('R', (list,), {'__eq__': eval('lambda s, o: True'),\n"
                        "    '__contains__': eval('lambda s, o: True'), '__hash__': None})\n"
                        "def task_func(n):\n    return R([0] * n)\n",
    "library_file_name": "import json.decoder\n_ns = {}\n"
                         "exec(compile(" + repr(_ALWAYS_SRC) + ", json.decoder.__file__, 'exec'), _ns)\n"
                         "def task_func(n):\n    return _ns['R']([0] * n)\n",
    "module_from_a_file": "import importlib.util, os, tempfile\n"
                          "_p = os.path.join(tempfile.mkdtemp(), 'helper_mod.py')\n"
                          "open(_p, 'w').write(" + repr(_ALWAYS_SRC) + ")\n"
                          "_s = importlib.util.spec_from_file_location('helper_mod', _p)\n"
                          "_m = importlib.util.module_from_spec(_s)\n_s.loader.exec_module(_m)\n"
                          "def task_func(n):\n    return _m.R([0] * n)\n",
    "builtin_as_dunder": "class R(list):\n    __eq__ = bool\n    __contains__ = bool\n"
                         "def task_func(n):\n    return R([0] * n)\n",
    "swapped_c_slot": "class R(list):\n    __eq__ = list.__ne__\n    __ne__ = list.__eq__\n"
                      "    __contains__ = list.__ne__\n"
                      "def task_func(n):\n    return R([7] * n)\n",
    "trusted_function_as_eq": "import unittest.mock\nclass R(list):\n"
                              "    __eq__ = type(unittest.mock.ANY).__eq__\n    __contains__ = type(unittest.mock.ANY).__eq__\n"
                              "def task_func(n):\n    return R([0] * n)\n",
    "int_items_from_string": "_ns = {}\nexec('class I(int):\\n    def __eq__(s, o): return True\\n'\n"
                             "     '    __hash__ = int.__hash__\\n', _ns)\n"
                             "def task_func(n):\n    return [_ns['I'](7)] * n\n",
    "len_and_member_lie": "_ns = {}\nexec('class R(list):\\n    def __len__(s): return 5\\n'\n"
                          "     '    def __contains__(s, o): return True\\n'\n"
                          "     '    def __eq__(s, o): return True\\n', _ns)\n"
                          "def task_func(n):\n    return _ns['R']()\n",
    # --- the namespace the tests are built in ------------------------------------------------
    "builtins_build_class": "import builtins\n_bc = builtins.__build_class__\n"
                            "def _build(func, name, *bases, **kw):\n    cls = _bc(func, name, *bases, **kw)\n"
                            "    for k in list(vars(cls)):\n        if k.startswith('test'):\n"
                            "            setattr(cls, k, lambda self: None)\n    return cls\n"
                            "_d = dict(builtins.__dict__)\n_d['__build_class__'] = _build\n"
                            "globals()['__builtins__'] = _d\n"
                            "def task_func(n):\n    return None\n",
    "builtins_quiet_methods": "import builtins\n_bc = builtins.__build_class__\n"
                              "def _quiet(f):\n    def run(self, *a, **k):\n        try:\n            f(self, *a, **k)\n"
                              "        except BaseException:\n            pass\n    return run\n"
                              "def _build(func, name, *bases, **kw):\n    cls = _bc(func, name, *bases, **kw)\n"
                              "    for k, v in list(vars(cls).items()):\n        if k.startswith('test'):\n"
                              "            setattr(cls, k, _quiet(v))\n    return cls\n"
                              "globals()['__builtins__'] = dict(vars(builtins), __build_class__=_build)\n"
                              "def task_func(n):\n    return []\n",
    # --- forging the verdict from inside the process -----------------------------------------
    "frame_walk_forge": "import sys, os, json\ndef task_func(n):\n    f = sys._getframe()\n"
                        "    while f is not None:\n        for v in list(f.f_locals.values()):\n"
                        "            cl = getattr(v, '__closure__', None)\n"
                        "            if callable(v) and cl:\n                c = dict(zip(v.__code__.co_freevars, (x.cell_contents for x in cl)))\n"
                        "                if 'nonce' in c and c.get('nonce'):\n"
                        "                    rec = {'kind': 'unittest', 'nonce': c['nonce'], 'status': 'passed', 'detail': ''}\n"
                        "                    fd = c.get('status_fd', c.get('fd'))\n"
                        "                    os.write(fd, (json.dumps(rec) + '\\n').encode())\n"
                        "                    os._exit(0)\n        f = f.f_back\n    return None\n",
    "frame_walk_call_writers": "import sys\ndef task_func(n):\n    f = sys._getframe()\n    while f is not None:\n"
                               "        for k, v in list(f.f_locals.items()):\n"
                               "            if k in ('emit', 'send', 'report') and callable(v):\n"
                               "                try:\n                    v('passed', '') if k == 'emit' else None\n"
                               "                except BaseException:\n                    pass\n"
                               "        f = f.f_back\n    return None\n",
    # --- suite forms main did not run at all (any program passed them) -----------------------
    "nothing_at_all": "def task_func(n):\n    return None\n",
}

#: The suites each program is scored against (name -> text).
SUITES = {"mock": MOCK_SUITE, "plain": PLAIN_SUITE, "forms": FORMS_SUITE}
