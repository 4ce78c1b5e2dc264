"""The tasks: six for ``smoke``, ten harder ones for ``hard``. Each names the function (or class) it wants
and is checked by plain asserts; tests/server/test_code_eval.py proves every assert against a reference answer."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str
    checks: str   # Python run after the answer; an AssertionError (or any error) fails the task


SMOKE = (
    Task("is_prime", "Write a Python function `is_prime(n: int) -> bool` that says whether n is a prime number "
                     "(numbers below 2 are not).",
         "assert [x for x in range(30) if is_prime(x)] == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]\n"
         "assert is_prime(7919) and not is_prime(7917) and not is_prime(-7)"),
    Task("reverse_words", "Write a Python function `reverse_words(s: str) -> str` that returns the words of s in "
                          "reverse order, separated by single spaces (words are separated by any whitespace).",
         "assert reverse_words('the quick  brown fox') == 'fox brown quick the'\n"
         "assert reverse_words('  one ') == 'one' and reverse_words('') == ''"),
    Task("fib", "Write a Python function `fib(n: int) -> int` that returns the n-th Fibonacci number, with fib(0) == 0 "
                "and fib(1) == 1. It must be fast for n up to 1000.",
         "assert [fib(i) for i in range(10)] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n"
         "assert fib(300) == 222232244629420445529739893461909967206666939096499764990979600"),
    Task("count_vowels", "Write a Python function `count_vowels(s: str) -> int` that counts the vowels a, e, i, o, u "
                         "in s, upper or lower case.",
         "assert count_vowels('Hello World') == 3 and count_vowels('AEIOUaeiou') == 10 and count_vowels('xyz') == 0"),
    Task("flatten", "Write a Python function `flatten(xs: list) -> list` that flattens lists nested to any depth, "
                    "keeping the order of the items.",
         "assert flatten([1, [2, [3, [4]], 5], [], [[6]]]) == [1, 2, 3, 4, 5, 6]\n"
         "assert flatten([]) == [] and flatten(['a', ['b']]) == ['a', 'b']"),
    Task("fizzbuzz", "Write a Python function `fizzbuzz(n: int) -> list[str]` that returns the strings for 1 to n: "
                     "'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for both, else the number.",
         "assert fizzbuzz(15) == ['1', '2', 'Fizz', '4', 'Buzz', 'Fizz', '7', '8', 'Fizz', 'Buzz', '11', 'Fizz', '13', "
         "'14', 'FizzBuzz']\nassert fizzbuzz(0) == []"),
)

HARD = (
    Task("roman", "Write two Python functions: `int_to_roman(n: int) -> str` for 1 <= n <= 3999 and "
                  "`roman_to_int(s: str) -> int`, its inverse, with subtractive notation (IV, IX, XL, XC, CD, CM).",
         "assert int_to_roman(1994) == 'MCMXCIV' and int_to_roman(3999) == 'MMMCMXCIX' and int_to_roman(4) == 'IV'\n"
         "assert all(roman_to_int(int_to_roman(i)) == i for i in range(1, 4000))"),
    Task("merge_intervals", "Write a Python function `merge_intervals(intervals: list[list[int]]) -> list[list[int]]` "
                            "that merges overlapping (or touching) closed intervals and returns them sorted by start.",
         "assert merge_intervals([[8, 10], [1, 3], [2, 6], [15, 18]]) == [[1, 6], [8, 10], [15, 18]]\n"
         "assert merge_intervals([[1, 4], [4, 5]]) == [[1, 5]] and merge_intervals([]) == []"),
    Task("eval_expr", "Write a Python function `eval_expr(s: str) -> int` that evaluates an integer expression with "
                      "+, -, *, / and parentheses, with the usual precedence, where / divides integers truncating "
                      "toward zero. Do not use eval or exec.",
         "assert eval_expr('2 + 3 * 4') == 14 and eval_expr('(2 + 3) * 4') == 20 and eval_expr('7 / -2') == -3\n"
         "assert eval_expr(' 10 - 2 - 3 ') == 5 and eval_expr('-(4 - 10) / 4') == 1 and eval_expr('2*(3+(4-1))*2') == 24"),
    Task("lru_cache", "Write a Python class `LRUCache` with `__init__(self, capacity: int)`, `get(self, key) -> int` "
                      "(-1 when the key is missing) and `put(self, key, value) -> None`; putting into a full cache "
                      "evicts the least recently used key (get and put both count as use).",
         "c = LRUCache(2)\nc.put(1, 1); c.put(2, 2)\nassert c.get(1) == 1\nc.put(3, 3)\nassert c.get(2) == -1\n"
         "c.put(4, 4)\nassert c.get(1) == -1 and c.get(3) == 3 and c.get(4) == 4\nc.put(3, 30)\nc.put(5, 5)\n"
         "assert c.get(4) == -1 and c.get(3) == 30"),
    Task("topo_sort", "Write a Python function `topo_sort(n: int, edges: list[tuple[int, int]]) -> list[int] | None` "
                      "that orders the nodes 0..n-1 so that for every edge (a, b) a comes before b, or returns None "
                      "if the edges have a cycle.",
         "order = topo_sort(6, [(5, 2), (5, 0), (4, 0), (4, 1), (2, 3), (3, 1)])\n"
         "assert sorted(order) == list(range(6)) and all(order.index(a) < order.index(b) for a, b in "
         "[(5, 2), (5, 0), (4, 0), (4, 1), (2, 3), (3, 1)])\n"
         "assert topo_sort(3, [(0, 1), (1, 2), (2, 0)]) is None and topo_sort(1, []) == [0]"),
    Task("lcs", "Write a Python function `lcs(a: str, b: str) -> int` that returns the length of the longest common "
                "subsequence of a and b. It must handle strings of 2000 characters in a few seconds.",
         "assert lcs('ABCBDAB', 'BDCABA') == 4 and lcs('', 'abc') == 0 and lcs('abc', 'abc') == 3\n"
         "assert lcs('ab' * 1000, 'ba' * 1000) == 1999"),
    Task("dijkstra", "Write a Python function `dijkstra(n: int, edges: list[tuple[int, int, float]], src: int) -> "
                     "list[float]` for a directed graph with non-negative weights: the shortest distance from src to "
                     "every node 0..n-1, float('inf') where there is no path.",
         "d = dijkstra(5, [(0, 1, 4), (0, 2, 1), (2, 1, 2), (1, 3, 1), (2, 3, 5)], 0)\n"
         "assert d == [0, 3, 1, 4, float('inf')]\nassert dijkstra(1, [], 0) == [0]"),
    Task("rle", "Write two Python functions: `rle_encode(s: str) -> str`, which writes each run of a letter as the "
                "letter and the run's length ('aaab' -> 'a3b1'), and `rle_decode(s: str) -> str`, its inverse "
                "(lengths may have several digits; the text has no digits).",
         "assert rle_encode('aaab') == 'a3b1' and rle_encode('') == '' and rle_encode('x' * 12) == 'x12'\n"
         "assert rle_decode('a3b1') == 'aaab' and rle_decode('x12y1') == 'x' * 12 + 'y'\n"
         "assert rle_decode(rle_encode('hello  world')) == 'hello  world'"),
    Task("balanced", "Write a Python function `balanced(s: str) -> bool` that says whether the brackets (), [] and {} "
                     "in s are balanced and properly nested; other characters are ignored.",
         "assert balanced('([]{()})') and balanced('a(b)c') and balanced('')\n"
         "assert not balanced('(]') and not balanced('((') and not balanced('){') and not balanced('([)]')"),
    Task("spiral", "Write a Python function `spiral(m: list[list[int]]) -> list[int]` that returns the items of a "
                   "rectangular matrix in clockwise spiral order, from the top left.",
         "assert spiral([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [1, 2, 3, 6, 9, 8, 7, 4, 5]\n"
         "assert spiral([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]) == [1, 2, 3, 4, 8, 12, 11, 10, 9, 5, 6, 7]\n"
         "assert spiral([]) == [] and spiral([[1], [2]]) == [1, 2]"),
)

SUITES: dict[str, tuple[Task, ...]] = {"smoke": SMOKE, "hard": HARD}
