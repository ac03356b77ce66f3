package krill;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.admin.MemberToRemove;
import org.apache.kafka.clients.admin.RemoveMembersFromConsumerGroupOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * {@code group <bootstrap> <topic> <partitions> <group> <range|cooperative-sticky> <count>
 * <late>}: a consumer group of the classic protocol.
 *
 * <ol>
 *   <li>Two static members (group.instance.id a and b), each polling on a thread of its own
 *       and committing what it has read when partitions are revoked, join until they split
 *       the partitions. Then {@code count} records (p-0 ..) are produced, read by the two,
 *       and both commit.
 *   <li>Member a is closed (a static member does not leave the group) and started again
 *       with its instance id: it must get its partitions back; b's generation and rebalance
 *       callbacks before and after are reported.
 *   <li>Both are closed and removed from the group by their instance ids (the AdminClient's
 *       removeMembersFromConsumerGroup), {@code late} more records (late-0 ..) produced, and a
 *       new dynamic member reads from the committed offsets until it has them, then commits.
 * </ol>
 *
 * Result: {@code split} (each member's partitions, rows read, generation, callbacks), {@code
 * rejoin} (a's partitions again, b's generation and callbacks before and after), {@code
 * remove_static} (the removal's outcome and the group's state after it) and {@code resumed}
 * (the new member's rows).
 */
final class Group {
    private Group() {}

    static Map<String, Object> run(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        String group = args[3];
        String assignor = switch (args[4]) {
            case "range" -> RangeAssignor.class.getName();
            case "cooperative-sticky" -> CooperativeStickyAssignor.class.getName();
            default -> throw new IllegalArgumentException("assignor " + args[4]);
        };
        int count = Integer.parseInt(args[5]);
        int late = Integer.parseInt(args[6]);
        Set<TopicPartition> all = new HashSet<>(Clients.partitions(topic, partitions));
        Map<String, Object> result = new LinkedHashMap<>();
        Map<String, Object> timings = new LinkedHashMap<>(); // ms since the start, by phase
        long started = System.nanoTime();
        result.put("timings_ms", timings);

        Member a = new Member("a", bootstrap, topic, group, assignor, "a").start();
        Member b = new Member("b", bootstrap, topic, group, assignor, "b").start();
        try {
            waitFor(60, "a and b split " + all, () -> split(all, a, b));
            timings.put("split", (System.nanoTime() - started) / 1_000_000);
            produce(bootstrap, topic, "p-", count);
            waitFor(60, count + " records read by a and b", () -> {
                Set<Object> values = new HashSet<>();
                for (Member m : List.of(a, b)) {
                    m.rows().forEach(r -> values.add(r.get(2)));
                }
                return values.size() >= count;
            });
            a.commit();
            b.commit();
            timings.put("read_and_committed", (System.nanoTime() - started) / 1_000_000);
            result.put("split", Map.of("a", a.report(), "b", b.report()));

            Set<String> aHad = names(a.assignment());
            int bGeneration = b.generation();
            List<String> bCalls = b.calls();
            a.close();
            Member again = new Member("a2", bootstrap, topic, group, assignor, "a").start();
            try {
                waitFor(30, "a rejoined with " + aHad, () -> names(again.assignment()).equals(aHad));
                timings.put("rejoined", (System.nanoTime() - started) / 1_000_000);
                Thread.sleep(1500); // a rebalance would reach b through its heartbeat (1 s)
                Map<String, Object> rejoin = new LinkedHashMap<>();
                rejoin.put("a_before", new ArrayList<>(aHad));
                rejoin.put("a_after", new ArrayList<>(names(again.assignment())));
                rejoin.put("b_generation_before", bGeneration);
                rejoin.put("b_generation_after", b.generation());
                rejoin.put("b_calls_before", bCalls);
                rejoin.put("b_calls_after", b.calls());
                result.put("rejoin", rejoin);
            } finally {
                again.close();
            }
        } finally {
            a.close();
            b.close();
        }
        // Static members do not leave when they close: take them out (LeaveGroup by instance
        // id), or the next member would wait out their session timeout to join. The call's
        // outcome is reported; the group's state after it is what the test relies on.
        try (org.apache.kafka.clients.admin.Admin admin =
                     org.apache.kafka.clients.admin.Admin.create(Clients.admin(bootstrap))) {
            Map<String, Object> removal = new LinkedHashMap<>();
            try {
                Clients.get(admin.removeMembersFromConsumerGroup(group,
                        new RemoveMembersFromConsumerGroupOptions(List.of(
                                new MemberToRemove("a"), new MemberToRemove("b")))).all());
                removal.put("outcome", "ok");
            } catch (Exception e) {
                removal.put("outcome", Clients.describe(e));
            }
            @SuppressWarnings("deprecation") // state(): 4.x's groupState() is not in 3.x
            String state = String.valueOf(Clients.get(admin.describeConsumerGroups(
                    List.of(group)).describedGroups().get(group)).state());
            removal.put("state", state);
            result.put("remove_static", removal);
            admin.close(Clients.CLOSE);
        }

        timings.put("removed", (System.nanoTime() - started) / 1_000_000);
        produce(bootstrap, topic, "late-", late);
        Properties props = Member.props(bootstrap, group, assignor, null);
        List<List<Object>> resumed = new ArrayList<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(props)) {
            c.subscribe(List.of(topic));
            long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
            long quietUntil = Long.MAX_VALUE; // poll one more second once all have come
            while (System.nanoTime() < quietUntil) {
                Clients.check(System.nanoTime() < deadline, "resumed member read "
                        + resumed.size() + " of " + late + " late records in 30s");
                for (ConsumerRecord<String, String> r : c.poll(Clients.POLL)) {
                    resumed.add(Clients.row(r));
                }
                if (resumed.size() >= late && quietUntil == Long.MAX_VALUE) {
                    quietUntil = System.nanoTime() + Duration.ofSeconds(1).toNanos();
                }
            }
            c.commitSync(Duration.ofSeconds(Clients.WAIT_S));
            c.close(Clients.CLOSE);
        }
        timings.put("resumed", (System.nanoTime() - started) / 1_000_000);
        result.put("resumed", resumed);
        return result;
    }

    private static boolean split(Set<TopicPartition> all, Member a, Member b) {
        Set<TopicPartition> pa = a.assignment();
        Set<TopicPartition> pb = b.assignment();
        Set<TopicPartition> union = new HashSet<>(pa);
        union.addAll(pb);
        return !pa.isEmpty() && !pb.isEmpty() && pa.size() + pb.size() == all.size()
                && union.equals(all) && a.generation() == b.generation();
    }

    static void produce(String bootstrap, String topic, String prefix, int count)
            throws Exception {
        try (KafkaProducer<String, String> producer =
                     new KafkaProducer<>(Clients.producer(bootstrap))) {
            List<java.util.concurrent.Future<?>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, "k-" + i, prefix + i)));
            }
            producer.flush();
            for (java.util.concurrent.Future<?> f : sent) {
                Clients.get(f);
            }
            producer.close(Clients.CLOSE);
        }
    }

    static void waitFor(long seconds, String what, BooleanSupplier condition)
            throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(seconds).toNanos();
        while (!condition.getAsBoolean()) {
            Clients.check(System.nanoTime() < deadline, "not within " + seconds + "s: " + what);
            Thread.sleep(50);
        }
    }

    static Set<String> names(Collection<TopicPartition> tps) {
        Set<String> out = new TreeSet<>();
        tps.forEach(tp -> out.add(tp.toString()));
        return out;
    }

    /** One member polling on its own thread; the other threads read its reported state. */
    static final class Member implements Runnable, ConsumerRebalanceListener {
        private final String name;
        private final Properties props;
        private final String topic;
        private final Thread thread;
        private final List<List<Object>> rows = new ArrayList<>();
        private final List<String> calls = new ArrayList<>();
        private final AtomicInteger commitsAsked = new AtomicInteger();
        private final AtomicInteger commitsDone = new AtomicInteger();
        private volatile Set<TopicPartition> assignment = Set.of();
        private volatile int generation = -1;
        private volatile boolean stopping;
        private volatile Throwable error;
        private KafkaConsumer<String, String> consumer;

        Member(String name, String bootstrap, String topic, String group, String assignor,
               String instanceId) {
            this.name = name;
            this.props = props(bootstrap, group, assignor, instanceId);
            this.topic = topic;
            this.thread = new Thread(this, "member-" + name);
        }

        static Properties props(String bootstrap, String group, String assignor,
                                String instanceId) {
            Properties p = Clients.consumer(bootstrap, group);
            p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
            p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, assignor);
            p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
            p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
            p.put(ConsumerConfig.MAX_POLL_INTERVAL_MS_CONFIG, "30000");
            if (instanceId != null) {
                p.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, instanceId);
            }
            return p;
        }

        Member start() {
            thread.setDaemon(true);
            thread.start();
            return this;
        }

        @Override
        public void run() {
            try (KafkaConsumer<String, String> c = new KafkaConsumer<>(props)) {
                consumer = c;
                c.subscribe(List.of(topic), this);
                while (!stopping) {
                    List<List<Object>> got = new ArrayList<>();
                    for (ConsumerRecord<String, String> r : c.poll(Clients.POLL)) {
                        got.add(Clients.row(r));
                    }
                    synchronized (this) {
                        rows.addAll(got);
                    }
                    assignment = Set.copyOf(c.assignment());
                    generation = c.groupMetadata().generationId();
                    int asked = commitsAsked.get();
                    if (commitsDone.get() < asked) {
                        c.commitSync(Duration.ofSeconds(Clients.WAIT_S));
                        commitsDone.set(asked);
                    }
                }
                c.close(Clients.CLOSE);
            } catch (Throwable e) {
                error = e;
            }
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            record("revoked", partitions);
            if (!partitions.isEmpty()) { // hand over what was read: nothing is read twice
                consumer.commitSync(Duration.ofSeconds(Clients.WAIT_S));
            }
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            record("assigned", partitions);
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            record("lost", partitions);
        }

        private synchronized void record(String what, Collection<TopicPartition> partitions) {
            calls.add(what + " " + names(partitions));
        }

        private void alive() {
            Clients.check(error == null, "member " + name + " failed: "
                    + (error == null ? "" : Clients.describe(error)));
            Clients.check(thread.isAlive() || stopping, "member " + name + " stopped");
        }

        Set<TopicPartition> assignment() {
            alive();
            return assignment;
        }

        int generation() {
            alive();
            return generation;
        }

        synchronized List<List<Object>> rows() {
            alive();
            return new ArrayList<>(rows);
        }

        synchronized List<String> calls() {
            return new ArrayList<>(calls);
        }

        void commit() throws InterruptedException {
            int asked = commitsAsked.incrementAndGet();
            waitFor(Clients.WAIT_S, name + " committed", () -> {
                alive();
                return commitsDone.get() >= asked;
            });
        }

        void close() throws InterruptedException {
            if (stopping) {
                return;
            }
            stopping = true;
            thread.join(Clients.CLOSE.toMillis() + 5000);
            Clients.check(!thread.isAlive(), "member " + name + " did not close");
            Clients.check(error == null, "member " + name + " failed: "
                    + (error == null ? "" : Clients.describe(error)));
        }

        Map<String, Object> report() {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("assignment", new ArrayList<>(names(assignment())));
            out.put("rows", rows());
            out.put("generation", generation());
            out.put("calls", calls());
            return out;
        }
    }
}
