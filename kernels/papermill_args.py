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

from kernels.errors import ConfigError


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
    try:
        for text in p.get("parameters_base64") or []:
            out.update(yaml.load(base64.b64decode(text), Loader=cli.NoDatesSafeLoader) or {})
        for path in p.get("parameters_file") or []:
            out.update(read_yaml_file(path) or {})
        for text in p.get("parameters_yaml") or []:
            out.update(yaml.load(text, Loader=cli.NoDatesSafeLoader) or {})
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"papermill parameters (-f/-y/-b): {e}") from None
    for name, value in p.get("parameters") or []:
        out[name] = cli._resolve_type(value)
    for name, value in p.get("parameters_raw") or []:
        out[name] = value
    return out


def defaults(notebook: Path) -> dict:
    """The literal assignments of the notebook's parameters cell; ConfigError when it has none."""
    cells = json.loads(Path(notebook).read_text()).get("cells", [])
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
