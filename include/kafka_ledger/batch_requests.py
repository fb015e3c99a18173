"""What an operator asks a pipeline run to do (the DAG's trigger form, REST conf or CLI), validated."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kafka_ledger.planning import OffsetRange

Mode = Literal["catch_up", "offset_ranges", "time_window", "replay_batch"]
MODES: tuple[str, ...] = ("catch_up", "offset_ranges", "time_window", "replay_batch")


def as_utc(value: datetime) -> datetime:
    """A date-time with its zone; one without a zone is UTC, as everywhere in the ledger (never the machine's)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


class RequestError(ValueError):
    """The request is invalid; nothing was written. The message is the reason alone: callers say "refused"."""


class RangeRequest(BaseModel):
    """Offsets [from, until) of one partition, as typed in the form or sent in the run conf."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    topic: str = Field(min_length=1)
    partition: int
    from_offset: int = Field(alias="from")
    until_offset: int = Field(alias="until")

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

    mode: Mode = "catch_up"
    ranges: list[RangeRequest] = Field(default_factory=list)
    window_from: datetime | None = None
    window_to: datetime | None = None
    batch_id: int | None = None
    reason: str = ""

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

