"""Every example in README.md and docs/*.md runs, and prints what the text says.

The convention the documents follow:

* Every fenced block tagged ``python`` is an example, and runs as it stands: alone, in a
  fresh interpreter (``python file.py`` in an empty working directory), as a reader who
  copies it would run it.  So each example is complete: its imports and its inputs are in
  the block.  Code that is not meant to run is fenced without the ``python`` tag.
* A ``text`` block that follows a Python block, with nothing but blank lines between them,
  is that example's expected standard output, compared line by line (trailing spaces and
  trailing blank lines ignored).  An example without one must run without error.
* An example that imports a framework (directly, or through ``roicore.adapters.<name>``)
  is skipped where that framework is not installed, and fails in CI
  (ROICORE_REQUIRE_FRAMEWORKS=1), as the adapter tests are.
* Every block tagged ``c`` is a program on the C API: it is compiled against the installed
  header and library (``roicore.core.get_include()``, ``get_link_args()``), run, and
  compared with the ``text`` block that follows it, as Python examples are.
* A ``text`` block whose first line is ``$ roicore ...`` is a sample of the command line:
  the command runs and must print the rest of the block, run times such as ``(2.0 s)``
  aside.  It needs the frameworks its ``--frameworks`` names (all of them without it).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from frameworks import framework_installed

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TIMEOUT = 600  # the first Paddle example compiles roicore's Paddle operators

# what an import names -> the framework module it needs
NEEDS = {"paddle": "paddle", "paddle_legacy": "paddle", "tf": "tensorflow",
         "tensorflow": "tensorflow", "keras": "tensorflow", "mxnet": "mxnet", "torch": "torch",
         "torchvision": "torchvision", "openvino": "openvino"}

# what an example must not print: warnings that the example, or roicore, can avoid (the
# frameworks' own import-time notices are not among them)
_STRAY = re.compile(r"AutoGraph could not|will not produce any effect|Traceback|Error in \w+|"
                    r"DeviceCopyWarning|NativeOpsWarning|no variable in your model")
_SECONDS = re.compile(r"\(\d+(?:\.\d+)? s\)")
_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_IMPORT = re.compile(r"^[ \t]*(?:from|import)[ \t]+([\w.]+)", re.M)


@dataclasses.dataclass
class Example:
    document: str
    line: int
    code: str
    expected: str | None

    @property
    def id(self):
        return f"{self.document}:{self.line}"

    @property
    def frameworks(self):
        found = []
        for name in _IMPORT.findall(self.code):
            parts = name.split(".")
            key = parts[2] if parts[:2] == ["roicore", "adapters"] and len(parts) > 2 else parts[0]
            module = NEEDS.get(key)
            if module and module not in found:
                found.append(module)
        return found


def examples(text, document="<text>", language="python"):
    """The examples of a Markdown text in ``language``, each with its expected output, if
    any."""
    found = []
    blocks = list(_FENCE.finditer(text))
    for i, block in enumerate(blocks):
        if block.group(1) != language:
            continue
        expected = None
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        if after and after.group(1) == "text" and not text[block.end():after.start()].strip():
            expected = after.group(2)
        line = text.count("\n", 0, block.start()) + 1
        found.append(Example(document, line, block.group(2), expected))
    return found


@dataclasses.dataclass
class Sample:
    document: str
    line: int
    command: list
    expected: str

    @property
    def id(self):
        return f"{self.document}:{self.line}"

    @property
    def frameworks(self):
        names = ("paddle", "mxnet", "tensorflow", "openvino")
        if "--frameworks" in self.command:
            names = self.command[self.command.index("--frameworks") + 1].split(",")
        return [NEEDS[name] for name in names]


def samples(text, document="<text>"):
    """The command-line samples of a Markdown text: ``text`` blocks opening with ``$ roicore``."""
    found = []
    for block in _FENCE.finditer(text):
        first, _, rest = block.group(2).partition("\n")
        if block.group(1) == "text" and first.startswith("$ roicore "):
            line = text.count("\n", 0, block.start()) + 1
            found.append(Sample(document, line, shlex.split(first[2:]), rest))
    return found


def _normalised(output):
    output = _SECONDS.sub("(N s)", output)
    return "\n".join(line.rstrip() for line in output.rstrip().splitlines())


def _run(command, cwd):
    """Run ``command`` as a user would: in ``cwd``, outside pytest."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)


def _documents():
    for path in DOCUMENTS:
        yield path.read_text(), path.relative_to(REPO).as_posix()


ALL = [e for text, name in _documents() for e in examples(text, name)]
C_EXAMPLES = [e for text, name in _documents() for e in examples(text, name, "c")]
SAMPLES = [c for text, name in _documents() for c in samples(text, name)]


def test_the_documents_hold_examples():
    """README carries a runnable example per adapter, most with their output."""
    readme = [e for e in ALL if e.document == "README.md"]
    assert len(readme) >= 4
    assert sum(e.expected is not None for e in readme) >= 4


def test_reading_the_convention():
    text = ("```python\nprint(1)\n```\n\n```text\n1\n```\n"
            "```python\nimport paddle\nfrom roicore.adapters.tf import roi_pool\n```\nprose\n"
            "```text\nnot an output: prose comes between\n```\n"
            "```\nuntagged: not run\n```\n")
    first, second = examples(text)
    assert (first.code, first.expected, first.line) == ("print(1)\n", "1\n", 1)
    assert second.expected is None and second.frameworks == ["paddle", "tensorflow"]
    (sample,) = samples("```text\n$ roicore parity --frameworks tensorflow --ops roi_align\n"
                        "result: OK (2.5 s)\n```\n")
    assert sample.command == ["roicore", "parity", "--frameworks", "tensorflow", "--ops",
                              "roi_align"]
    assert sample.frameworks == ["tensorflow"]
    assert _normalised(sample.expected) == _normalised("result: OK (17 s)\n")


@pytest.mark.parametrize("example", ALL, ids=[e.id for e in ALL])
def test_example(example, tmp_path):
    for module in example.frameworks:
        framework_installed(module, f"{example.id} needs {module}")
    script = tmp_path / "example.py"
    script.write_text(example.code)
    proc = _run([sys.executable, str(script)], tmp_path)
    assert proc.returncode == 0, (
        f"{example.id} exited with {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    if example.expected is not None:
        assert _normalised(proc.stdout) == _normalised(example.expected), (
            f"{example.id} printed something else than its text block:\n{proc.stdout}")
    stray = _STRAY.findall(proc.stderr)
    assert not stray, f"{example.id} printed {stray} to stderr:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("sample", SAMPLES, ids=[c.id for c in SAMPLES])
def test_command_sample(sample, tmp_path):
    for module in sample.frameworks:
        framework_installed(module, f"{sample.id} needs {module}")
    proc = _run([sys.executable, "-m", "roicore.cli", *sample.command[1:]], tmp_path)
    assert proc.returncode == 0, (
        f"{sample.id} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    assert _normalised(proc.stdout) == _normalised(sample.expected), (
        f"{sample.id}: the command printed something else than its sample:\n{proc.stdout}")


@pytest.mark.parametrize("example", C_EXAMPLES, ids=[e.id for e in C_EXAMPLES])
def test_c_example(example, tmp_path):
    import shutil

    import roicore.core as rc
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler")
    source, program = tmp_path / "example.c", tmp_path / "example"
    source.write_text(example.code)
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", str(source), f"-I{rc.get_include()}",
                    *rc.get_link_args(), "-lm", "-o", str(program)], check=True)
    proc = _run([str(program)], tmp_path)
    assert proc.returncode == 0, f"{example.id} exited with {proc.returncode}: {proc.stdout}"
    assert example.expected is not None, f"{example.id} shows no output"
    assert _normalised(proc.stdout) == _normalised(example.expected)


def test_readme_stays_short():
    """README is user documentation of 300 lines at most; depth goes to docs/."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 300
