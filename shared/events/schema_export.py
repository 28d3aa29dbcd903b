"""The event contract as documents: one JSON Schema per event type and an AsyncAPI 3 file.

Generated from the same pydantic models the services validate with, so the documents
cannot drift from the code; a test fails when the committed copies differ.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from shared.events.catalog import CATALOG, DEFAULT_PREFIX, EventSpec

_DRAFT = "https://json-schema.org/draft/2020-12/schema"


def render_documents(prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """File name (relative to the output folder) → file content, deterministic."""
    documents = {
        f"schemas/{spec.type}.json": _dump(_event_schema(spec)) for spec in CATALOG.values()
    }
    documents["asyncapi.json"] = _dump(_asyncapi(prefix))
    return documents


def write_documents(out_dir: Path, prefix: str = DEFAULT_PREFIX) -> list[Path]:
    written = []
    for name, content in render_documents(prefix).items():
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    return written


def _event_schema(spec: EventSpec) -> dict[str, Any]:
    schema = spec.envelope.model_json_schema()
    schema["title"] = spec.model.__name__
    schema["properties"]["type"] = {"const": spec.type, "type": "string"}
    return {"$schema": _DRAFT, **schema}


def _asyncapi(prefix: str) -> dict[str, Any]:
    specs = list(CATALOG.values())
    keys, definitions = models_json_schema(
        [(spec.envelope, "validation") for spec in specs],
        ref_template="#/components/schemas/{model}",
    )
    schemas = dict(definitions.get("$defs", {}))
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for spec in specs:
        name = spec.model.__name__
        ref = keys[(spec.envelope, "validation")]["$ref"]
        schema_key = ref.rsplit("/", 1)[1]
        schemas[schema_key]["properties"]["type"] = {"const": spec.type, "type": "string"}
        channel = f"{spec.model.aggregate}.{spec.model.event}"
        messages[name] = {
            "name": spec.type,
            "title": name,
            "summary": (spec.model.__doc__ or name).strip().splitlines()[0],
            "contentType": "application/json",
            "payload": {"$ref": ref},
        }
        channel_doc = channels.setdefault(channel, _channel(spec, prefix))
        channel_doc["messages"][name] = {"$ref": f"#/components/messages/{name}"}
        operations[f"on{name}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{name}"}],
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "spotrain events",
            "version": _version(),
            "description": (
                "CloudEvents 1.0 structured JSON on NATS JetStream. The envelope `id` is the "
                "`Nats-Msg-Id`; invalid messages go to `<prefix>.dlq.<service>`."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {"host": "127.0.0.1:4222", "protocol": "nats", "description": "spotrain up"}
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }


def _channel(spec: EventSpec, prefix: str) -> dict[str, Any]:
    """A channel's address; a request's ends in its sender, an AsyncAPI parameter."""
    if spec.sender_field is None:
        return {"address": spec.subject(prefix), "messages": {}}
    base = f"{prefix}.{spec.model.aggregate}.{spec.model.event}"
    return {
        "address": f"{base}.{{sender}}",
        "parameters": {
            "sender": {
                "description": f"The sender's name, the event's `{spec.sender_field}`: a "
                "user's credential may publish on its own name only."
            }
        },
        "messages": {},
    }


def _version() -> str:
    try:
        return version("spotrain")
    except PackageNotFoundError:
        return "0.0.0"


def _dump(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
