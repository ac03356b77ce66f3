package krill;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * {@code transactions <bootstrap> <topic> <partitions> <transactional.id>}: three
 * transactions of one transactional producer, each spread over every partition: committed
 * (c1-0..29), aborted after its records were flushed to the broker (a-0..19), committed
 * (c2-0..9). Then a read_committed and a read_uncommitted consumer read every partition from
 * the start to its end. Result: {@code read_committed} and {@code read_uncommitted}, rows.
 */
final class Transactions {
    private Transactions() {}

    static Map<String, Object> run(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        String transactionalId = args[3];
        Properties props = Clients.producer(bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "30000");
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            transaction(producer, topic, partitions, "c1-", 30, true);
            transaction(producer, topic, partitions, "a-", 20, false);
            transaction(producer, topic, partitions, "c2-", 10, true);
            producer.close(Clients.CLOSE);
        }
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("read_committed", read(bootstrap, topic, partitions, "read_committed"));
        result.put("read_uncommitted", read(bootstrap, topic, partitions, "read_uncommitted"));
        return result;
    }

    private static void transaction(KafkaProducer<String, String> producer, String topic,
                                    int partitions, String prefix, int count, boolean commit)
            throws Exception {
        producer.beginTransaction();
        for (int i = 0; i < count; i++) {
            Clients.get(producer.send(new ProducerRecord<>(topic, i % partitions, null,
                    prefix + i)));
        }
        if (commit) {
            producer.commitTransaction();
        } else {
            producer.abortTransaction();
        }
    }

    private static List<List<Object>> read(String bootstrap, String topic, int partitions,
                                           String isolation) {
        Properties props = Clients.consumer(bootstrap, null);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            return Clients.readAll(consumer, Clients.partitions(topic, partitions),
                    Duration.ofSeconds(30));
        }
    }
}
