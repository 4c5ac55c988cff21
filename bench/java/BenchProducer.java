import java.util.Properties;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Produces the benchmark's messages far faster than a Python client can: message i goes to
 * partition i % partitions with key "user-" + keyOf(i) and timestamp BASE + i * SPAN / messages,
 * partition by partition in message order, so that its offset is i / partitions. The Python side
 * (bench_spark_lookup.py) builds the msgindex store from the same formulas and checks end offsets.
 *
 * args: bootstrap topic partitions messages cardinality valueBytes baseMs spanMs
 */
public final class BenchProducer {
    private BenchProducer() {
    }

    static long keyOf(long i, long cardinality) {
        return (i * 7_919L + 13L) % cardinality;  // must match key_of() in bench_spark_lookup.py
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        long messages = Long.parseLong(args[3]);
        long cardinality = Long.parseLong(args[4]);
        byte[] value = new byte[Integer.parseInt(args[5])];
        java.util.Arrays.fill(value, (byte) 'v');
        long baseMs = Long.parseLong(args[6]);
        long spanMs = Long.parseLong(args[7]);

        Properties config = new Properties();
        config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        config.put(ProducerConfig.LINGER_MS_CONFIG, "20");
        config.put(ProducerConfig.BATCH_SIZE_CONFIG, String.valueOf(512 * 1024));
        config.put(ProducerConfig.BUFFER_MEMORY_CONFIG, String.valueOf(128L * 1024 * 1024));
        // idempotence (the default) keeps each partition's send order, hence the offsets
        config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        config.put(ProducerConfig.ACKS_CONFIG, "all");

        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(config)) {
            for (int p = 0; p < partitions; p++) {
                for (long i = p; i < messages; i += partitions) {
                    byte[] key = ("user-" + keyOf(i, cardinality)).getBytes(java.nio.charset.StandardCharsets.UTF_8);
                    long timestamp = baseMs + i * spanMs / messages;
                    producer.send(new ProducerRecord<>(topic, p, timestamp, key, value));
                }
            }
            producer.flush();
        }
    }
}
