package krill;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;

/**
 * {@code produce <bootstrap> <topic> <partitions> <count>}: an idempotent producer (acks=all)
 * sends values v-0 .. v-(count-1) keyed k-i, every one acknowledged; then an assigned consumer
 * reads the partitions back from the start. Result: {@code acked} as [partition, offset,
 * value] rows and {@code read}, the rows read back.
 */
final class IdempotentProduce {
    private IdempotentProduce() {}

    static Map<String, Object> run(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        int count = Integer.parseInt(args[3]);
        Properties props = Clients.producer(bootstrap);
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, "2048"); // many batches, several in flight
        props.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "5");
        List<List<Object>> acked = new ArrayList<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, "k-" + i, "v-" + i)));
            }
            producer.flush();
            for (int i = 0; i < count; i++) {
                RecordMetadata m = Clients.get(sent.get(i));
                acked.add(List.of(m.partition(), m.offset(), "v-" + i));
            }
            producer.close(Clients.CLOSE);
        }
        List<List<Object>> read;
        try (KafkaConsumer<String, String> consumer =
                     new KafkaConsumer<>(Clients.consumer(bootstrap, null))) {
            read = Clients.readAll(consumer, Clients.partitions(topic, partitions),
                    Duration.ofSeconds(60));
        }
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("acked", acked);
        result.put("read", read);
        return result;
    }
}
