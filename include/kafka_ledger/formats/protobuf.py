"""The Protobuf format: values in Confluent's wire format with its message index, decoded in Spark with the batch's
reader schema into the fields the columns read, which the JSON format's reading takes as it takes a JSON document's.

A schema is the registry's .proto text, which protoc (grpcio-tools' own) builds into descriptors on the driver with
the files it imports (its registry references, and Protobuf's well-known types), or the base64 descriptor Confluent's
Python serializer registers; once per text. A plan pins each topic's
reader schema (the subject's newest version, or the replayed batch's) and refuses one that cannot fill the columns;
the read binds the format to the reader and every version of the subject as writers. In Spark, kafka-ledger's decoder
(stack/spark-jars/ProtobufColumns.java, on protobuf-java: Spark's own spark-protobuf is not on Maven Central here)
checks the frame, finds the writer's message by the message index (the one-byte `[0]` and the full form both), decodes
the bytes with the reader schema's message of that name (Protobuf's evolution: fields by number) and gives each field
a column reads (by its .proto name along the column's path) as JSON's reading takes it (json.py's `_Document.layout`):
text, a long, an int, a double or a boolean, or, for a column read exactly (a decimal, a jsonb), its JSON text, which
Spark parses into a variant: 64-bit integers as numbers, bytes in base64, enums by name, repeated/map as arrays/objects,
Timestamp as ISO-8601 text, Duration as its seconds, the wrappers as their values. Typed fields cost no JSON text and
no JSON parse (measured: docs/benchmark.md). A value is a dead letter, with its reason, when it is not framed, when its
schema id is not a version of the subject, when its message index names no message, when it is another message than
the pipeline reads (`value.message`), when its bytes do not decode (a truncated payload), or when a field does not fit
its column's type (a uint64 beyond a long). Protobuf writes no presence for a proto3 scalar: an unset one reads as its
default (0, "", false), as every Protobuf reader sees it."""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_ledger.formats import framing
from kafka_ledger.formats.base import (
    ColumnSources,
    DeclaredColumn,
    DeclaredPipeline,
    DeclaredValue,
    DerivedColumns,
)
from kafka_ledger.formats.json import CORRUPT_COLUMN, JsonFormat
from kafka_ledger.formats.schema_registry import RegistryFormat, SchemaRefused, asking, newest_schema, schema_of

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor, FieldDescriptor
    from pyspark.sql import Column, DataFrame

# The decoder in the Spark jars (scripts/stack.sh builds it), and the column of its fields of a record's value.
DECODER_CLASS = "io.kafkaledger.spark.ProtobufColumns"
DECODED_COLUMN = "protobuf decoded"
DECODED_KEY_COLUMN = "protobuf decoded key"
NO_SCHEMAS = "the batch has no schemas for the record's topic"
# What the decoder's reasons call what it decodes, and the subject its schema ids must be versions of.
_DECODED_VALUE = ("value", "the topic's subject")
_DECODED_KEY = ("the Kafka key", "the topic's key subject")
# How the decoder gives a field of each type JSON's reading takes (by the Spark type's name): its code in the blob
# (ProtobufColumns.java) and the type it gives it as (a variant as its JSON text, which Spark parses).
GIVEN = {"string": ("S", "string"), "bigint": ("J", "bigint"), "int": ("I", "int"), "double": ("D", "double"),
         "boolean": ("B", "boolean"), "variant": ("V", "string")}
# The decoder's own fields before those asked: a dead letter's reason, whether a field does not fit its column's type,
# and the fields no column reads (extra_fields: dead_letter).
_DECODER_OWN = [("problem", "string"), ("mismatch", "boolean"), ("unexpected", "array<string>")]

# How a column of each kind (by its word) reads a field of the reader's message, by the field's type (`type_name`),
# in the JSON format's readings (json.py's JSON_READS words) of the document the decoder writes. A type missing is one
# the kind cannot hold exactly (the plan refuses the reader schema).
_INTEGERS_32 = ("int32", "sint32", "sfixed32")
_INTEGERS_64 = ("int64", "sint64", "sfixed64", "uint32", "fixed32")
PROTOBUF_READS: dict[str, Mapping[str, str]] = {
    "string": {"string": "typed", "enum": "typed"},
    "long": dict.fromkeys((*_INTEGERS_32, *_INTEGERS_64, "uint64", "fixed64"), "typed"),
    "int": dict.fromkeys(_INTEGERS_32, "typed"),
    "double": dict.fromkeys(("double", "float", *_INTEGERS_32, "uint32", "fixed32"), "typed"),
    "boolean": {"bool": "typed"},
    "timestamp": {"google.protobuf.Timestamp": "timestamp", "string": "timestamp"},
    "local_timestamp": {"string": "timestamp"},
    "date": {"string": "text"},
    "time": {"string": "text"},
    "uuid": {"string": "text"},
    "decimal": dict.fromkeys(("string", "google.protobuf.Duration", *_INTEGERS_32, *_INTEGERS_64, "uint64",
                              "fixed64"), "exact number"),
    "jsonb": dict.fromkeys(("message", "repeated", "map", "google.protobuf.Struct", "google.protobuf.ListValue",
                            "google.protobuf.Value"), "document"),
    "bytes": {"bytes": "base64"},
    "interval": {"string": "text", "google.protobuf.Duration": "text"},
}
# The well-known messages the decoder writes as a value of their own, and the wrappers as the type they wrap.
_WELL_KNOWN = ("google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.Struct",
               "google.protobuf.ListValue", "google.protobuf.Value")
_WRAPPERS = {f"google.protobuf.{name}Value": name.lower() for name in (
    "Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")}
# The kind each field type is derived as, when a declaration leaves its columns out.
_DERIVED_KINDS = {
    "string": "string", "enum": "string", "bool": "boolean", "double": "double", "float": "double",
    **dict.fromkeys(_INTEGERS_32, "int"), **dict.fromkeys(_INTEGERS_64, "long"),
    "uint64": "decimal(20,0)", "fixed64": "decimal(20,0)", "bytes": "bytes",
    "google.protobuf.Timestamp": "timestamp", "google.protobuf.Duration": "decimal(30,9)",
    "message": "jsonb", "repeated": "jsonb", "map": "jsonb", "google.protobuf.Struct": "jsonb",
    "google.protobuf.ListValue": "jsonb", "google.protobuf.Value": "jsonb",
}


# --- the registry's .proto text, built -------------------------------------------------------------------------------

_built: dict[str, bytes] = {}


def _files(client: Any, schema: Any, what: str, files: dict[str, str]) -> None:
    """Every file `schema` imports through its registry references (by import name), into `files`."""
    for reference in schema.references or []:
        if reference.name in files:
            continue
        with asking(f"reference {reference.name} of {what}", reference.subject):
            registered = client.get_version(reference.subject, reference.version)
        imported = schema_of(registered, f"reference {reference.name} (subject {reference.subject})", "PROTOBUF")
        files[reference.name] = imported.schema_str
        _files(client, imported, f"reference {reference.name}", files)


def descriptor_set(client: Any, schema: Any, what: str) -> bytes:
    """A registered Protobuf schema as a FileDescriptorSet: its imports first, its own file last (SchemaRefused when
    it cannot be built)."""
    schema = schema_of(schema, what, "PROTOBUF")
    files: dict[str, str] = {}
    _files(client, schema, what, files)
    return build_descriptor_set(schema.schema_str, files, what)


def _encoded_descriptor(text: str) -> Any:
    """A schema the registry holds as a base64 FileDescriptorProto (as Confluent's Python serializer registers it),
    or None: .proto text."""
    import base64
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text.strip(), validate=True))
    except (binascii.Error, ValueError, DecodeError):
        return None
    return proto if proto.name else None


def _well_known(name: str) -> Any:
    """The FileDescriptorProto of one of Protobuf's well-known types (`google/protobuf/timestamp.proto`), or None."""
    import importlib

    from google.protobuf import descriptor_pb2, descriptor_pool

    if not name.startswith("google/protobuf/"):
        return None
    try:
        importlib.import_module("google.protobuf." + name.removeprefix("google/protobuf/").removesuffix(".proto")
                                + "_pb2")
        found = descriptor_pool.Default().FindFileByName(name)
    except (ImportError, KeyError):
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    return proto


def build_descriptor_set(text: str, imports: Mapping[str, str], what: str) -> bytes:
    """The FileDescriptorSet of a schema `text` whose imports (beside Protobuf's well-known types) are `imports`
    (import name -> text): each .proto text or a base64 FileDescriptorProto; built once per text."""
    key = hashlib.sha256(repr((text, sorted(imports.items()))).encode()).hexdigest()
    if key not in _built:
        encoded = {name: _encoded_descriptor(imported) for name, imported in imports.items()}
        own = _encoded_descriptor(text)
        if own is None and not any(encoded.values()):
            _built[key] = _compiled(text, imports, what)
        elif own is not None and all(encoded.values()):
            _built[key] = _assembled(own, {name: proto for name, proto in encoded.items()}, what)
        else:
            raise SchemaRefused(f"{what} mixes .proto text and encoded descriptors among its references")
    return _built[key]


def _assembled(own: Any, imports: Mapping[str, Any], what: str) -> bytes:
    """A FileDescriptorSet of encoded descriptors, each after the files it imports."""
    from google.protobuf import descriptor_pb2

    ordered: list[Any] = []
    placed: set[str] = set()

    def place(proto: Any) -> None:
        for dependency in proto.dependency:
            if dependency in placed:
                continue
            found = imports.get(dependency) or _well_known(dependency)
            if found is None:
                raise SchemaRefused(f"{what} imports {dependency}, which is not among its references")
            place(found)
        if proto.name not in placed:
            placed.add(proto.name)
            ordered.append(proto)

    place(own)
    return descriptor_pb2.FileDescriptorSet(file=ordered).SerializeToString()


def _compiled(text: str, imports: Mapping[str, str], what: str) -> bytes:
    """protoc's FileDescriptorSet of .proto text (its imports written beside it, the well-known types from protoc's
    own)."""
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="kafka-ledger-proto-") as folder:
        root = Path(folder)
        own = "kafka_ledger_schema.proto"
        for name, imported in imports.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(imported)
        (root / own).write_text(text)
        out = root / "set.pb"
        # protoc writes its complaints to its own stderr: a process of its own keeps them.
        done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"-I{well_known}",
                               "--include_imports", f"--descriptor_set_out={out}", own],
                              capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if done.returncode != 0:
            complaint = (done.stderr or done.stdout).strip().replace(str(root) + "/", "")
            raise SchemaRefused(f"{what} is not a Protobuf schema protoc can build: {complaint}")
        return out.read_bytes()


@functools.lru_cache(maxsize=64)
def _pool(descriptor_set_bytes: bytes) -> tuple[Any, str]:
    """A descriptor set's files in a pool of their own, and its last file's name (the schema's own): built once per
    set (a batch's decode asks for its messages several times)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set_bytes).file
    pool = descriptor_pool.DescriptorPool()
    for file in files:
        pool.Add(file)
    return pool, files[-1].name


def messages(descriptor_set_bytes: bytes) -> list[Descriptor]:
    """The top-level messages of a descriptor set's last file (the schema's own), in order."""
    pool, own = _pool(descriptor_set_bytes)
    return list(pool.FindFileByName(own).message_types_by_name.values())


def message_class(text: str, name: str, imports: Mapping[str, str] | None = None) -> type:
    """The class of message `name` of a .proto `text` (with `imports`), built as a batch builds a schema: for the
    producers of the demo, the benchmark, the campaign and the tests (no generated code)."""
    from google.protobuf import message_factory

    pool, _ = _pool(build_descriptor_set(text, imports or {}, f"the schema of {name}"))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def message_named(descriptor_set_bytes: bytes, name: str | None, what: str) -> Descriptor:
    """The message the pipeline reads: `name` (a full name, nested ones too), or the schema's first message."""
    found = messages(descriptor_set_bytes)
    if not found:
        raise SchemaRefused(f"{what} defines no message")
    if name is None:
        return found[0]
    pool = found[0].file.pool
    try:
        return pool.FindMessageTypeByName(name)
    except KeyError:
        names = ", ".join(m.full_name for m in found)
        raise SchemaRefused(f"{what} has no message {name} (its messages: {names}; `value.message` names "
                            "one)") from None


def type_name(field: FieldDescriptor) -> str:
    """A field's type as PROTOBUF_READS names it: a scalar's type, `enum`, `repeated`, `map`, a well-known message's
    full name (a wrapper: the type it wraps), or `message`."""
    from google.protobuf.descriptor import FieldDescriptor as F

    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return "map"
    if field.is_repeated:
        return "repeated"
    if field.type == F.TYPE_MESSAGE:
        full = field.message_type.full_name
        return _WRAPPERS.get(full) or (full if full in _WELL_KNOWN else "message")
    if field.type == F.TYPE_ENUM:
        return "enum"
    names = {F.TYPE_DOUBLE: "double", F.TYPE_FLOAT: "float", F.TYPE_INT64: "int64", F.TYPE_UINT64: "uint64",
             F.TYPE_INT32: "int32", F.TYPE_FIXED64: "fixed64", F.TYPE_FIXED32: "fixed32", F.TYPE_BOOL: "bool",
             F.TYPE_STRING: "string", F.TYPE_BYTES: "bytes", F.TYPE_UINT32: "uint32", F.TYPE_SFIXED32: "sfixed32",
             F.TYPE_SFIXED64: "sfixed64", F.TYPE_SINT32: "sint32", F.TYPE_SINT64: "sint64"}
    return names[field.type]


def field_at(message: Descriptor, path: tuple[str, ...]) -> FieldDescriptor:
    """The field a column's path names, through nested messages (KeyError when there is none)."""
    field = None
    for depth, name in enumerate(path):
        if field is not None:
            if type_name(field) != "message":
                raise KeyError(".".join(path[:depth]))
            message = field.message_type
        field = message.fields_by_name[name]
    if field is None:
        raise KeyError("")
    return field


def columns_problems(columns: list[DeclaredColumn], message: Descriptor, what: str, source: str = "value") -> list[str]:
    """Why `message` cannot fill the columns of `source` (the value, or the key): a column whose field it lacks, or
    whose type the column's kind cannot hold exactly."""
    problems = []
    for column in columns:
        if column.source != source or not column.field_path:
            continue
        path = ".".join(column.field_path)
        try:
            found = type_name(field_at(message, column.field_path))
        except KeyError:
            problems.append(f"column {column.name}: message {message.full_name} of {what} has no field {path}")
            continue
        holds = PROTOBUF_READS[column.type.word]
        if found not in holds:
            problems.append(f"column {column.name}: field {path} is {found}, which a {column.type} column cannot hold "
                            f"exactly (it holds {', '.join(holds)})")
    return problems


def declared_columns(message: Descriptor) -> list[dict[str, str]]:
    """A column for every field of `message`, of the kind that holds it (a field not in lower case read by a
    lower-case column through its path)."""
    return [{"name": field.name.lower(), "type": _DERIVED_KINDS[type_name(field)],
             **({"path": field.name} if field.name != field.name.lower() else {})} for field in message.fields]


def asked_fields(value: Any) -> list[tuple[int, tuple[str, ...], Any]]:
    """The fields the decoder gives for the value's document (json.py's `_Document`): every leaf of each of its
    parses' trees, as (the parse, the path, the Spark type JSON's reading takes it as)."""
    found = []

    def walk(parse: int, node: dict[str, Any], prefix: tuple[str, ...]) -> None:
        for key, sub in node.items():
            if isinstance(sub, dict):
                walk(parse, sub, (*prefix, key))
            else:
                found.append((parse, (*prefix, key), sub))

    for parse, tree in enumerate(value.layout[0]):
        walk(parse, tree, ())
    return found


def decoded_fields(asked: list[tuple[int, tuple[str, ...], Any]]) -> list[tuple[str, str]]:
    """The decoder's result, field by field (name, Spark type): its own, then those asked (f0, f1, ...)."""
    return [*_DECODER_OWN, *[(f"f{i}", GIVEN[kind.simpleString()][1]) for i, (_, _, kind) in enumerate(asked)]]


@dataclass(frozen=True)
class TopicSchemas:
    """The schemas one topic's values are decoded with in a batch: the reader (`reader_id`) of `subject`, and every
    version of the subject as a writer (its descriptor set by schema id)."""

    subject: str
    reader_id: int
    writers: Mapping[int, bytes]

    def reader_message(self, name: str | None) -> Descriptor:
        return message_named(self.writers[self.reader_id], name,
                             f"the reader schema (id {self.reader_id}) of subject {self.subject}")

    def blob(self, message: str, asked: list[tuple[tuple[str, ...], str]], unexpected: bool,
             what: str = "value", of: str = "the topic's subject") -> bytes:
        """The schemas and the fields asked as the decoder takes them: the reader's id and the message read, what its
        reasons call what it decodes and the subject of its schema ids, the fields (each its path and its code, GIVEN),
        whether to list the fields no column reads, then each writer's id and descriptor set (big-endian lengths;
        names as Java's DataInput.readUTF reads them)."""
        def text(value: str) -> bytes:
            encoded = value.encode()
            return struct.pack(">H", len(encoded)) + encoded

        parts = [struct.pack(">i", self.reader_id), text(message), text(what), text(of), struct.pack(">i", len(asked))]
        for path, code in asked:
            parts += [text(".".join(path)), code.encode()]
        parts += [struct.pack(">?i", unexpected, len(self.writers))]
        for writer_id, built in sorted(self.writers.items()):
            parts += [struct.pack(">ii", writer_id, len(built)), built]
        return b"".join(parts)


def topic_schemas(client: Any, subject: str, reader_id: int) -> TopicSchemas:
    """A topic's schemas in a batch: the reader `reader_id` and every version of `subject` as writers."""
    with asking(f"the schemas of subject {subject}", subject):
        registered = [client.get_version(subject, version) for version in client.get_versions(subject)]
    writers = {r.schema_id: descriptor_set(client, r.schema, f"version {r.version} of subject {subject}")
               for r in registered}
    if reader_id not in writers:
        with asking(f"schema id {reader_id}"):
            writers[reader_id] = descriptor_set(client, client.get_schema(reader_id), f"schema id {reader_id}")
    return TopicSchemas(subject, reader_id, writers)


class ProtobufFormat(RegistryFormat, JsonFormat):
    """Protobuf values through a schema registry (see the module); `schemas`: the batch's, by topic."""

    name = "protobuf"
    description = ("Protobuf in Confluent's wire format, its schemas in the schema registry ([Protobuf values]"
                   "(#protobuf-values))")
    options = frozenset({"subject", "message", "key_format", "key_subject", "key_message"})
    values_name = "Protobuf values"
    keys_name = "Protobuf keys"
    kind_readings = PROTOBUF_READS

    def __init__(self, schemas: Mapping[str, TopicSchemas] | None = None,
                 key_schemas: Mapping[str, TopicSchemas] | None = None):
        self.schemas = dict(schemas or {})
        self.key_schemas = dict(key_schemas or {})

    def value_problems(self, value: DeclaredValue) -> list[str]:
        keyed = sorted(value.given() & {"key_subject", "key_message"})
        if keyed and value.key_format is None:
            return [f"{' and '.join(keyed)} apply to key_format protobuf"]
        return []

    def declaration_problems(self, pipeline: DeclaredPipeline) -> list[str]:
        problems = RegistryFormat.declaration_problems(self, pipeline)
        if pipeline.value.envelope != "none":
            problems.append(f"envelope {pipeline.value.envelope} reads JSON or Avro change events, not Protobuf")
        return problems

    # --- a batch's schemas --------------------------------------------------------------------------------------

    def parts(self, pipeline: DeclaredPipeline) -> tuple[str, ...]:
        return ("value", "key") if pipeline.value.key_format == self.name else ("value",)

    def subject_of(self, pipeline: DeclaredPipeline, part: str, topic: str) -> str:
        return pipeline.value.subject_of(topic) if part == "value" else pipeline.value.key_subject_of(topic)

    def check_reader(self, registry: Any, pipeline: DeclaredPipeline, columns: list[DeclaredColumn], subject: str,
                     schema_id: int, version: int, part: str = "value") -> None:
        what = f"version {version} of subject {subject} (schema id {schema_id})"
        with asking(f"schema id {schema_id}"):
            reader = descriptor_set(registry, registry.get_schema(schema_id), what)
        message = message_named(reader, _message_of(pipeline, part), what)
        problems = columns_problems(columns, message, what, part)
        if problems:
            raise SchemaRefused("; ".join(problems))

    def topic_schemas(self, registry: Any, subject: str, reader_id: int) -> TopicSchemas:
        return topic_schemas(registry, subject, reader_id)

    def with_schemas(self, schemas: Mapping[tuple[str, str], TopicSchemas]) -> ProtobufFormat:
        return ProtobufFormat({topic: found for (part, topic), found in schemas.items() if part == "value"},
                              {topic: found for (part, topic), found in schemas.items() if part == "key"})

    def derived_columns(self, sources: ColumnSources, subject: str, envelope: str) -> DerivedColumns:
        registry = sources.registry().client()
        schema_id, version, schema = newest_schema(registry, subject)
        what = f"version {version} of subject {subject}"
        message = message_named(descriptor_set(registry, schema, what), None, what)
        return DerivedColumns(subject, schema_id, version, declared_columns(message))

    # --- the decoding -------------------------------------------------------------------------------------------

    def _by_part(self, part: str) -> dict[str, TopicSchemas]:
        return self.schemas if part == "value" else self.key_schemas

    def column_readings(self, pipeline: DeclaredPipeline) -> dict[str, str]:
        """Each value (or key) column's reading by its field's type in the reader's message (the first topic's: a
        kind reads every type it holds alike); a column the reader lacks (declared after the batch was planned) reads
        nothing there."""
        messages = {part: found[min(found)].reader_message(_message_of(pipeline, part))
                    for part in self.parts(pipeline) if (found := self._by_part(part))}
        found = {}
        for column in pipeline.columns:
            holds = PROTOBUF_READS[column.type.word]
            reading = next(iter(holds.values()))
            message = messages.get(column.source)
            if message is not None and column.field_path:
                try:
                    reading = holds.get(type_name(field_at(message, column.field_path)), reading)
                except KeyError:
                    pass
            found[column.name] = reading
        return found

    def _prepared(self, records: DataFrame, pipeline: DeclaredPipeline, keep: list[str]) -> tuple[DataFrame, list[str]]:
        """The records with the decoder's fields of each value (and of each key, with key_format protobuf), by its
        topic's schemas (DECODED_COLUMN, DECODED_KEY_COLUMN)."""
        for document in self._documents(pipeline):
            records = records.withColumn(_decoded_column(document.source), self._decoded(records, pipeline, document))
            keep = [*keep, _decoded_column(document.source)]
        return records, keep

    def _decoded(self, records: DataFrame, pipeline: DeclaredPipeline, document: Any) -> Column:
        """The decoder's fields of a document (the value, or the key) of each record."""
        from pyspark.sql import functions as F

        asked = asked_fields(document)
        fields = decoded_fields(asked)
        decoded_type = f"struct<{','.join(f'{name}:{kind}' for name, kind in fields)}>"
        # Registered under a name of its own per type: pipelines of other columns may share a session.
        function = "kafka_ledger_protobuf_" + hashlib.sha256(decoded_type.encode()).hexdigest()[:12]
        records.sparkSession.udf.registerJavaFunction(function, DECODER_CLASS, decoded_type)
        decoded = F.struct(*[(F.lit(NO_SCHEMAS) if name == "problem" else F.lit(None)).cast(kind).alias(name)
                             for name, kind in fields])
        codes = [(path, GIVEN[kind.simpleString()][0]) for _, path, kind in asked]
        value = document.is_value
        for topic, schemas in sorted(self._by_part("value" if value else "key").items(), reverse=True):
            message = schemas.reader_message(_message_of(pipeline, "value" if value else "key")).full_name
            blob = schemas.blob(message, codes, value and pipeline.extra_fields == "dead_letter",
                                *(_DECODED_VALUE if value else _DECODED_KEY))
            decoded = F.when(F.col("topic") == topic, F.call_function(function, F.col(document.source), F.lit(blob))
                             ).otherwise(decoded)
        return decoded

    def _raw(self, source: str, pipeline: DeclaredPipeline) -> Column:
        from pyspark.sql import functions as F

        # Those fields are the decoder's (`_decoded`): no document text to read them from.
        return F.lit(None).cast("binary") if source in self.parts(pipeline) else super()._raw(source, pipeline)

    def _document_parses(self, documents: list[Any], pipeline: DeclaredPipeline) -> list[Column]:
        """The value's (and the key's) parses as JSON's reading takes them, each field the decoder's (a variant from
        its JSON text); `_corrupt_record` set where a value does not fit its column's type. A key or header column
        that no schema reads reads the whole key or header: no other document is parsed."""
        from pyspark.sql import functions as F

        parses = []
        for document in documents:
            decoded = F.col(_decoded_column(document.source))
            leaves = {(parse, path): decoded[f"f{i}"] for i, (parse, path, _) in enumerate(asked_fields(document))}
            for parse, name in enumerate(document.parses):
                corrupt = (F.when(decoded["mismatch"], F.lit("a field's value does not fit its column's type"))
                           if parse == 0 else F.lit(None).cast("string"))
                parses.append(F.struct(*_struct_fields(leaves, parse, document.layout[0][parse], ()),
                                       corrupt.alias(CORRUPT_COLUMN)).alias(name))
        return parses

    def _document_checks(self, pipeline: DeclaredPipeline, document: Any, raw: Column, whole: Column
                         ) -> tuple[list[Column], list[Column], list[Column]]:
        from pyspark.sql import functions as F

        source = F.col(document.source)
        framed = framing.is_framed(source)
        problem = F.col(_decoded_column(document.source))["problem"]
        if document.is_value:
            return ([F.when(~framed, F.lit(framing.NOT_FRAMED)), problem],
                    [F.when(~whole, F.lit("value does not match the declared schema"))],
                    [framed, problem.isNull(), whole])
        present = source.isNotNull()
        return ([F.when(present & ~framed, F.lit(framing.KEY_NOT_FRAMED)), F.when(present, problem)],
                [F.when(present & ~whole, F.lit(f"{document.what} does not match the declared schema"))],
                [~present | (framed & problem.isNull() & whole)])

    def _unexpected(self, value: Any, pipeline: DeclaredPipeline) -> Column:
        from pyspark.sql import functions as F

        return F.array_sort(F.col(DECODED_COLUMN)["unexpected"])


def _struct_fields(leaves: Mapping[tuple[int, tuple[str, ...]], Column], parse: int, node: Mapping[str, Any],
                   prefix: tuple[str, ...]) -> list[Column]:
    """A parse's tree (json.py's `_Document.layout`) as the fields of a struct: each leaf the decoder's field, a
    variant parsed from its JSON text."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    found = []
    for key, sub in node.items():
        path = (*prefix, key)
        if isinstance(sub, dict):
            found.append(F.struct(*_struct_fields(leaves, parse, sub, path)).alias(key))
        else:
            leaf = leaves[(parse, path)]
            found.append((F.try_parse_json(leaf) if isinstance(sub, T.VariantType) else leaf).alias(key))
    return found


def _decoded_column(source: str) -> str:
    return DECODED_COLUMN if source == "value" else DECODED_KEY_COLUMN


def _message_of(pipeline: DeclaredPipeline, part: str) -> str | None:
    """The message a pipeline's values (or keys) are, as declared (None: the schema's first)."""
    return pipeline.value.message if part == "value" else pipeline.value.key_message
