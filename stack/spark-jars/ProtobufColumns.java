package io.kafkaledger.spark;

import com.google.protobuf.ByteString;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.Message;
import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.math.BigDecimal;
import java.time.Instant;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;

/**
 * kafka-ledger's Protobuf values (formats/protobuf.py): a value in Confluent's wire format (a magic byte 0, the writer
 * schema's id in 4 big-endian bytes, the message-index array, the message) decoded with the batch's reader schema into
 * the fields the pipeline's columns read, typed as the JSON format's reading takes them (formats/json.py: a string, a
 * long, an int, a double, a boolean, or the JSON text of a value read exactly, which Spark parses into a variant). Returns
 * a struct of (problem, mismatch, unexpected, the fields in the order asked): `problem` is a dead letter's reason
 * (then nothing else is set); `mismatch`, a field whose value its column's type cannot hold (a uint64 beyond a long);
 * `unexpected`, the fields no column reads, when asked.
 *
 * <p>The second argument is the batch's schemas of the value's topic, as protobuf.py's `TopicSchemas.blob` writes them:
 * the reader's id and the full name of the message the pipeline reads, the fields asked (each its path of field names
 * and its type), whether to list the unexpected fields, then each version of the subject (its id and its
 * FileDescriptorSet, imports first, the schema's own file last). The message index names a message of the writer
 * schema; the reader schema's message of that name decodes the bytes (Protobuf's own evolution: fields by number).
 *
 * <p>A field is set as Protobuf's JSON would have it: a scalar without presence always (its default when unset), a
 * field with presence (a message, `optional`, a `oneof` member) only when set, NULL otherwise; a path through an unset
 * message is NULL. As text: an enum by its value's name (an unknown number as itself), bytes in base64,
 * google.protobuf.Timestamp as ISO-8601, Duration as its seconds (a decimal number), the wrappers as the value they
 * wrap. As JSON: 64-bit integers as numbers (not the text Protobuf's JSON mapping writes), repeated fields as arrays,
 * maps as objects, Struct, Value and ListValue as the JSON they hold. A float read as a double is the double of its
 * shortest text (as a JSON reader of its text gets it), never its binary widening.
 */
public final class ProtobufColumns implements UDF2<byte[], byte[], Row> {
  private static final long serialVersionUID = 1L;

  /** A field asked for: its path of field names and how it is given ('S' text, 'J' long, 'I' int, 'D' double,
   * 'B' boolean, 'V' JSON text). */
  private static final class Asked {
    final String[] path;
    final char type;
    // The path's fields in the reader's message, resolved once (null: the reader lacks it, read as NULL).
    FieldDescriptor[] fields;

    Asked(String path, char type) {
      this.path = path.split("\\.");
      this.type = type;
    }
  }

  /** A topic's schemas in a batch and the fields asked, built once per executor from the blob. */
  private static final class Schemas {
    final int readerId;
    final String message;
    // What the reasons call what is decoded ("value", "the Kafka key"), and the subject its schema ids belong to.
    final String what;
    final String of;
    final Asked[] asked;
    final boolean listUnexpected;
    final Map<String, Descriptor> readerMessages = new HashMap<>();
    final Map<Integer, FileDescriptor> writers = new HashMap<>();
    // The declared names inside each object a path goes through ("" the message itself, "a" its field a, ...).
    final Map<String, Set<String>> declared = new HashMap<>();

    Schemas(byte[] blob) throws IOException, DescriptorValidationException {
      DataInputStream in = new DataInputStream(new ByteArrayInputStream(blob));
      readerId = in.readInt();
      message = in.readUTF();
      what = in.readUTF();
      of = in.readUTF();
      asked = new Asked[in.readInt()];
      for (int i = 0; i < asked.length; i++) {
        String path = in.readUTF();
        asked[i] = new Asked(path, (char) in.readByte());
      }
      listUnexpected = in.readBoolean();
      int count = in.readInt();
      for (int i = 0; i < count; i++) {
        int id = in.readInt();
        byte[] set = new byte[in.readInt()];
        in.readFully(set);
        writers.put(id, build(FileDescriptorSet.parseFrom(set)));
      }
      FileDescriptor reader = writers.get(readerId);
      if (reader == null) {
        throw new IOException("the reader schema (id " + readerId + ") is not among the subject's versions");
      }
      for (Descriptor d : reader.getMessageTypes()) {
        index(d);
      }
      Descriptor read = readerMessages.get(message);
      for (Asked field : asked) {
        field.fields = resolve(read, field.path);
        String parent = "";
        for (String name : field.path) {
          declared.computeIfAbsent(parent, k -> new HashSet<>()).add(name);
          parent = parent.isEmpty() ? name : parent + "." + name;
        }
      }
    }

    /** The prefix of a reason that does not name what was decoded: none for a value (its reasons' historic words). */
    String inside() {
      return what.equals("value") ? "" : what + ": ";
    }

    /** A path's fields, each inside the message the one before holds (null when the reader lacks one). */
    private static FieldDescriptor[] resolve(Descriptor message, String[] path) {
      FieldDescriptor[] fields = new FieldDescriptor[path.length];
      Descriptor at = message;
      for (int i = 0; i < path.length; i++) {
        fields[i] = at == null ? null : at.findFieldByName(path[i]);
        if (fields[i] == null) {
          return null;
        }
        at = fields[i].getJavaType() == FieldDescriptor.JavaType.MESSAGE ? fields[i].getMessageType() : null;
      }
      return fields;
    }

    private void index(Descriptor d) {
      readerMessages.put(d.getFullName(), d);
      for (Descriptor nested : d.getNestedTypes()) {
        index(nested);
      }
    }

    private static FileDescriptor build(FileDescriptorSet set) throws DescriptorValidationException {
      Map<String, FileDescriptor> built = new HashMap<>();
      FileDescriptor last = null;
      for (FileDescriptorProto file : set.getFileList()) {
        List<FileDescriptor> dependencies = new ArrayList<>();
        for (String name : file.getDependencyList()) {
          dependencies.add(built.get(name));
        }
        // proto2 leaves a string field's UTF-8 unchecked: protobuf-java would decode invalid bytes into replacement
        // characters, a value silently not the producer's. Checked, such a value does not decode: a dead letter.
        if (file.getSyntax().isEmpty() || file.getSyntax().equals("proto2")) {
          file = file.toBuilder().setOptions(file.getOptions().toBuilder().setJavaStringCheckUtf8(true)).build();
        }
        last = FileDescriptor.buildFrom(file, dependencies.toArray(new FileDescriptor[0]));
        built.put(file.getName(), last);
      }
      return last;
    }
  }

  /** Why a value is not published: a dead letter's reason. */
  private static final class Refused extends Exception {
    private static final long serialVersionUID = 1L;

    Refused(String reason) {
      super(reason, null, false, false);
    }
  }

  // The blobs seen and their schemas, newest first (a few: one per topic of the batches this executor decodes). A
  // task passes the same literal, the same array, for every row of a topic: found by identity, else by content.
  private static final int CACHED = 16;
  private static volatile Object[][] cached = new Object[0][];

  private static Schemas schemas(byte[] blob) {
    Object[][] seen = cached;
    for (Object[] entry : seen) {
      if (entry[0] == blob) {
        return (Schemas) entry[1];
      }
    }
    for (Object[] entry : seen) {
      if (Arrays.equals((byte[]) entry[0], blob)) {
        return remember(seen, blob, (Schemas) entry[1]);
      }
    }
    try {
      return remember(seen, blob, new Schemas(blob));
    } catch (IOException | DescriptorValidationException e) {
      // The driver built the same descriptors before the read: a blob that does not build is a bug, never a record's.
      throw new IllegalStateException("the batch's Protobuf schemas do not build: " + e, e);
    }
  }

  private static Schemas remember(Object[][] seen, byte[] blob, Schemas schemas) {
    Object[][] next = new Object[Math.min(seen.length + 1, CACHED)][];
    next[0] = new Object[] {blob, schemas};
    System.arraycopy(seen, 0, next, 1, next.length - 1);
    cached = next;
    return schemas;
  }

  /** A field whose value its column's type cannot hold. */
  private static final class Mismatch extends Exception {
    private static final long serialVersionUID = 1L;

    Mismatch() {
      super(null, null, false, false);
    }
  }

  @Override
  public Row call(byte[] value, byte[] blob) {
    if (value == null) {
      return null;
    }
    Schemas schemas = schemas(blob);
    Object[] row = new Object[3 + schemas.asked.length];
    Message message;
    try {
      message = decoded(value, schemas);
      boolean mismatch = false;
      for (int i = 0; i < schemas.asked.length; i++) {
        try {
          row[3 + i] = field(message, schemas.asked[i]);
        } catch (Mismatch e) {
          mismatch = true;
        } catch (Refused e) {
          throw new Refused(schemas.inside() + e.getMessage());
        }
      }
      row[1] = mismatch;
      row[2] = schemas.listUnexpected ? unexpected(message, schemas) : null;
    } catch (Refused e) {
      row = new Object[row.length];  // a dead letter's reason, and nothing else
      row[0] = e.getMessage();
    }
    return RowFactory.create(row);
  }

  private static Message decoded(byte[] value, Schemas schemas) throws Refused {
    // formats/framing.py checks the frame first, in the same words: this one is never the reason given.
    if (value.length < 5 || value[0] != 0) {
      throw new Refused(schemas.what + " is not in Confluent's wire format (a magic byte 0 and a 4-byte schema id "
          + "before the payload)");
    }
    int id = ((value[1] & 0xff) << 24) | ((value[2] & 0xff) << 16) | ((value[3] & 0xff) << 8) | (value[4] & 0xff);
    FileDescriptor writer = schemas.writers.get(id);
    if (writer == null) {
      throw new Refused(schemas.inside() + "schema id " + id + " is not a version of " + schemas.of);
    }
    CodedInputStream in = CodedInputStream.newInstance(value, 5, value.length - 5);
    Descriptor written;
    try {
      written = writtenMessage(in, writer, id);
    } catch (Refused e) {
      throw new Refused(schemas.inside() + e.getMessage());
    }
    Descriptor reader = schemas.readerMessages.get(written.getFullName());
    if (reader == null) {
      throw new Refused(schemas.inside() + "message " + written.getFullName() + " (writer schema id " + id + ") is "
          + "not in the reader schema (id " + schemas.readerId + ")");
    }
    if (!reader.getFullName().equals(schemas.message)) {
      throw new Refused(schemas.what + " is a " + reader.getFullName() + " message, and the pipeline reads "
          + schemas.message);
    }
    try {
      DynamicMessage message = DynamicMessage.parseFrom(reader, in);
      in.checkLastTagWas(0);
      return message;
    } catch (IOException e) {
      throw new Refused(schemas.what + " does not decode as message " + reader.getFullName() + " (writer schema id "
          + id + "): " + e.getMessage());
    }
  }

  /** Whether a field is set as Protobuf's JSON would have it (see the class). */
  private static boolean present(Message message, FieldDescriptor field) {
    return field.isRepeated() || !field.hasPresence() || message.hasField(field);
  }

  /** An asked field's value, typed as asked; NULL where it is not set or the reader lacks it. */
  private static Object field(Message message, Asked asked) throws Refused, Mismatch {
    if (asked.fields == null) {
      return null;
    }
    Message at = message;
    int last = asked.fields.length - 1;
    for (int i = 0; i < last; i++) {
      if (!present(at, asked.fields[i])) {
        return null;
      }
      at = (Message) at.getField(asked.fields[i]);
    }
    FieldDescriptor field = asked.fields[last];
    if (!present(at, field)) {
      return null;
    }
    Object value = at.getField(field);
    if (asked.type == 'V') {
      StringBuilder out = new StringBuilder(32);
      writeField(out, field, value);
      return out.toString();
    }
    // A wrapper (google.protobuf.Int64Value, ...) is the value it wraps.
    if (field.getJavaType() == FieldDescriptor.JavaType.MESSAGE) {
      Message inner = (Message) value;
      Descriptor type = inner.getDescriptorForType();
      switch (type.getFullName()) {
        case "google.protobuf.Timestamp":
          return timestamp(inner);
        case "google.protobuf.Duration":
          return seconds(inner);
        default:
          field = type.findFieldByName("value");
          value = inner.getField(field);
      }
    }
    return typed(field, value, asked.type);
  }

  private static Object typed(FieldDescriptor field, Object value, char type) throws Mismatch {
    switch (type) {
      case 'S':
        switch (field.getType()) {
          case STRING:
            return value;
          case BYTES:
            return Base64.getEncoder().encodeToString(((ByteString) value).toByteArray());
          case ENUM:
            EnumValueDescriptor symbol = (EnumValueDescriptor) value;
            return symbol.getIndex() < 0 ? Integer.toString(symbol.getNumber()) : symbol.getName();
          default:
            return scalarText(field, value);
        }
      case 'B':
        return value;
      case 'I':
        return value;
      case 'J':
        switch (field.getType()) {
          case UINT32:
          case FIXED32:
            return Integer.toUnsignedLong((Integer) value);
          case UINT64:
          case FIXED64:
            if ((Long) value < 0) {
              throw new Mismatch();  // beyond a long
            }
            return value;
          default:
            return ((Number) value).longValue();
        }
      case 'D':
        switch (field.getType()) {
          case FLOAT:
            return Double.parseDouble(Float.toString((Float) value));
          case UINT32:
          case FIXED32:
            return (double) Integer.toUnsignedLong((Integer) value);
          default:
            return ((Number) value).doubleValue();
        }
      default:
        throw new IllegalStateException("unknown field type " + type);
    }
  }

  /** The fields of the message, and of each message a declared path goes through, that no column reads and that
   * Protobuf's JSON would have (their paths). */
  private static List<String> unexpected(Message message, Schemas schemas) {
    List<String> found = new ArrayList<>();
    for (Map.Entry<String, Set<String>> parent : schemas.declared.entrySet()) {
      Message at = message;
      String prefix = parent.getKey();
      if (!prefix.isEmpty()) {
        for (String name : prefix.split("\\.")) {
          FieldDescriptor step = at.getDescriptorForType().findFieldByName(name);
          if (step == null || step.isRepeated() || step.getJavaType() != FieldDescriptor.JavaType.MESSAGE
              || !present(at, step)) {
            at = null;
            break;
          }
          at = (Message) at.getField(step);
        }
      }
      if (at == null) {
        continue;
      }
      for (FieldDescriptor field : at.getDescriptorForType().getFields()) {
        if (present(at, field) && !parent.getValue().contains(field.getName())) {
          found.add(prefix.isEmpty() ? field.getName() : prefix + "." + field.getName());
        }
      }
    }
    return found;
  }

  /** The message the index array names: a count then the indexes (zig-zag varints), or a lone 0 for [0]. */
  private static Descriptor writtenMessage(CodedInputStream in, FileDescriptor writer, int id) throws Refused {
    try {
      int count = in.readSInt32();
      int[] indexes = count == 0 ? new int[] {0} : new int[count];
      if (count < 0 || count > 100) {
        throw new Refused("bad message index (a count of " + count + ") after schema id " + id);
      }
      for (int i = 0; i < count; i++) {
        indexes[i] = in.readSInt32();
      }
      List<Descriptor> level = writer.getMessageTypes();
      Descriptor found = null;
      for (int index : indexes) {
        if (index < 0 || index >= level.size()) {
          throw new Refused("bad message index " + Arrays.toString(indexes) + ": schema id " + id + " has no such "
              + "message");
        }
        found = level.get(index);
        level = found.getNestedTypes();
      }
      return found;
    } catch (IOException e) {
      throw new Refused("bad message index after schema id " + id + " (the value ends inside it)");
    }
  }

  private static void writeMessage(StringBuilder out, Message message) throws Refused {
    Descriptor type = message.getDescriptorForType();
    String special = type.getFullName();
    switch (special) {
      case "google.protobuf.Timestamp":
        writeTimestamp(out, message);
        return;
      case "google.protobuf.Duration":
        out.append(seconds(message));
        return;
      case "google.protobuf.DoubleValue":
      case "google.protobuf.FloatValue":
      case "google.protobuf.Int64Value":
      case "google.protobuf.UInt64Value":
      case "google.protobuf.Int32Value":
      case "google.protobuf.UInt32Value":
      case "google.protobuf.BoolValue":
      case "google.protobuf.StringValue":
      case "google.protobuf.BytesValue":
        FieldDescriptor wrapped = type.findFieldByName("value");
        writeScalar(out, wrapped, message.getField(wrapped));
        return;
      case "google.protobuf.Struct":
        writeStruct(out, message);
        return;
      case "google.protobuf.ListValue":
        writeList(out, message);
        return;
      case "google.protobuf.Value":
        writeValue(out, message);
        return;
      default:
        break;
    }
    out.append('{');
    boolean first = true;
    for (FieldDescriptor field : type.getFields()) {
      boolean present = field.isRepeated() || !field.hasPresence() || message.hasField(field);
      if (!present) {
        continue;
      }
      if (!first) {
        out.append(',');
      }
      first = false;
      writeString(out, field.getName());
      out.append(':');
      writeField(out, field, message.getField(field));
    }
    out.append('}');
  }

  /** A field's value as JSON: an array, an object (a map), a message or a scalar. */
  private static void writeField(StringBuilder out, FieldDescriptor field, Object value) throws Refused {
    if (field.isMapField()) {
      writeMap(out, field, (List<?>) value);
    } else if (field.isRepeated()) {
      out.append('[');
      List<?> items = (List<?>) value;
      for (int i = 0; i < items.size(); i++) {
        if (i > 0) {
          out.append(',');
        }
        writeSingle(out, field, items.get(i));
      }
      out.append(']');
    } else {
      writeSingle(out, field, value);
    }
  }

  private static void writeMap(StringBuilder out, FieldDescriptor field, List<?> entries) throws Refused {
    Descriptor entry = field.getMessageType();
    FieldDescriptor key = entry.findFieldByName("key");
    FieldDescriptor mapped = entry.findFieldByName("value");
    // A key the wire repeats keeps its last value, as every Protobuf parser merges a map.
    Map<String, Object> last = new LinkedHashMap<>();
    for (Object entryValue : entries) {
      Message item = (Message) entryValue;
      String text = scalarText(key, item.getField(key));
      last.remove(text);
      last.put(text, item.getField(mapped));
    }
    out.append('{');
    boolean first = true;
    for (Map.Entry<String, Object> item : last.entrySet()) {
      if (!first) {
        out.append(',');
      }
      first = false;
      writeString(out, item.getKey());
      out.append(':');
      writeSingle(out, mapped, item.getValue());
    }
    out.append('}');
  }

  private static void writeSingle(StringBuilder out, FieldDescriptor field, Object value) throws Refused {
    if (field.getJavaType() == FieldDescriptor.JavaType.MESSAGE) {
      writeMessage(out, (Message) value);
    } else {
      writeScalar(out, field, value);
    }
  }

  private static void writeScalar(StringBuilder out, FieldDescriptor field, Object value) {
    switch (field.getType()) {
      case STRING:
        writeString(out, (String) value);
        return;
      case BYTES:
        writeString(out, Base64.getEncoder().encodeToString(((ByteString) value).toByteArray()));
        return;
      case ENUM:
        EnumValueDescriptor symbol = (EnumValueDescriptor) value;
        if (symbol.getIndex() < 0) {
          out.append(symbol.getNumber());  // a number the reader's enum does not name
        } else {
          writeString(out, symbol.getName());
        }
        return;
      case DOUBLE:
        writeFloating(out, (Double) value, Double.toString((Double) value));
        return;
      case FLOAT:
        writeFloating(out, (Float) value, Float.toString((Float) value));
        return;
      default:
        out.append(scalarText(field, value));
    }
  }

  /** A finite number as it is; NaN and the infinities as the strings Spark's JSON reader takes for them. */
  private static void writeFloating(StringBuilder out, double value, String text) {
    if (Double.isNaN(value) || Double.isInfinite(value)) {
      out.append('"').append(text).append('"');
    } else {
      out.append(text);
    }
  }

  /** An integer or boolean as its text (unsigned types as unsigned); a map key's text. */
  private static String scalarText(FieldDescriptor field, Object value) {
    switch (field.getType()) {
      case UINT32:
      case FIXED32:
        return Long.toString(Integer.toUnsignedLong((Integer) value));
      case UINT64:
      case FIXED64:
        return Long.toUnsignedString((Long) value);
      default:
        return String.valueOf(value);
    }
  }

  private static void writeTimestamp(StringBuilder out, Message message) throws Refused {
    writeString(out, timestamp(message));
  }

  /** A google.protobuf.Timestamp as ISO-8601 text (UTC). */
  private static String timestamp(Message message) throws Refused {
    Descriptor type = message.getDescriptorForType();
    long seconds = (Long) message.getField(type.findFieldByName("seconds"));
    int nanos = (Integer) message.getField(type.findFieldByName("nanos"));
    // Protobuf's own range (years 1 to 9999): beyond it a producer wrote no valid Timestamp.
    if (seconds < -62135596800L || seconds > 253402300799L || nanos < 0 || nanos > 999_999_999) {
      throw new Refused("a google.protobuf.Timestamp is out of its range (seconds " + seconds + ", nanos " + nanos
          + ")");
    }
    return DateTimeFormatter.ISO_INSTANT.format(Instant.ofEpochSecond(seconds, nanos));
  }

  private static String seconds(Message message) throws Refused {
    Descriptor type = message.getDescriptorForType();
    long seconds = (Long) message.getField(type.findFieldByName("seconds"));
    int nanos = (Integer) message.getField(type.findFieldByName("nanos"));
    if (nanos != 0 && (seconds < 0) != (nanos < 0) && seconds != 0) {
      throw new Refused("a google.protobuf.Duration's seconds and nanos have opposite signs");
    }
    return BigDecimal.valueOf(seconds).add(BigDecimal.valueOf(nanos, 9)).stripTrailingZeros().toPlainString();
  }

  private static void writeStruct(StringBuilder out, Message struct) throws Refused {
    FieldDescriptor fields = struct.getDescriptorForType().findFieldByName("fields");
    writeMap(out, fields, (List<?>) struct.getField(fields));
  }

  private static void writeList(StringBuilder out, Message list) throws Refused {
    FieldDescriptor values = list.getDescriptorForType().findFieldByName("values");
    List<?> items = (List<?>) list.getField(values);
    out.append('[');
    for (int i = 0; i < items.size(); i++) {
      if (i > 0) {
        out.append(',');
      }
      writeValue(out, (Message) items.get(i));
    }
    out.append(']');
  }

  private static void writeValue(StringBuilder out, Message value) throws Refused {
    FieldDescriptor kind = value.getOneofFieldDescriptor(value.getDescriptorForType().getOneofs().get(0));
    if (kind == null || kind.getName().equals("null_value")) {
      out.append("null");
    } else if (kind.getName().equals("struct_value")) {
      writeStruct(out, (Message) value.getField(kind));
    } else if (kind.getName().equals("list_value")) {
      writeList(out, (Message) value.getField(kind));
    } else {
      writeScalar(out, kind, value.getField(kind));
    }
  }

  private static void writeString(StringBuilder out, String text) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"':
          out.append("\\\"");
          break;
        case '\\':
          out.append("\\\\");
          break;
        default:
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    out.append('"');
  }
}
