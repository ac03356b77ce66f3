package krill;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;

/**
 * {@code kip848 <bootstrap> <topic> <group> <count>}: a consumer of the KIP-848 protocol
 * ({@code group.protocol=consumer}, ConsumerGroupHeartbeat) subscribes and polls for at most
 * 15 s or until it has {@code count} records. Whatever happens is the result: {@code phase}
 * (where it stopped: construct, poll or done), {@code error} (the exception, if any), {@code
 * records} and {@code assignment}.
 */
final class Kip848 {
    private Kip848() {}

    static Map<String, Object> run(String[] args) {
        Properties props = Clients.consumer(args[0], args[2]);
        props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
        int count = Integer.parseInt(args[3]);
        Map<String, Object> out = new LinkedHashMap<>();
        List<List<Object>> rows = new ArrayList<>();
        String phase = "construct";
        String error = null;
        List<String> assignment = List.of();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            phase = "poll";
            consumer.subscribe(List.of(args[1]));
            long deadline = System.nanoTime() + Duration.ofSeconds(15).toNanos();
            while (rows.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Clients.POLL)) {
                    rows.add(Clients.row(r));
                }
            }
            assignment = new ArrayList<>(Group.names(consumer.assignment()));
            phase = "done";
            consumer.close(Clients.CLOSE);
        } catch (Exception e) {
            error = e.getClass().getName() + ": " + e.getMessage();
        }
        out.put("phase", phase);
        out.put("error", error);
        out.put("records", rows.size());
        out.put("assignment", assignment);
        return out;
    }
}
