"""The Kafka API handlers, one module per API key, and the table built from them.

Each module opens with its version notes and sets `API_KEY`, `MIN_VERSION`, `MAX_VERSION`,
`REQUEST` (the generated request class) and `handle(ctx, request)`; a handler whose request
may need no response (Produce with acks=0) also sets `expects_response(request)`. The
ApiVersions answer is derived from this table, never written by hand.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from wire.messages import API_KEYS

__all__ = ["HANDLERS", "Handler", "unsupported_api_versions_response"]


def _always(_request: Any) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Handler:
    NAME: str
    API_KEY: int
    MIN_VERSION: int
    MAX_VERSION: int
    REQUEST: Any
    handle: Callable[[Any, Any], None]
    expects_response: Callable[[Any], bool]


def _register(module: ModuleType) -> Handler:
    key = module.API_KEY
    low, high = module.REQUEST.VALID_VERSIONS
    assert low <= module.MIN_VERSION <= module.MAX_VERSION <= high, module.__name__
    return Handler(
        NAME=API_KEYS[key],
        API_KEY=key,
        MIN_VERSION=module.MIN_VERSION,
        MAX_VERSION=module.MAX_VERSION,
        REQUEST=module.REQUEST,
        handle=module.handle,
        expects_response=getattr(module, "expects_response", _always),
    )


def _handler_modules() -> list[ModuleType]:
    """Every `kNN_<api>.py` module of this package: adding a handler is adding its file."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if _HANDLER_MODULE.match(m.name))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


_HANDLER_MODULE = re.compile(r"^k\d\d_\w+$")

HANDLERS: dict[int, Handler] = {h.API_KEY: h for h in map(_register, _handler_modules())}

k18_api_versions = importlib.import_module(f"{__name__}.k18_api_versions")
k18_api_versions.bind_table(
    {key: (h.MIN_VERSION, h.MAX_VERSION) for key, h in sorted(HANDLERS.items())}
)
unsupported_api_versions_response = k18_api_versions.unsupported_version_response
