"""What an operator asks a pipeline run to do (the DAG's trigger form, REST conf or CLI), validated.

BatchRequest declares the request once: its fields' titles, descriptions and form sections (Field metadata)
make the DAG's trigger form (trigger_form_fields(), which airflow_dag turns into Airflow Params).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kafka_ledger.model.ranges import OffsetRange
from kafka_ledger.model.refusals import Refusal

Mode = Literal["catch_up", "offset_ranges", "time_window", "replay_batch"]
# Where the trigger form shows a pipeline's first topic (an example in a field's description).
EXAMPLE_TOPIC = "<topic>"


def as_utc(value: datetime) -> datetime:
    """A date-time with its zone; one without a zone is UTC, as everywhere in the ledger (never the machine's)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


class RequestError(ValueError, Refusal):
    """The request is invalid; nothing was written. The message is the reason alone: callers say "refused"."""


class RangeRequest(BaseModel):
    """Offsets [from, until) of one partition, as typed in the form or sent in the run conf."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # The form's schema states the bounds that _ordered checks: as schema only, since the validator says in
    # its own words what is wrong (ge=0 would refuse first, in pydantic's).
    topic: str = Field(min_length=1)
    partition: int = Field(json_schema_extra={"minimum": 0})
    from_offset: int = Field(alias="from", json_schema_extra={"minimum": 0})
    until_offset: int = Field(alias="until", json_schema_extra={"minimum": 0})

    @model_validator(mode="after")
    def _ordered(self) -> RangeRequest:
        where = f"{self.topic}-{self.partition}"
        if self.partition < 0:
            raise ValueError(f"{where}: partition numbers start at 0")
        if self.from_offset < 0 or self.until_offset < 0:
            raise ValueError(
                f"{where}: offsets cannot be negative (from {self.from_offset}, until {self.until_offset})"
            )
        if self.from_offset >= self.until_offset:
            raise ValueError(
                f"{where}: from {self.from_offset} must be below until {self.until_offset} "
                "(until is exclusive, as in Kafka)"
            )
        return self

    def to_range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.from_offset, self.until_offset)


class BatchRequest(BaseModel):
    """One run's instruction. Unknown keys are refused so a typo never silently means catch_up."""

    model_config = ConfigDict(extra="forbid")

    # In the trigger form's order. json_schema_extra holds the form's own keywords (its section, the modes'
    # display names); "markdown" marks a description the form renders as Markdown (Airflow's description_md).
    mode: Mode = Field(
        default="catch_up",
        title="What to read",
        description="**catch_up** is what scheduled runs do. The other modes re-read offsets the pipeline has "
                    "already committed and *replace* their rows and dead letters in one transaction (use them "
                    "after fixing a transform); they never move the committed positions, except replaying the "
                    "pipeline's own unfinished batch, which completes it.",
        json_schema_extra={
            "section": "Run",
            "markdown": True,
            "values_display": {
                "catch_up": "Catch up: from the committed positions to the latest offsets",
                "offset_ranges": "Offset ranges: re-read and replace the ranges below",
                "time_window": "Time window: re-read and replace what Kafka timestamps put in the window",
                "replay_batch": "Replay a batch: re-read and replace a recorded batch's ranges",
            },
        },
    )
    reason: str = Field(default="", title="Reason (optional)",
                        description="Recorded in the ledger with the batch (who asked, and why).",
                        json_schema_extra={"section": "Run"})
    ranges: list[RangeRequest] = Field(
        default_factory=list,
        title="Offset ranges (mode offset_ranges)",
        description="One object per partition; `until` is exclusive, as in Kafka. Example: "
                    f'`[{{"topic": "{EXAMPLE_TOPIC}", "partition": 0, "from": 100, "until": 200}}]`',
        json_schema_extra={"section": "Offset ranges", "markdown": True},
    )
    window_from: datetime | None = Field(default=None, title="From (inclusive, UTC)",
                                         description="Mode time_window: first Kafka record timestamp of the window.",
                                         json_schema_extra={"section": "Time window"})
    window_to: datetime | None = Field(default=None, title="To (exclusive, UTC)",
                                       description="Mode time_window: end of the window.",
                                       json_schema_extra={"section": "Time window"})
    # minimum: as schema only, for the same reason as RangeRequest's bounds.
    batch_id: int | None = Field(default=None, title="Batch id (mode replay_batch)",
                                 description="A batch id from `kafka-ledger batches <pipeline>` or the ledger.",
                                 json_schema_extra={"section": "Replay", "minimum": 1})
    reader_schema: Literal["batch", "newest"] = Field(
        default="batch", title="Reader schema (Avro values, mode replay_batch)",
        description="**batch**: decode with the reader schema the replayed batch was read with, exactly as it was; "
                    "**newest**: with the newest version of the topic's subject (recorded so in the ledger). The "
                    "other modes always read with the newest.",
        json_schema_extra={"section": "Replay", "markdown": True})

    @field_validator("window_from", "window_to")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else as_utc(value)

    @model_validator(mode="after")
    def _mode_has_its_fields(self) -> BatchRequest:
        if self.mode == "offset_ranges" and not self.ranges:
            raise ValueError("mode offset_ranges needs at least one range (topic, partition, from, until)")
        if self.mode == "time_window":
            if self.window_from is None or self.window_to is None:
                raise ValueError("mode time_window needs window_from and window_to")
            if self.window_from >= self.window_to:
                raise ValueError(f"window_from {self.window_from} must be before window_to {self.window_to}")
        if self.reader_schema == "newest" and self.mode != "replay_batch":
            raise ValueError("reader_schema newest is for mode replay_batch (the other modes read with the newest)")
        if self.mode == "replay_batch" and self.batch_id is None:
            raise ValueError("mode replay_batch needs batch_id (see `kafka-ledger batches <pipeline>`)")
        if self.batch_id is not None and self.batch_id < 1:
            raise ValueError(f"batch_id {self.batch_id} is not a batch id (ids start at 1)")
        return self

    @property
    def offset_ranges(self) -> list[OffsetRange]:
        return [r.to_range() for r in self.ranges]


def parse_request(conf: dict[str, Any] | None) -> BatchRequest:
    """Validate a run's conf; RequestError lists every problem in words a person understands.

    Empty values (None, "" or []) mean "not given": the trigger form sends every field.
    """
    data = {key: value for key, value in (conf or {}).items() if value not in (None, "", [])}
    try:
        return BatchRequest.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {message}" if where else message)
        raise RequestError("invalid run request: " + "; ".join(problems)) from exc


@dataclass(frozen=True)
class FormField:
    """One field of the DAG's trigger form: what an Airflow Param takes (default, description, JSON schema)."""

    default: Any
    description: str | None
    schema: dict[str, Any]


def _inlined(schema: Any, definitions: dict[str, Any]) -> Any:
    """The schema with its $refs replaced by the definitions they name: a Param's schema stands alone."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inlined(definitions[schema["$ref"].rsplit("/", 1)[1]], definitions)
        return {key: _inlined(value, definitions) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_inlined(item, definitions) for item in schema]
    return schema


@functools.cache
def _request_schema() -> dict[str, Any]:
    """BatchRequest's JSON schema, made once per process: every pipeline's DAG asks for it (200 pipelines: 200
    times in one parse of the DAG file). Read only: _inlined copies what a form field takes of it."""
    return BatchRequest.model_json_schema()


def trigger_form_fields(example_topic: str = "topic") -> dict[str, FormField]:
    """BatchRequest's fields as the trigger form's, in its order, from the model's JSON schema.

    Airflow's form requires every field whose type does not admit null: a field that is not given by
    default (None or "") admits null and offers it (parse_request reads null, "" and [] as not given), so
    only the mode is required. `X | None` becomes the type list Airflow's form reads (["null", X]).
    """
    schema = _request_schema()
    fields = {}
    for name, field in BatchRequest.model_fields.items():
        entry = _inlined(dict(schema["properties"][name]), schema.get("$defs", {}))
        entry.pop("default", None)
        variants = entry.pop("anyOf", None)
        if variants:
            (given,) = [variant for variant in variants if variant != {"type": "null"}]
            entry = {**given, **entry, "type": ["null", given["type"]]}
        default = field.get_default(call_default_factory=True)
        if default in (None, ""):
            default = None
            if not isinstance(entry["type"], list):
                entry["type"] = ["null", entry["type"]]
        description = entry.pop("description").replace(EXAMPLE_TOPIC, example_topic)
        if entry.pop("markdown", False):
            entry["description_md"], description = description, None
        fields[name] = FormField(default, description, entry)
    return fields
