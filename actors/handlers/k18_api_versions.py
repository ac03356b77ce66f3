"""ApiVersions (key 18), versions 0-3.

v0: the API table. v1+: throttle time. v3: flexible body (compact arrays, tag buffers) and the
client's software name/version; the response header stays v0 even at v3 (KIP-511).
A request above v3 is answered by the connection with UNSUPPORTED_VERSION and a v0 body
listing our ranges, so the client retries at a version both sides know (CLIENTS.md gotcha 1).
"""

from __future__ import annotations

from typing import Any

from wire.errors import ErrorCode
from wire.messages.api_versions import ApiVersionsRequest, ApiVersionsResponse

ApiVersion = ApiVersionsResponse.ApiVersion

API_KEY = 18
MIN_VERSION = 0
MAX_VERSION = 3
REQUEST = ApiVersionsRequest

_table: dict[int, tuple[int, int]] = {}


def bind_table(table: dict[int, tuple[int, int]]) -> None:
    """Set the (min, max) version of every handled API; called once by the registry."""
    _table.clear()
    _table.update(table)


def _api_keys() -> list[ApiVersion]:
    return [
        ApiVersion(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in _table.items()
    ]


def handle(ctx: Any, request: ApiVersionsRequest) -> None:
    ctx.respond(ApiVersionsResponse(error_code=ErrorCode.NONE, api_keys=_api_keys()))


def unsupported_version_response() -> ApiVersionsResponse:
    """The answer to an ApiVersions request above our max, to be encoded as v0."""
    return ApiVersionsResponse(error_code=ErrorCode.UNSUPPORTED_VERSION, api_keys=_api_keys())
