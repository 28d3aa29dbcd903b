"""Operating on the record: choosing a window and event types, reading and writing JSON
lines of events, and re-delivering past events to one service (`spotrain events`)."""

from shared.replay.jsonl import ParsedLine, RejectedLine, parse_lines
from shared.replay.plan import REPLAY_RUN, ReplayCopy, ReplayPlan, plan_replay
from shared.replay.publishing import ImportReport, import_lines, publish_copies
from shared.replay.selection import UnknownEventTypeError, event_types, type_name
from shared.replay.window import moment, window

__all__ = [
    "REPLAY_RUN",
    "ImportReport",
    "ParsedLine",
    "RejectedLine",
    "ReplayCopy",
    "ReplayPlan",
    "UnknownEventTypeError",
    "event_types",
    "import_lines",
    "moment",
    "parse_lines",
    "plan_replay",
    "publish_copies",
    "type_name",
    "window",
]
