"""YAML as fedray reads it (config files, overrides, run directories' ``config.yaml``)."""

from __future__ import annotations

import re

import yaml

__all__ = ["yaml_load"]


class _Loader(yaml.SafeLoader):
    """YAML loader that also reads ``1e-3`` as a float (plain PyYAML follows YAML 1.1 and returns the
    string '1e-3' unless there is a dot), since hyper-parameters are usually written that way, and that
    refuses a key written twice in one mapping (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)
                 |[-+]?(?:[0-9][0-9_]*)\.[0-9_]*
                 |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                 |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def yaml_load(text: str):
    return yaml.load(text, Loader=_Loader)
