"""Read a YAML file into a pydantic model, with one clear error that lists every problem."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


def format_errors(error: ValidationError) -> str:
    """One line per problem: ``field.path: message``."""
    lines = []
    for err in error.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def load_yaml_model(
    path: str | Path, model: type[ModelT], error: type[ValueError], what: str
) -> ModelT:
    """Validate ``path``'s YAML mapping as ``model``; problems raise ``error`` naming ``what``."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except (FileNotFoundError, IsADirectoryError) as e:
        raise error(f"{p}: no such file ({what})") from e
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML: {e}") from e
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise error(f"{p}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise error(f"{p}: invalid {what}:\n{format_errors(e)}") from e
