"""Read a YAML file into a pydantic model, with one clear error that lists every problem."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


def load_yaml_model(
    path: str | Path, model: type[ModelT], error: type[ValueError], what: str
) -> ModelT:
    """Validate ``path``'s YAML mapping as ``model``; problems raise ``error`` naming ``what``."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{what} {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise error(f"{p}: top level must be a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or '(top)'}: {err['msg']}" for err in e.errors()
        )
        raise error(f"{p}: invalid {what}: {problems}") from e
