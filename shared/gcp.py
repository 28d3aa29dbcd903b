"""How a Google Cloud client is pointed at an endpoint: Google's own with application
default credentials, or another (a local fake, an emulator) given as a URL."""

from __future__ import annotations

from typing import Any

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials


def client_kwargs(api_endpoint: str | None) -> dict[str, Any]:
    """The REST client's keyword arguments for `api_endpoint` (None: Google's). An
    `http://` endpoint gets anonymous credentials, so no real credential travels
    unencrypted."""
    if api_endpoint is None:
        return {"transport": "rest"}
    plain_http = api_endpoint.startswith("http://")
    return {
        "credentials": AnonymousCredentials() if plain_http else None,  # type: ignore[no-untyped-call]
        "transport": "rest",
        "client_options": ClientOptions(api_endpoint=api_endpoint),
    }
