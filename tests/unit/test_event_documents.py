"""The committed JSON Schemas and AsyncAPI document match the models."""

from __future__ import annotations

import json
from pathlib import Path

from shared.events import CATALOG
from shared.events.schema_export import render_documents

DOCS = Path(__file__).parents[2] / "docs" / "events"


def test_committed_event_documents_match_the_models() -> None:
    """If this fails, run `spotrain schema` and commit docs/events."""
    expected = render_documents()
    committed = {str(path.relative_to(DOCS)): path.read_text() for path in DOCS.rglob("*.json")}
    assert sorted(committed) == sorted(expected), "stale or missing files in docs/events"
    stale = [name for name, content in expected.items() if committed[name] != content]
    assert stale == [], f"out of date: {stale}; run `spotrain schema`"


def test_the_asyncapi_document_has_a_channel_and_message_per_event_type() -> None:
    document = json.loads(render_documents()["asyncapi.json"])
    assert document["asyncapi"] == "3.0.0"
    addresses = {channel["address"] for channel in document["channels"].values()}
    # A request's channel ends in its sender: a parameter, where its filter has `>`.
    assert addresses == {spec.subject().replace(".>", ".{sender}") for spec in CATALOG.values()}
    requested = document["channels"]["job.requested"]
    assert requested["address"] == "spotrain.job.requested.{sender}"
    assert "sender" in requested["parameters"]
    assert {m["name"] for m in document["components"]["messages"].values()} == set(CATALOG)
    for message in document["components"]["messages"].values():
        ref = message["payload"]["$ref"].rsplit("/", 1)[1]
        assert (
            document["components"]["schemas"][ref]["properties"]["type"]["const"] == message["name"]
        )
