package krill;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/** Client configurations with every wait bounded, and the helpers the scenarios share. */
final class Clients {
    static final Duration POLL = Duration.ofMillis(200);
    static final long WAIT_S = 30; // one admin call, one send, one commit
    static final Duration CLOSE = Duration.ofSeconds(10);

    private Clients() {}

    static Properties producer(String bootstrap) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        return p;
    }

    static Properties consumer(String bootstrap, String group) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        if (group != null) {
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        }
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        return p;
    }

    static Properties admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        return p;
    }

    /** The future's value within WAIT_S, or the cause it failed with. */
    static <T> T get(Future<T> future) throws Exception {
        try {
            return future.get(WAIT_S, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            throw cause instanceof Exception ex ? ex : e;
        }
    }

    /** "ExceptionClass: message" of the innermost cause worth naming. */
    static String describe(Throwable e) {
        Throwable t = e;
        while ((t instanceof ExecutionException || t instanceof RuntimeException
                && t.getClass() == RuntimeException.class) && t.getCause() != null) {
            t = t.getCause();
        }
        return t.getClass().getSimpleName() + ": " + t.getMessage();
    }

    static void check(boolean condition, String what) {
        if (!condition) {
            throw new IllegalStateException(what);
        }
    }

    /** A record as the results carry it: [partition, offset, value]. */
    static List<Object> row(ConsumerRecord<String, String> r) {
        return List.of(r.partition(), r.offset(), r.value() == null ? "" : r.value());
    }

    static List<TopicPartition> partitions(String topic, int count) {
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < count; p++) {
            tps.add(new TopicPartition(topic, p));
        }
        return tps;
    }

    /**
     * Every record of the partitions from the start to the end offsets they have now (the
     * last stable offsets under read_committed), read by an assigned consumer: rows in the
     * order read. Fails if the end is not reached within `limit`.
     */
    static List<List<Object>> readAll(KafkaConsumer<String, String> consumer,
                                      Collection<TopicPartition> tps, Duration limit) {
        consumer.assign(tps);
        consumer.seekToBeginning(tps);
        Map<TopicPartition, Long> ends = new HashMap<>(consumer.endOffsets(tps, limit));
        List<List<Object>> rows = new ArrayList<>();
        long deadline = System.nanoTime() + limit.toNanos();
        while (!reached(consumer, ends)) {
            check(System.nanoTime() < deadline, "read to " + ends + " unfinished after " + limit
                    + " at " + positions(consumer, tps) + " with " + rows.size() + " records");
            for (ConsumerRecord<String, String> r : consumer.poll(POLL)) {
                rows.add(row(r));
            }
        }
        return rows;
    }

    private static boolean reached(KafkaConsumer<String, String> consumer,
                                   Map<TopicPartition, Long> ends) {
        for (Map.Entry<TopicPartition, Long> end : ends.entrySet()) {
            if (consumer.position(end.getKey(), CLOSE) < end.getValue()) {
                return false;
            }
        }
        return true;
    }

    static Map<String, Long> positions(KafkaConsumer<String, String> consumer,
                                       Collection<TopicPartition> tps) {
        Map<String, Long> out = new LinkedHashMap<>();
        for (TopicPartition tp : tps) {
            out.put(tp.toString(), consumer.position(tp, CLOSE));
        }
        return out;
    }
}
