"""The tasks of scripts/bench-agents: each a throwaway repository (its files), the request an
agent gets, and a check that runs on the folder afterwards (file contents, a test run, a
program's output), never on the model's words. Small on purpose: a 1.5B model on two CPU cores
should be able to finish each in a few turns."""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass
class Task:
    name: str
    files: dict
    prompt: str
    check: Callable[[Path], tuple]


def read(repo: Path, name: str) -> str:
    try:
        return (repo / name).read_text()
    except OSError:
        return ""


def python(repo: Path, *args: str) -> tuple:
    """(exit status, output) of a Python program in the repository."""
    try:
        r = subprocess.run([sys.executable, *args], cwd=repo, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    return r.returncode, (r.stdout + r.stderr).strip()


def verdict(ok: bool, why: str) -> tuple:
    return ok, ("ok" if ok else why)[:200]


def create_file(repo):
    text = read(repo, "hello.txt")
    return verdict(text.strip() == "Hello, Perch!", f"hello.txt holds {text[:80]!r}")


def fix_test(repo):
    rc, out = python(repo, "-m", "unittest", "-q", "test_calc")
    untouched = "assertEqual(add(2, 3), 5)" in read(repo, "test_calc.py")
    return verdict(rc == 0 and untouched, f"tests: exit {rc}: {out[-120:]}; test file untouched: {untouched}")


def rename_function(repo):
    both = read(repo, "geometry.py") + read(repo, "main.py")
    rc, out = python(repo, "main.py")
    ok = "def rectangle_area(" in both and "compute_area" not in both and rc == 0 and out == "12"
    return verdict(ok, f"compute_area left: {'compute_area' in both}; main.py: exit {rc} {out[-80:]!r}")


def add_cli_flag(repo):
    rc1, loud = python(repo, "greet.py", "--name", "Ada", "--shout")
    rc2, plain = python(repo, "greet.py", "--name", "Ada")
    ok = (rc1, loud, rc2, plain) == (0, "HELLO, ADA!", 0, "Hello, Ada!")
    return verdict(ok, f"--shout: {rc1} {loud[-60:]!r}; plain: {rc2} {plain[-60:]!r}")


def answer_question(repo):
    text = read(repo, "answer.txt").strip().rstrip(".")
    return verdict(text == "7", f"answer.txt holds {text[:80]!r}")


def add_function(repo):
    rc, out = python(repo, "-c", "import mathutils; print(mathutils.square(7), mathutils.cube(2))")
    return verdict(rc == 0 and out == "49 8", f"exit {rc}: {out[-120:]!r}")


def fix_typo(repo):
    text = read(repo, "README.md")
    ok = "Teh " not in text and text.count("The quick tool") == 2 and "## Usage" in text
    return verdict(ok, f"README.md: {text[:120]!r}")


def add_dependency(repo):
    lines = [line.strip() for line in read(repo, "requirements.txt").splitlines() if line.strip()]
    return verdict(lines == ["requests==2.32.3", "rich==13.7.1", "pytest==8.3.3"], f"requirements.txt: {lines}")


TASKS = [
    Task("create-file", {"README.md": "A scratch project.\n"},
         "Create a file named hello.txt whose whole content is exactly: Hello, Perch!", create_file),
    Task("fix-failing-test", {
        "calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
        "test_calc.py": "import unittest\n\nfrom calc import add, mul\n\n\nclass CalcTest(unittest.TestCase):\n"
                        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
                        "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n\n"
                        "if __name__ == \"__main__\":\n    unittest.main()\n"},
         "The unit test in test_calc.py fails. Fix the bug in calc.py so that it passes. Do not change test_calc.py.",
         fix_test),
    Task("rename-function", {
        "geometry.py": "def compute_area(width, height):\n    return width * height\n",
        "main.py": "from geometry import compute_area\n\nprint(compute_area(3, 4))\n"},
         "Rename the function compute_area to rectangle_area in geometry.py and update main.py, which uses it.",
         rename_function),
    Task("add-cli-flag", {
        "greet.py": "import argparse\n\nparser = argparse.ArgumentParser()\nparser.add_argument(\"--name\", required=True)\n"
                    "args = parser.parse_args()\nmessage = f\"Hello, {args.name}!\"\nprint(message)\n"},
         "Add a --shout flag to greet.py: when it is given, the greeting is printed in upper case "
         "(python greet.py --name Ada --shout prints HELLO, ADA!). Without it nothing changes.",
         add_cli_flag),
    Task("answer-question", {
        "config.py": "HOST = \"localhost\"\nPORT = 8080\nMAX_RETRIES = 7\nTIMEOUT_S = 30\n",
        "client.py": "from config import MAX_RETRIES\n\n\ndef fetch(url):\n    for attempt in range(MAX_RETRIES):\n        pass\n"},
         "How many times does client.py retry a fetch? Read the code, then write only the number into a new file answer.txt.",
         answer_question),
    Task("add-function", {"mathutils.py": "def square(x):\n    return x * x\n"},
         "Add a function cube(x) to mathutils.py that returns x to the power of three. Keep square as it is.",
         add_function),
    Task("fix-typo", {
        "README.md": "# Tool\n\nTeh quick tool does one thing.\n\n## Usage\n\nTeh quick tool reads stdin.\n"},
         "README.md misspells 'The' as 'Teh' in two places. Fix both; change nothing else.",
         fix_typo),
    Task("add-dependency", {"requirements.txt": "requests==2.32.3\nrich==13.7.1\n"},
         "Add pytest version 8.3.3 to requirements.txt, pinned the same way as the others, as the last line.",
         add_dependency),
]
