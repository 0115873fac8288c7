"""The house's shape: imports in kernels/ point down the layers, no module imports itself back through a
circle, no function needs a scroll bar, and the loop stays the loop.

Imports are read with `ast` from the source, those inside functions included (a late import is still a
dependency). The layers are listed once, here and in docs/architecture.md.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"

# The layers are kernels/'s folders, from the bottom up; a module may import its own layer and the layers below.
# The loop and the command-line entry points are the only modules at the top of kernels/ (TOP_LEVEL).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("base",)),
    ("records", ("records",)),
    ("analysis", ("analysis",)),
    ("data", ("data",)),
    ("workloads", ("workloads",)),
    ("run parts", ("engines", "run", "profiling")),
    ("core", ()),
    ("launch", ("launch",)),
    ("comm", ("comm",)),
    ("slurm", ("slurm",)),
    ("notebook", ("notebook",)),
    ("report", ("report",)),
    ("entry", ()),
]
TOP_LEVEL = {"kernels": "base", "kernels.ddp_core": "core", "kernels.train": "launch", "kernels.cli": "entry"}

MAX_FUNCTION_LINES = 100  # lines as the formatter lays them out: a long literal holds one item per line
MAX_CORE_LINES = 300


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(KERNELS.rglob("*.py"))}


def layer_of(module: str) -> int:
    names = [name for name, _ in LAYERS]
    if module in TOP_LEVEL:
        return names.index(TOP_LEVEL[module])
    folder = module.split(".")[1]
    for i, (_, folders) in enumerate(LAYERS):
        if folder in folders:
            return i
    raise AssertionError(
        f"{module} is in no layer: kernels/{folder}/ is not in LAYERS in {Path(__file__).name} "
        "(add it there and in docs/architecture.md)"
    )


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The kernels modules `module` imports (anywhere in its source), as module names."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, the module mod
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in found if m in known and m != module}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer_and_imports_only_downwards():
    g = graph()
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
        for m, deps in g.items()
        for d in sorted(deps)
        if layer_of(d) > layer_of(m)
    ]
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_no_import_circle():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_find_what_they_look_for():
    """Negative controls: a circle and an upward import are found in a graph made to have them."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("kernels.report.scaling") > layer_of("kernels.ddp_core") > layer_of("kernels.base.params")
    known = {"kernels.ddp_core": None, "kernels.report": None, "kernels.report.scaling": None}
    src = ROOT / "kernels" / "ddp_core.py"
    assert imports_of("kernels.ddp_core", src, {**modules(), **known}) >= {"kernels.run.parts", "kernels.run.record"}


def test_the_code_passes_the_linter_and_the_formatter():
    """`ruff check` with the rules in pyproject.toml (pycodestyle and pyflakes, lines of at most 120 characters),
    and `ruff format --check`: the code is laid out as the formatter lays it out (`ruff format .` fixes it)."""
    from ruff.__main__ import find_ruff_bin

    for args in (["check", "--output-format", "concise", "."], ["format", "--check", "."]):
        p = subprocess.run([find_ruff_bin(), *args], cwd=ROOT, capture_output=True, text=True)
        assert p.returncode == 0, f"ruff {args[0]}:\n" + p.stdout[-3000:] + p.stderr[-2000:]


def test_no_function_needs_a_scroll_bar():
    long = []
    for path in sorted(KERNELS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_loop_is_short_and_names_no_workload_dataset_or_engine():
    core = (KERNELS / "ddp_core.py").read_text()
    assert len(core.splitlines()) <= MAX_CORE_LINES
    from kernels.data import DATASETS
    from kernels.engines import ENGINES
    from kernels.workloads import WORKLOADS

    names = {*DATASETS, *ENGINES, *WORKLOADS} - {"ddp"}  # "ddp" is also the file's own name
    code = "\n".join(line.split("#")[0] for line in core.splitlines())  # comments may name things
    body = code[code.index('"""', 3) + 3 :]  # past the module docstring
    quoted = {n for n in names if re.search(rf"[\"']{re.escape(n)}[\"']", body)}
    assert not quoted, f"kernels/ddp_core.py branches on names: {quoted}"


def test_only_the_loop_and_the_entry_points_sit_at_the_top_of_kernels():
    top = {module_name(p) for p in KERNELS.glob("*.py")}
    assert top == set(TOP_LEVEL), f"at the top of kernels/, not in a layer's folder: {top - set(TOP_LEVEL)}"
    folders = {p.name for p in KERNELS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {f for _, fs in LAYERS for f in fs}, folders ^ {f for _, fs in LAYERS for f in fs}


@pytest.mark.parametrize("layer", [name for name, _ in LAYERS])
def test_the_architecture_doc_names_each_layer(layer):
    section = (ROOT / "docs" / "architecture.md").read_text()
    assert layer in section


@pytest.mark.integration
def test_trace_runs_records_bit_exact_losses_and_tells_a_one_bit_change(tmp_path):
    """benchmarks/trace_runs.py, the evidence that a restructuring changed no arithmetic: a recording equals
    itself, and a copy with one loss changed in its last bit is reported as different."""
    tool = ROOT / "benchmarks" / "trace_runs.py"
    out = tmp_path / "a.json"
    p = subprocess.run(
        [sys.executable, str(tool), "record", str(out), "--only", "resnet18-1rank"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    run = json.loads(out.read_text())["runs"]["resnet18-1rank"]
    losses = run["losses"]["rank0"]
    assert len(losses) > 8 and all(x.startswith(("0x1.", "-0x1.")) for x in losses)  # float.hex, bit-exact
    assert run["record"]["summary"]["status"] == "complete" and run["weights"]["global_step"] == 16
    same = subprocess.run([sys.executable, str(tool), "compare", str(out), str(out)], capture_output=True, text=True)
    assert same.returncode == 0 and "resnet18-1rank: identical" in same.stdout, same.stdout
    doc = json.loads(out.read_text())
    x = float.fromhex(losses[3])
    doc["runs"]["resnet18-1rank"]["losses"]["rank0"][3] = (x + x * 2**-52).hex()  # the last mantissa bit
    (tmp_path / "b.json").write_text(json.dumps(doc))
    diff = subprocess.run(
        [sys.executable, str(tool), "compare", str(out), str(tmp_path / "b.json")], capture_output=True, text=True
    )
    assert diff.returncode == 1 and "DIFFERS in losses" in diff.stdout, diff.stdout


# the one place outside kernels/workloads/ that may name a workload, and why
NAMES_A_WORKLOAD = {"kernels/base/params.py": "the workload parameter's default"}


def named_workloads(src: str, names: set[str]) -> set[str]:
    """The workload names `src` uses in code: a word of an identifier, or a whole string literal (a URL or a message
    naming the public DCRNN repository is no use of the lab's workload); docstrings and comments left out."""
    tree = ast.parse(src)
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    words = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            words.add(n.value.strip().lower())
        elif isinstance(n, ast.Name):
            words |= set(n.id.lower().split("_"))
        elif isinstance(n, ast.Attribute):
            words |= set(n.attr.lower().split("_"))
    return words & names


def test_only_the_workloads_name_a_workload():
    """A workload brings its criteria, record fields and paper section through its spec (Workload.reporting); no
    module outside kernels/workloads/ names one, so a new workload needs no change elsewhere."""
    from kernels.workloads import WORKLOADS

    found = {}
    for name, path in modules().items():
        rel = str(path.relative_to(ROOT))
        if name.startswith("kernels.workloads") or rel in NAMES_A_WORKLOAD:
            continue
        hit = named_workloads(path.read_text(), set(WORKLOADS))
        if hit:
            found[rel] = sorted(hit)
    assert not found, f"modules outside kernels/workloads/ name a workload: {found}"
    # a negative control: the check finds a name in code, not in a docstring or a comment
    assert named_workloads('"""dcrnn"""\nx = 1  # dcrnn\ny = f(w == "dcrnn")\n', set(WORKLOADS)) == {"dcrnn"}
