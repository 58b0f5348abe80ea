"""Issue 43 finding 2: right code passes every suite form, and a form the scorer cannot judge is
an error that names it ("unsupported test form: ..."), never a silent 0 or 1.

Unittest suites: aliases, classes under ``if``, ``unittest.main()`` footers, class and module
fixtures (run as unittest runs them), subtests, mocks patched into the program's module, results
that cannot cross to the trusted harness. Function-call tests: ints over 4,300 digits,
generators, in-place mutation, objects of the candidate's own class.
"""

from __future__ import annotations

import asyncio

import pytest

from collab_env.errors import DataSchemaError
from collab_env.rewards.metrics import get_metric
from collab_env.sandbox import harness
from collab_env.sandbox.harness import find_unittest_methods, run_tests
from collab_env.types import Conversation, Message

RIGHT = "def task_func(n):\n    return [i * i for i in range(n)]\n"
WRONG = "def task_func(n):\n    return [i * 2 for i in range(n)]\n"  # right for n <= 3 only at 0 and 2

FIXTURES = '''
import unittest

STATE = []


def setUpModule():
    STATE.append("module")


def tearDownModule():
    STATE.clear()


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.n = 4 if STATE == ["module"] else -1

    def setUp(self):
        self.expected = [0, 1, 4, 9]

    def test_base(self):
        self.assertEqual(task_func(self.n), self.expected)


class Child(Base):
    def test_subtests(self):
        for n in range(4):
            with self.subTest(n=n):
                self.assertEqual(task_func(n), self.expected[:n])
{footer}'''

FOOTERS = {
    "main_guard": '\nif __name__ == "__main__":\n    unittest.main()\n',
    "bare_main": "\nunittest.main(exit=False)\n",
    "from_import_main": "\nfrom unittest import main\nmain()\n",
    "none": "\n",
}


@pytest.mark.parametrize("footer", sorted(FOOTERS))
@pytest.mark.parametrize("mocks", [False, True], ids=["trusted", "beside"])
def test_fixtures_subtests_and_footers_run_as_unittest_runs_them(footer, mocks):
    tests = FIXTURES.format(footer=FOOTERS[footer])
    if mocks:  # the same suite, but importing mocks: it runs beside the program
        tests = "from unittest import mock\n" + tests
    assert find_unittest_methods(tests) == [("Base", "test_base"), ("Child", "test_base"), ("Child", "test_subtests")]
    right = run_tests(RIGHT, tests)
    assert right.status == "passed" and right.pass_rate == 1.0, right
    wrong = run_tests(WRONG, tests)
    assert wrong.pass_rate == 0.0 and wrong.status == "failed", wrong  # task_func(4) and n=3 differ


SETUP_CLASS_FAILS = '''
import unittest

class T(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise RuntimeError("no database")

    def test_a(self):
        self.assertEqual(task_func(2), [0, 1])
'''


@pytest.mark.parametrize("prefix", ["", "import unittest.mock\n"], ids=["trusted", "beside"])
def test_a_failing_class_fixture_fails_its_methods_and_is_not_tampering(prefix):
    res = run_tests(RIGHT, prefix + SETUP_CLASS_FAILS)
    assert res.status == "failed" and res.pass_rate == 0.0 and res.tampered == 0, res
    assert "no database" in res.detail


MOCKED = '''
import os
import unittest
from unittest.mock import patch


class T(unittest.TestCase):
    @patch("__main__.helper", return_value=10)
    def test_patched_helper(self, helper):
        self.assertEqual(task_func(2), 12)
        helper.assert_called_once_with(2)

    @patch("os.getcwd")
    def test_returns_the_tests_mock(self, getcwd):
        self.assertEqual(where(), getcwd.return_value)
        self.assertIs(where(), getcwd.return_value)

    def test_unpatched(self):
        self.assertEqual(task_func(3), 3 * 3 + 3)
'''
MOCKED_RIGHT = ("import os\n\ndef helper(n):\n    return n * n\n\ndef task_func(n):\n    return helper(n) + n\n\n"
                "def where():\n    return os.getcwd()\n")


def test_mocks_patched_into_the_programs_module_work_beside_it():
    res = run_tests(MOCKED_RIGHT, MOCKED)
    assert res.status == "passed" and res.pass_rate == 1.0, res
    wrong = run_tests(MOCKED_RIGHT.replace("helper(n) + n", "helper(n) + 1"), MOCKED)
    assert wrong.num_passed == 1, wrong  # only test_returns_the_tests_mock


NOT_PLAIN = '''
import datetime
import unittest


class T(unittest.TestCase):
    def test_date(self):
        d = task_func(2024)
        self.assertIsInstance(d, datetime.date)
        self.assertEqual(d, datetime.date(2024, 1, 1))
        self.assertTrue(d.year == 2024)
'''


def test_a_suite_whose_results_cannot_cross_runs_beside_the_program():
    right = "import datetime\n\ndef task_func(y):\n    return datetime.date(y, 1, 1)\n"
    assert run_tests(right, NOT_PLAIN).passed
    assert not run_tests(right.replace("1, 1)", "1, 2)"), NOT_PLAIN).passed


TEST_CLASSES = '''
import unittest
from unittest import mock


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, other):
        return isinstance(other, Pair) and (self.a, self.b) == (other.a, other.b)


class T(unittest.TestCase):
    def test_pairs(self):
        self.assertEqual(Pair(*task_func(2)), Pair(0, 1))
        self.assertNotEqual(Pair(*task_func(3)[:2]), Pair(1, 1))
        assert Pair(0, 1) == Pair(*task_func(2))
'''


def test_classes_of_the_tests_compare_as_the_tests_wrote_them_beside_the_program():
    assert run_tests(RIGHT, TEST_CLASSES).passed
    assert not run_tests(WRONG.replace("i * 2", "i + 5"), TEST_CLASSES).passed


UNSUPPORTED = {
    "a TestCase class defined inside a function": (
        "import unittest\ndef make():\n    class T(unittest.TestCase):\n        def test_a(self):\n"
        "            pass\n    return T\nT = make()\n"),
    "the load_tests protocol": (
        "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        pass\n"
        "def load_tests(loader, tests, pattern):\n    return tests\n"),
    "a test method bound by assignment": (
        "import unittest\ndef check(self):\n    self.assertEqual(task_func(1), [0])\n"
        "class T(unittest.TestCase):\n    test_a = check\n"),
    "a test runner started when the tests load": (
        "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        pass\n"
        "unittest.TextTestRunner().run(unittest.defaultTestLoader.loadTestsFromTestCase(T))\n"),
}


@pytest.mark.parametrize("form", sorted(UNSUPPORTED))
def test_an_unsupported_suite_form_is_an_error_that_names_it(form):
    tests = UNSUPPORTED[form]
    assert harness.test_style(tests) == "unittest"
    for code in (RIGHT, WRONG):
        res = run_tests(code, tests)
        assert res.status == "error" and res.detail.startswith("unsupported test form: ") and form in res.detail, res
        assert res.pass_rate == 0.0 and not res.passed
    chat = Conversation((Message("user", "write it", author="user"),
                         Message("assistant", f"```python\n{RIGHT}```", author="assistant")))
    with pytest.raises(DataSchemaError, match="unsupported test form"):
        asyncio.run(get_metric("pass_rate")(chat, {"single_turn_metadata": {"test": tests}}))


# ---------------------------------------------------------------------------------------------
# Function-call tests: what crosses from the candidate to the trusted harness
# ---------------------------------------------------------------------------------------------
CALLS_RIGHT = '''
def power(b, e):
    return b ** e

def squares(n):
    for i in range(n):
        yield i * i

def sort_in_place(xs):
    xs.sort()

def add_key(d, k):
    d.setdefault("rows", []).append(k)
    d[k] = True
'''
CALLS_TESTS = [
    "assert power(10, 5000) == 10 ** 5000 and power(-7, 6001) % 10 == 3",  # ints over 4,300 digits
    "assert power(2, 20000) % 1000 == 376 and power(2, 20000) >> 19999 == 2",
    "assert list(squares(4)) == [0, 1, 4, 9]",
    "g = squares(3)\nassert next(g) == 0 and next(g) == 1 and list(g) == [4]",
    "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
    "d = {'rows': [0]}\nrows = d['rows']\nadd_key(d, 'k')\n"
    "assert d == {'rows': [0, 'k'], 'k': True} and rows == [0, 'k']",
]


def test_big_ints_generators_and_in_place_mutation_cross_as_plain_data():
    res = run_tests(CALLS_RIGHT, CALLS_TESTS)
    assert [t.status for t in res.tests] == ["passed"] * len(CALLS_TESTS), res.tests
    wrong = CALLS_RIGHT.replace("xs.sort()", "xs = sorted(xs)").replace("b ** e", "b ** e + 1").replace(
        "d[k] = True", "d = {}")
    res = run_tests(wrong, CALLS_TESTS)
    assert [t.status for t in res.tests] == ["failed", "failed", "passed", "passed", "failed", "failed"], res.tests


@pytest.mark.parametrize("tests", [
    ["assert Solution().twice(2) == 4"],
    ["s = Stack()\ns.push(1)\nassert s.pop() == 1"],
    ["assert isinstance(make_point(1, 2), Point)"],
])
def test_objects_of_the_candidates_class_are_an_unsupported_form_of_call_tests(tests):
    code = ("class Solution:\n    def twice(self, x):\n        return 2 * x\n"
            "class Stack(list):\n    def push(self, x):\n        self.append(x)\n"
            "class Point(tuple):\n    pass\ndef make_point(x, y):\n    return Point((x, y))\n")
    res = run_tests(code, tests)
    assert res.status == "error" and res.detail.startswith("unsupported test form: "), res
    assert not res.passed and res.pass_rate == 0.0
