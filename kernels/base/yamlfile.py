"""Every YAML file the lab reads (studies, cluster profiles, sweeps, paper/plan.yaml, paper/systems.yaml), read
strictly: a key given twice in one mapping is an error naming both lines, never "the last one wins" (a study with
`gpus: [1, 2]` and later `gpus: [4]` would silently lose two points), and a syntax error is one line naming
file:line:column instead of a parser traceback. And a time is text: YAML 1.1 reads an unquoted `12:00:00` as the
base-60 number 43200 (PyYAML follows it; YAML 1.2 dropped it), which a Slurm time limit would take as 43200 minutes.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from kernels.base.errors import ConfigError


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key, first_line: int, second_line: int):
        super().__init__(f"key '{key}' is given twice, on lines {first_line} and {second_line}; keep one")
        self.problem = str(self)
        self.problem_mark = None
        self.line = second_line


NUMBERS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key repeated within one mapping and reads 1:30:00 as text, not base 60."""

    def resolve(self, kind, value, implicit):
        tag = super().resolve(kind, value, implicit)
        if kind is yaml.ScalarNode and implicit[0] and tag in NUMBERS and ":" in value:
            return "tag:yaml.org,2002:str"
        return tag

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<' merges may repeat
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base class reports it
                if first is not None:
                    raise DuplicateKey(key, first, key_node.start_mark.line + 1)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def loads(text: str, where: str = "<string>"):
    """Parse YAML text strictly; errors are ConfigError naming `where`:line[:column]."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except DuplicateKey as e:
        raise ConfigError(f"{where}:{e.line}: {e.problem}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{at}: YAML syntax error: {problem}") from None


def read(path: Path, what: str = "") -> dict:
    """A YAML file holding a mapping (empty file: {}); errors name the file, and `what` it is."""
    path = Path(path)
    where = f"{what + ' ' if what else ''}{path}"
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not a text file ({e.reason} at byte {e.start}); pass the YAML file") from None
    data = loads(text, where) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: holds a {type(data).__name__}, not a mapping of key: value")
    return data
