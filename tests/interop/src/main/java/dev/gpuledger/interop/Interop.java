package dev.gpuledger.interop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.file.DataFileStream;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.avro.message.SchemaStore;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * gpuledger's topics read and written by the reference Avro implementation, as a downstream team would.
 *
 * <pre>
 * fingerprints --schemas DIR
 *     every .avsc under DIR (history/ included): SchemaNormalization.parsingFingerprint64 and the
 *     single-object header it gives (C3 01 + the fingerprint little-endian), as JSON.
 * decode --bootstrap HOST:PORT --schemas DIR --topic NAME=SUBJECT [--topic ...] [--registry URL] [--timeout-s N]
 *     reads each topic from the beginning to its end offsets and decodes every record: single-object
 *     records with BinaryMessageDecoder + SchemaStore.Cache (every .avsc, history included; the reader
 *     schema is the subject's latest), Confluent-framed records (00 + schema id) with the writer schema
 *     fetched from the registry's /schemas/ids/{id}. Prints per-topic counts as JSON.
 * produce --bootstrap HOST:PORT --schemas DIR --topic NAME --subject SUBJECT --input FILE
 *     FILE holds JSON lines {"key": "...", "value": {...}}; each value becomes a GenericRecord of the
 *     subject's latest schema and is written with BinaryMessageEncoder. Prints {"produced": n}.
 * ocf --input FILE --field NAME
 *     FILE is an Avro object container file; DataFileStream reads it with the schema in its header (sync
 *     markers checked per block). Prints the writer schema's full name, the codec, the number of blocks,
 *     and per record every long field, and the field NAME re-encoded by GenericDatumWriter as hex.
 * </pre>
 */
public final class Interop {
    private static final ObjectMapper JSON = new ObjectMapper();

    private Interop() {}

    public static void main(String[] argv) throws Exception {
        if (argv.length == 0) {
            throw new IllegalArgumentException("usage: Interop fingerprints|decode|produce [options]");
        }
        Map<String, List<String>> opts = options(argv);
        switch (argv[0]) {
            case "fingerprints" -> System.out.println(JSON.writeValueAsString(fingerprints(schemas(opts))));
            case "decode" -> System.out.println(JSON.writeValueAsString(decode(opts, schemas(opts))));
            case "produce" -> System.out.println(JSON.writeValueAsString(produce(opts, schemas(opts))));
            case "ocf" -> System.out.println(JSON.writeValueAsString(ocf(opts)));
            default -> throw new IllegalArgumentException("unknown command " + argv[0]);
        }
    }

    // -- options and schemas ------------------------------------------------------------------

    private static Map<String, List<String>> options(String[] argv) {
        Map<String, List<String>> out = new LinkedHashMap<>();
        for (int i = 1; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --name value, got " + argv[i]);
            }
            out.computeIfAbsent(argv[i].substring(2), k -> new ArrayList<>()).add(argv[i + 1]);
        }
        return out;
    }

    private static Path schemas(Map<String, List<String>> opts) {
        return Path.of(one(opts, "schemas"));
    }

    private static String one(Map<String, List<String>> opts, String name) {
        List<String> values = opts.get(name);
        if (values == null || values.size() != 1) {
            throw new IllegalArgumentException("--" + name + " is required once");
        }
        return values.get(0);
    }

    private static String optional(Map<String, List<String>> opts, String name, String fallback) {
        List<String> values = opts.get(name);
        return values == null ? fallback : values.get(0);
    }

    /** Every .avsc under dir, history included, each parsed on its own (versions share full names). */
    private static List<Path> schemaFiles(Path dir) throws IOException {
        try (Stream<Path> walk = Files.walk(dir)) {
            return walk.filter(p -> p.toString().endsWith(".avsc")).sorted().collect(Collectors.toList());
        }
    }

    private static Schema parse(Path file) throws IOException {
        return new Schema.Parser().parse(file.toFile());
    }

    /** The latest version of a subject: DIR/SUBJECT.avsc. */
    private static Schema latest(Path dir, String subject) throws IOException {
        return parse(dir.resolve(subject + ".avsc"));
    }

    private static SchemaStore.Cache store(Path dir) throws IOException {
        SchemaStore.Cache cache = new SchemaStore.Cache();
        for (Path file : schemaFiles(dir)) {
            cache.addSchema(parse(file));
        }
        return cache;
    }

    private static String hex(byte[] bytes) {
        StringBuilder sb = new StringBuilder();
        for (byte b : bytes) {
            sb.append(String.format("%02x", b));
        }
        return sb.toString();
    }

    private static Map<String, Object> fingerprints(Path dir) throws IOException {
        Map<String, Object> out = new TreeMap<>();
        for (Path file : schemaFiles(dir)) {
            Schema schema = parse(file);
            long fp = SchemaNormalization.parsingFingerprint64(schema);
            byte[] header = ByteBuffer.allocate(10).order(ByteOrder.LITTLE_ENDIAN)
                    .put((byte) 0xC3).put((byte) 0x01).putLong(fp).array();
            Map<String, Object> row = new LinkedHashMap<>();
            row.put("fingerprint64", fp);
            row.put("fingerprint_hex", String.format("%016x", fp));
            row.put("header_hex", hex(header));
            row.put("canonical_form", SchemaNormalization.toParsingForm(schema));
            out.put(dir.relativize(file).toString(), row);
        }
        return out;
    }

    // -- decode -------------------------------------------------------------------------------

    /** Counts of one topic, printed as JSON. */
    public static final class Counts {
        public long records;
        public long decoded;
        public long failed;
        public long singleObject;
        public long confluent;
        public Map<String, Long> errors = new TreeMap<>();
        public Map<String, Object> sample;

        void fail(String reason) {
            failed++;
            errors.merge(reason.length() > 300 ? reason.substring(0, 300) : reason, 1L, Long::sum);
        }
    }

    private static Map<String, Object> decode(Map<String, List<String>> opts, Path dir) throws Exception {
        SchemaStore.Cache cache = store(dir);
        String registry = optional(opts, "registry", null);
        long timeoutMs = (long) (Double.parseDouble(optional(opts, "timeout-s", "60")) * 1000);
        Map<String, String> subjects = new LinkedHashMap<>();
        for (String spec : opts.getOrDefault("topic", List.of())) {
            String[] parts = spec.split("=", 2);
            if (parts.length != 2) {
                throw new IllegalArgumentException("--topic NAME=SUBJECT, got " + spec);
            }
            subjects.put(parts[0], parts[1]);
        }
        Map<String, BinaryMessageDecoder<GenericRecord>> decoders = new LinkedHashMap<>();
        Map<String, Schema> readers = new LinkedHashMap<>();
        Map<String, Counts> counts = new LinkedHashMap<>();
        for (Map.Entry<String, String> e : subjects.entrySet()) {
            Schema reader = latest(dir, e.getValue());
            readers.put(e.getKey(), reader);
            decoders.put(e.getKey(), new BinaryMessageDecoder<>(GenericData.get(), reader, cache));
            counts.put(e.getKey(), new Counts());
        }
        RegistrySchemas registrySchemas = registry == null ? null : new RegistrySchemas(registry);

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, one(opts, "bootstrap"));
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        try (KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> parts = new ArrayList<>();
            for (String topic : subjects.keySet()) {
                for (PartitionInfo p : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
                    parts.add(new TopicPartition(topic, p.partition()));
                }
            }
            Map<TopicPartition, Long> end = new LinkedHashMap<>(consumer.endOffsets(parts, Duration.ofSeconds(30)));
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (!end.isEmpty() && System.currentTimeMillis() < deadline) {
                end.entrySet().removeIf(e -> e.getValue() <= consumer.position(e.getKey()));
                if (end.isEmpty()) {
                    break;
                }
                for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(Duration.ofMillis(500))) {
                    Counts c = counts.get(rec.topic());
                    c.records++;
                    byte[] value = rec.value();
                    try {
                        GenericRecord record;
                        if (value != null && value.length > 0 && value[0] == 0) {
                            c.confluent++;
                            if (registrySchemas == null) {
                                throw new IllegalStateException("Confluent-framed record but no --registry given");
                            }
                            record = registrySchemas.decode(value, readers.get(rec.topic()));
                        } else {
                            c.singleObject++;
                            record = decoders.get(rec.topic()).decode(value);
                        }
                        c.decoded++;
                        if (c.sample == null) {
                            c.sample = JSON.readValue(GenericData.get().toString(record), Map.class);
                        }
                    } catch (Exception exc) {
                        c.fail(exc.getClass().getSimpleName() + ": " + exc.getMessage());
                    }
                }
            }
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("topics", counts);
            out.put("unfinished_partitions", end.keySet().stream().map(TopicPartition::toString).toList());
            return out;
        }
    }

    /** Confluent framing: 00 + 4-byte big-endian schema id + Avro binary body; schemas by id from the registry. */
    private static final class RegistrySchemas {
        private final String url;
        private final HttpClient http = HttpClient.newHttpClient();
        private final Map<Integer, Schema> byId = new LinkedHashMap<>();

        RegistrySchemas(String url) {
            this.url = url.endsWith("/") ? url.substring(0, url.length() - 1) : url;
        }

        Schema schema(int id) throws IOException, InterruptedException {
            Schema known = byId.get(id);
            if (known != null) {
                return known;
            }
            HttpRequest req = HttpRequest.newBuilder(URI.create(url + "/schemas/ids/" + id))
                    .header("Accept", "application/vnd.schemaregistry.v1+json, application/json")
                    .timeout(Duration.ofSeconds(10)).build();
            HttpResponse<String> resp = http.send(req, HttpResponse.BodyHandlers.ofString());
            if (resp.statusCode() != 200) {
                throw new IOException("registry answered " + resp.statusCode() + " for schema id " + id);
            }
            Schema schema = new Schema.Parser().parse(JSON.readTree(resp.body()).get("schema").asText());
            byId.put(id, schema);
            return schema;
        }

        GenericRecord decode(byte[] value, Schema reader) throws IOException, InterruptedException {
            if (value.length < 5) {
                throw new IOException("Confluent-framed record shorter than its 5-byte header");
            }
            int id = ByteBuffer.wrap(value, 1, 4).order(ByteOrder.BIG_ENDIAN).getInt();
            BinaryDecoder body = DecoderFactory.get().binaryDecoder(value, 5, value.length - 5, null);
            GenericRecord record = new GenericDatumReader<GenericRecord>(schema(id), reader).read(null, body);
            if (!body.isEnd()) {
                throw new IOException("trailing bytes after the record");
            }
            return record;
        }
    }

    // -- produce ------------------------------------------------------------------------------

    private static Map<String, Object> produce(Map<String, List<String>> opts, Path dir) throws Exception {
        Schema schema = latest(dir, one(opts, "subject"));
        BinaryMessageEncoder<GenericRecord> encoder = new BinaryMessageEncoder<>(GenericData.get(), schema);
        String topic = one(opts, "topic");
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, one(opts, "bootstrap"));
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        long produced = 0;
        List<String> failures = java.util.Collections.synchronizedList(new ArrayList<>());
        try (KafkaProducer<byte[], byte[]> producer =
                        new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
                BufferedReader in = Files.newBufferedReader(Path.of(one(opts, "input")), StandardCharsets.UTF_8)) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                JsonNode row = JSON.readTree(line);
                GenericRecord record = (GenericRecord) toAvro(schema, row.get("value"), "value");
                if (!GenericData.get().validate(schema, record)) {
                    throw new IllegalArgumentException("record does not validate against " + schema.getFullName());
                }
                byte[] value = encoder.encode(record).array();
                JsonNode key = row.get("key");
                byte[] keyBytes = key == null || key.isNull() ? null : key.asText().getBytes(StandardCharsets.UTF_8);
                // Asynchronous sends, in order per partition (the client is idempotent by default).
                producer.send(new ProducerRecord<>(topic, keyBytes, value), (meta, exc) -> {
                    if (exc != null) {
                        failures.add(exc.toString());
                    }
                });
                produced++;
            }
            producer.flush();
        }
        if (!failures.isEmpty()) {
            throw new IOException(failures.size() + " records not delivered, e.g. " + failures.get(0));
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("produced", produced);
        out.put("fingerprint64", SchemaNormalization.parsingFingerprint64(schema));
        return out;
    }

    // -- object container files ---------------------------------------------------------------

    private static Map<String, Object> ocf(Map<String, List<String>> opts) throws IOException {
        String field = one(opts, "field");
        List<Map<String, Object>> records = new ArrayList<>();
        Map<String, Object> out = new LinkedHashMap<>();
        long blocks = 0;
        try (InputStream in = Files.newInputStream(Path.of(one(opts, "input")));
                DataFileStream<GenericRecord> stream = new DataFileStream<>(in, new GenericDatumReader<>())) {
            Schema schema = stream.getSchema();
            Schema inner = schema.getField(field).schema();
            GenericDatumWriter<Object> writer = new GenericDatumWriter<>(inner);
            while (stream.hasNext()) {
                long inBlock = stream.getBlockCount();
                for (long i = 0; i < inBlock; i++) {
                    GenericRecord record = stream.next();
                    Map<String, Object> row = new LinkedHashMap<>();
                    for (Schema.Field f : schema.getFields()) {
                        if (f.schema().getType() == Schema.Type.LONG) {
                            row.put(f.name(), record.get(f.pos()));
                        }
                    }
                    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
                    BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(bytes, null);
                    writer.write(record.get(field), encoder);
                    encoder.flush();
                    row.put(field + "_hex", hex(bytes.toByteArray()));
                    records.add(row);
                }
                blocks++;
            }
            out.put("schema", schema.getFullName());
            out.put("codec", stream.getMetaString("avro.codec"));
        }
        out.put("blocks", blocks);
        out.put("records", records);
        return out;
    }

    /** A plain JSON value as the Avro datum of `schema` (unions: the first branch the value fits). */
    static Object toAvro(Schema schema, JsonNode node, String path) {
        switch (schema.getType()) {
            case NULL:
                require(node == null || node.isNull(), path, "null");
                return null;
            case BOOLEAN:
                require(node != null && node.isBoolean(), path, "a boolean");
                return node.booleanValue();
            case INT:
                require(node != null && node.canConvertToInt() && node.isIntegralNumber(), path, "an int");
                return node.intValue();
            case LONG:
                require(node != null && node.isIntegralNumber() && node.canConvertToLong(), path, "a long");
                return node.longValue();
            case FLOAT:
                require(node != null && node.isNumber(), path, "a number");
                return node.floatValue();
            case DOUBLE:
                require(node != null && node.isNumber(), path, "a number");
                return node.doubleValue();
            case STRING:
                require(node != null && node.isTextual(), path, "a string");
                return node.textValue();
            case BYTES:
                require(node != null && node.isTextual(), path, "a string of latin-1 bytes");
                return ByteBuffer.wrap(node.textValue().getBytes(StandardCharsets.ISO_8859_1));
            case ENUM:
                require(node != null && node.isTextual() && schema.hasEnumSymbol(node.textValue()), path,
                        "one of " + schema.getEnumSymbols());
                return new GenericData.EnumSymbol(schema, node.textValue());
            case ARRAY: {
                require(node != null && node.isArray(), path, "an array");
                List<Object> items = new ArrayList<>();
                int i = 0;
                for (JsonNode item : node) {
                    items.add(toAvro(schema.getElementType(), item, path + "[" + i++ + "]"));
                }
                return new GenericData.Array<>(schema, items);
            }
            case MAP: {
                require(node != null && node.isObject(), path, "an object");
                Map<String, Object> map = new LinkedHashMap<>();
                for (Iterator<Map.Entry<String, JsonNode>> it = node.fields(); it.hasNext(); ) {
                    Map.Entry<String, JsonNode> e = it.next();
                    map.put(e.getKey(), toAvro(schema.getValueType(), e.getValue(), path + "." + e.getKey()));
                }
                return map;
            }
            case RECORD: {
                require(node != null && node.isObject(), path, "an object");
                GenericData.Record record = new GenericData.Record(schema);
                for (Schema.Field f : schema.getFields()) {
                    JsonNode v = node.get(f.name());
                    if (v == null && f.hasDefaultValue()) {
                        record.put(f.pos(), GenericData.get().getDefaultValue(f));
                    } else {
                        record.put(f.pos(), toAvro(f.schema(), v, path + "." + f.name()));
                    }
                }
                return record;
            }
            case UNION: {
                List<String> tried = new ArrayList<>();
                for (Schema branch : schema.getTypes()) {
                    try {
                        return toAvro(branch, node, path);
                    } catch (IllegalArgumentException exc) {
                        tried.add(branch.getType().getName());
                    }
                }
                throw new IllegalArgumentException(path + ": fits none of the union branches " + tried);
            }
            default:
                throw new IllegalArgumentException(path + ": unsupported Avro type " + schema.getType());
        }
    }

    private static void require(boolean ok, String path, String what) {
        if (!ok) {
            throw new IllegalArgumentException(path + ": expected " + what);
        }
    }
}
