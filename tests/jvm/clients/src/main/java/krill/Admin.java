package krill;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.Callable;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;

/**
 * {@code admin <bootstrap> <prefix>}: the AdminClient, call by call, on topics and a group
 * and a transactional id named after {@code prefix}. Each step's result is reported under its
 * name, or {@code {"error": "Exception: message"}} where the call failed: the test says which
 * steps must succeed and pins the refusals.
 *
 * <p>{@code describe <bootstrap> <topic>}: describeCluster and describeTopics of one topic.
 */
final class Admin {
    private Admin() {}

    private static final long T0 = 1_700_000_000_000L; // record timestamps of topic a

    static Map<String, Object> run(String[] args) throws Exception {
        String bootstrap = args[0];
        String prefix = args[1];
        String a = prefix + "-a";
        String b = prefix + "-b";
        String group = prefix + "-group";
        String txnId = prefix + "-txn";
        Map<String, Object> steps = new LinkedHashMap<>();
        try (org.apache.kafka.clients.admin.Admin admin =
                     org.apache.kafka.clients.admin.Admin.create(Clients.admin(bootstrap))) {
            step(steps, "create_topics", () -> {
                NewTopic ta = new NewTopic(a, 3, (short) 1)
                        .configs(Map.of("retention.ms", "3600000"));
                Clients.get(admin.createTopics(List.of(ta, new NewTopic(b, 1, (short) 1))).all());
                return "ok";
            });
            step(steps, "create_existing", () -> {
                Clients.get(admin.createTopics(List.of(new NewTopic(b, 1, (short) 1))).all());
                return "ok";
            });
            step(steps, "list_topics", () -> ours(Clients.get(admin.listTopics().names()), prefix));
            step(steps, "describe_topics", () -> topics(admin, List.of(a, b)));
            step(steps, "describe_cluster", () -> cluster(admin));
            ConfigResource ra = new ConfigResource(ConfigResource.Type.TOPIC, a);
            step(steps, "describe_configs", () -> configs(admin, ra));
            step(steps, "alter_set", () -> {
                alter(admin, ra, new AlterConfigOp(new ConfigEntry("retention.ms", "123456"),
                        AlterConfigOp.OpType.SET));
                return configs(admin, ra);
            });
            step(steps, "alter_delete", () -> {
                alter(admin, ra, new AlterConfigOp(new ConfigEntry("retention.ms", ""),
                        AlterConfigOp.OpType.DELETE));
                return configs(admin, ra);
            });
            step(steps, "create_partitions", () -> {
                Clients.get(admin.createPartitions(Map.of(a, NewPartitions.increaseTo(4))).all());
                return topics(admin, List.of(a));
            });
            step(steps, "produce", () -> {
                produceStamped(bootstrap, new TopicPartition(a, 0));
                return "ok";
            });
            TopicPartition a0 = new TopicPartition(a, 0);
            step(steps, "list_offsets", () -> listOffsets(admin, a0, true));
            step(steps, "delete_records", () -> deleteBefore(admin, a0, 5));
            // Not by time: Krill's Partition actor dies on a by-time lookup that lands below
            // the log start (test_list_offsets_by_time_after_delete_records).
            step(steps, "list_offsets_after_delete", () -> listOffsets(admin, a0, false));
            groupSteps(steps, admin, bootstrap, a, group);
            transactionSteps(steps, admin, bootstrap, new TopicPartition(a, 1), txnId);
            step(steps, "describe_producers", () -> Clients.get(admin.describeProducers(
                    List.of(new TopicPartition(a, 1))).all()).toString());
            step(steps, "delete_topics", () -> {
                Clients.get(admin.deleteTopics(List.of(b)).all());
                return ours(Clients.get(admin.listTopics().names()), prefix);
            });
            admin.close(Clients.CLOSE);
        }
        return steps;
    }

    /**
     * {@code timequery <bootstrap> <topic>}: ten records to partition 0 at T0 + i s (offset 7
     * the latest), records before offset 5 deleted, then listOffsets by time T0 + 3.5 s (Kafka
     * answers offset 5, the first kept record at or after it) and once more the latest offset.
     */
    static Map<String, Object> timeQuery(String[] args) throws Exception {
        TopicPartition tp = new TopicPartition(args[1], 0);
        Map<String, Object> steps = new LinkedHashMap<>();
        try (org.apache.kafka.clients.admin.Admin admin =
                     org.apache.kafka.clients.admin.Admin.create(Clients.admin(args[0]))) {
            produceStamped(args[0], tp);
            steps.put("delete_records", deleteBefore(admin, tp, 5));
            step(steps, "for_timestamp", () -> offset(admin, tp, OffsetSpec.forTimestamp(T0 + 3500)));
            step(steps, "latest", () -> offset(admin, tp, OffsetSpec.latest()));
            admin.close(Clients.CLOSE);
        }
        return steps;
    }

    static Map<String, Object> describe(String[] args) throws Exception {
        Map<String, Object> result = new LinkedHashMap<>();
        try (org.apache.kafka.clients.admin.Admin admin =
                     org.apache.kafka.clients.admin.Admin.create(Clients.admin(args[0]))) {
            result.put("describe_cluster", cluster(admin));
            result.put("describe_topics", topics(admin, List.of(args[1])));
            admin.close(Clients.CLOSE);
        }
        return result;
    }

    private static void step(Map<String, Object> steps, String name, Callable<Object> call) {
        Object value;
        try {
            value = call.call();
        } catch (Exception e) {
            value = Map.of("error", Clients.describe(e));
        }
        steps.put(name, value);
    }

    private static List<String> ours(Collection<String> names, String prefix) {
        List<String> out = new ArrayList<>();
        for (String n : names) {
            if (n.startsWith(prefix)) {
                out.add(n);
            }
        }
        out.sort(null);
        return out;
    }

    private static Map<String, Object> cluster(org.apache.kafka.clients.admin.Admin admin)
            throws Exception {
        DescribeClusterResult cluster = admin.describeCluster();
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("cluster_id", Clients.get(cluster.clusterId()));
        Node controller = Clients.get(cluster.controller());
        out.put("controller", controller == null ? null : controller.id());
        List<Object> nodes = new ArrayList<>();
        for (Node n : Clients.get(cluster.nodes())) {
            nodes.add(List.of(n.id(), n.host(), n.port()));
        }
        nodes.sort((x, y) -> Integer.compare((int) ((List<?>) x).get(0),
                (int) ((List<?>) y).get(0)));
        out.put("nodes", nodes);
        return out;
    }

    private static Map<String, Object> topics(org.apache.kafka.clients.admin.Admin admin,
                                              List<String> names) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (TopicDescription d : Clients.get(admin.describeTopics(names).allTopicNames())
                .values()) {
            List<Object> parts = new ArrayList<>();
            for (TopicPartitionInfo p : d.partitions()) {
                parts.add(Map.of("partition", p.partition(),
                        "leader", p.leader() == null ? -1 : p.leader().id(),
                        "replicas", p.replicas().stream().map(Node::id).toList(),
                        "isr", p.isr().stream().map(Node::id).toList()));
            }
            out.put(d.name(), Map.of("internal", d.isInternal(),
                    "topic_id_set", d.topicId() != null
                            && !d.topicId().equals(org.apache.kafka.common.Uuid.ZERO_UUID),
                    "partitions", parts));
        }
        return out;
    }

    private static Map<String, Object> configs(org.apache.kafka.clients.admin.Admin admin,
                                               ConfigResource resource) throws Exception {
        Config config = Clients.get(admin.describeConfigs(List.of(resource)).all())
                .get(resource);
        Map<String, Object> out = new TreeMap<>();
        for (String name : List.of("retention.ms", "cleanup.policy", "segment.bytes")) {
            ConfigEntry e = config.get(name);
            out.put(name, e == null ? null : List.of(String.valueOf(e.value()),
                    e.source().name()));
        }
        return out;
    }

    private static void alter(org.apache.kafka.clients.admin.Admin admin,
                              ConfigResource resource, AlterConfigOp op) throws Exception {
        Clients.get(admin.incrementalAlterConfigs(Map.of(resource, List.of(op))).all());
    }

    /** Ten records to the partition at T0 + i s, but offset 7 carries the largest time. */
    private static void produceStamped(String bootstrap, TopicPartition tp) throws Exception {
        try (KafkaProducer<String, String> producer =
                     new KafkaProducer<>(Clients.producer(bootstrap))) {
            for (int i = 0; i < 10; i++) {
                long ts = i == 7 ? T0 + 100_000 : T0 + i * 1000L;
                Clients.get(producer.send(new ProducerRecord<>(tp.topic(), tp.partition(), ts,
                        null, "s-" + i)));
            }
            producer.close(Clients.CLOSE);
        }
    }

    private static Map<String, Object> listOffsets(org.apache.kafka.clients.admin.Admin admin,
                                                   TopicPartition tp, boolean byTime)
            throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("earliest", offset(admin, tp, OffsetSpec.earliest()));
        out.put("latest", offset(admin, tp, OffsetSpec.latest()));
        if (byTime) {
            out.put("max_timestamp", offset(admin, tp, OffsetSpec.maxTimestamp()));
            out.put("for_timestamp", offset(admin, tp, OffsetSpec.forTimestamp(T0 + 3500)));
        }
        return out;
    }

    /** [offset, timestamp] that listOffsets answers, within 10 s. */
    private static List<Object> offset(org.apache.kafka.clients.admin.Admin admin,
                                       TopicPartition tp, OffsetSpec spec) throws Exception {
        ListOffsetsResultInfo info = Clients.get(admin.listOffsets(Map.of(tp, spec),
                new ListOffsetsOptions().timeoutMs(10_000)).partitionResult(tp));
        return List.of(info.offset(), info.timestamp());
    }

    private static long deleteBefore(org.apache.kafka.clients.admin.Admin admin,
                                     TopicPartition tp, long offset) throws Exception {
        return Clients.get(admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(offset)))
                .lowWatermarks().get(tp)).lowWatermark();
    }

    @SuppressWarnings("deprecation") // listConsumerGroups and state(): 4.x's classic API
    private static void groupSteps(Map<String, Object> steps,
                                   org.apache.kafka.clients.admin.Admin admin, String bootstrap,
                                   String topic, String group) throws Exception {
        Properties props = Clients.consumer(bootstrap, group);
        props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
        props.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG,
                RangeAssignor.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(topic));
            step(steps, "group_member_read", () -> {
                long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
                int read = 0; // a-0 keeps 5 records after the trim, a-1 .. a-3 none yet
                while (read < 5 || consumer.assignment().isEmpty()) {
                    Clients.check(System.nanoTime() < deadline, "group member read " + read
                            + " records of " + topic + " in 30s");
                    read += consumer.poll(Clients.POLL).count();
                }
                consumer.commitSync(Duration.ofSeconds(Clients.WAIT_S));
                return read;
            });
            step(steps, "list_groups", () -> listed(admin, group));
            step(steps, "describe_group_live", () -> group(admin, group));
            step(steps, "list_group_offsets", () -> {
                Map<String, Object> out = new TreeMap<>();
                Clients.get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata())
                        .forEach((tp, om) -> out.put(tp.toString(), om.offset()));
                return out;
            });
            consumer.close(Clients.CLOSE);
        }
        step(steps, "describe_group_empty", () -> group(admin, group));
        step(steps, "alter_group_offsets", () -> {
            Clients.get(admin.alterConsumerGroupOffsets(group,
                    Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(6))).all());
            return Clients.get(admin.listConsumerGroupOffsets(group)
                    .partitionsToOffsetAndMetadata()).get(new TopicPartition(topic, 0)).offset();
        });
        step(steps, "delete_group", () -> {
            Clients.get(admin.deleteConsumerGroups(List.of(group)).all());
            return listed(admin, group);
        });
    }

    @SuppressWarnings("deprecation")
    private static Object listed(org.apache.kafka.clients.admin.Admin admin, String group)
            throws Exception {
        List<Object> out = new ArrayList<>();
        for (ConsumerGroupListing g : Clients.get(admin.listConsumerGroups().all())) {
            if (g.groupId().equals(group)) {
                out.add(List.of(g.groupId(), g.isSimpleConsumerGroup(),
                        String.valueOf(g.state().orElse(null))));
            }
        }
        return out;
    }

    @SuppressWarnings("deprecation")
    private static Map<String, Object> group(org.apache.kafka.clients.admin.Admin admin,
                                             String group) throws Exception {
        ConsumerGroupDescription d = Clients.get(admin.describeConsumerGroups(List.of(group))
                .describedGroups().get(group));
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("state", String.valueOf(d.state()));
        out.put("assignor", d.partitionAssignor());
        out.put("simple", d.isSimpleConsumerGroup());
        out.put("coordinator", d.coordinator() == null ? -1 : d.coordinator().id());
        List<Object> members = new ArrayList<>();
        for (MemberDescription m : d.members()) {
            members.add(new ArrayList<>(Group.names(m.assignment().topicPartitions())));
        }
        out.put("members", members);
        return out;
    }

    private static void transactionSteps(Map<String, Object> steps,
                                         org.apache.kafka.clients.admin.Admin admin,
                                         String bootstrap, TopicPartition tp, String txnId)
            throws Exception {
        Properties props = Clients.producer(bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            producer.beginTransaction();
            Clients.get(producer.send(new ProducerRecord<>(tp.topic(), tp.partition(), null,
                    "txn")));
            step(steps, "describe_transaction_ongoing", () -> transaction(admin, txnId));
            step(steps, "list_transactions", () -> {
                List<Object> out = new ArrayList<>();
                for (TransactionListing t : Clients.get(admin.listTransactions().all())) {
                    if (t.transactionalId().equals(txnId)) {
                        out.add(List.of(t.transactionalId(), t.state().toString()));
                    }
                }
                return out;
            });
            producer.commitTransaction();
            // EndTxn is answered once PrepareCommit is stored; the markers and CompleteCommit
            // follow (as in Kafka).
            step(steps, "describe_transaction_committed", () -> {
                long deadline = System.nanoTime() + Duration.ofSeconds(10).toNanos();
                Map<String, Object> d = transaction(admin, txnId);
                while (d.get("state").equals("PrepareCommit") && System.nanoTime() < deadline) {
                    Thread.sleep(50);
                    d = transaction(admin, txnId);
                }
                return d;
            });
            producer.close(Clients.CLOSE);
        }
    }

    private static Map<String, Object> transaction(org.apache.kafka.clients.admin.Admin admin,
                                                   String txnId) throws Exception {
        TransactionDescription d = Clients.get(admin.describeTransactions(List.of(txnId))
                .description(txnId));
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("state", d.state().toString());
        out.put("producer_id_set", d.producerId() >= 0);
        out.put("partitions", new ArrayList<>(Group.names(d.topicPartitions())));
        out.put("coordinator", d.coordinatorId());
        return out;
    }
}
