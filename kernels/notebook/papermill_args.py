"""What a notebook run will see as its parameters, known before Papermill starts a kernel.

`injected(args)`: the values Papermill will inject for its command-line arguments, parsed by Papermill's own
command (-p NAME VALUE typed as Papermill types it, -r raw strings, -f YAML files, -y YAML strings, -b base64 YAML,
merged in Papermill's order). `defaults(notebook)`: the literal assignments of the notebook's cell tagged
"parameters". Together they let the runner refuse a misspelt or malformed parameter with the CLI's one-line error
before a kernel, an executed copy or an HTML page exists.
"""

from __future__ import annotations

import ast
import base64
import json
from pathlib import Path

from kernels.base.errors import ConfigError


def injected(args: list[str]) -> dict:
    """{name: value} Papermill injects for these arguments (the notebook paths excluded)."""
    import click
    import yaml
    from papermill import cli
    from papermill.iorw import read_yaml_file

    try:
        ctx = cli.papermill.make_context("papermill", ["in.ipynb", "out.ipynb", *args], resilient_parsing=False)
    except click.ClickException as e:
        raise ConfigError(f"papermill arguments {' '.join(args)!r}: {e.format_message()}") from None
    except click.exceptions.Exit:
        return {}  # --help and the like: Papermill prints and injects nothing
    p = ctx.params
    out: dict = {}
    sources = [
        (f"-b {t[:20]}", lambda t=t: yaml.load(base64.b64decode(t), Loader=cli.NoDatesSafeLoader))
        for t in p.get("parameters_base64") or []
    ]
    sources += [(f"-f {f}", lambda f=f: read_yaml_file(f)) for f in p.get("parameters_file") or []]
    sources += [
        (f"-y {t[:40]!r}", lambda t=t: yaml.load(t, Loader=cli.NoDatesSafeLoader))
        for t in p.get("parameters_yaml") or []
    ]
    for where, read in sources:
        try:
            values = read() or {}
        except (OSError, ValueError, yaml.YAMLError) as e:  # ValueError: not UTF-8, not base64
            raise ConfigError(f"papermill parameters {where}{_why(e)}") from None
        if not isinstance(values, dict):
            raise ConfigError(
                f"papermill parameters {where}: holds a {type(values).__name__}, not a mapping of name: value"
            )
        out.update(values)
    seen: dict = {}
    for flag, key in (("-p", "parameters"), ("-r", "parameters_raw")):
        for name, value in p.get(key) or []:
            if name in seen:
                raise ConfigError(f"parameter '{name}' is given twice ({seen[name]}, {flag} {name} {value}); keep one")
            seen[name] = f"{flag} {name} {value}"
            out[name] = cli._resolve_type(value) if flag == "-p" else value
    return out


def _why(e: Exception) -> str:
    """': reason', with the YAML parser's line:column and problem where it has them."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is not None and problem:
        return f":{mark.line + 1}:{mark.column + 1}: YAML syntax error: {problem}"
    return f": {str(e).splitlines()[0][:200]}"


def defaults(notebook: Path) -> dict:
    """The literal assignments of the notebook's parameters cell; ConfigError when it has none."""
    try:
        cells = json.loads(Path(notebook).read_text()).get("cells", [])
    except (ValueError, AttributeError) as e:  # not UTF-8, not JSON, or JSON that is not a notebook
        raise ConfigError(
            f"{notebook}: not a Jupyter notebook ({str(e).splitlines()[0][:120]}); pass an .ipynb "
            f"file (notebooks/*.ipynb, or `lab notebooks sync` to write them from the .py "
            f"sources)"
        ) from None
    cell = next((c for c in cells if "parameters" in (c.get("metadata", {}).get("tags") or [])), None)
    if cell is None:
        raise ConfigError(f"{notebook}: no cell is tagged 'parameters', so Papermill cannot inject parameters into it")
    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                out[node.targets[0].id] = None  # not a literal: only its name is known here
    return out
