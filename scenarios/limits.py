"""The scenario runner's named limits, each with its unit last and its reason."""

# Clients (scenarios/worker.py).
send_timeout_ms = 60_000  # a send not acknowledged by then is `unknown`; outlasts every fault
metadata_refresh_ms = 2_000  # clients see added partitions and a re-created topic soon
burst_max = 1_000  # sends per pacing turn: a late turn catches up, but not unboundedly
pace_tick_s = 0.001  # a paced producer's turn; at 20k msg/s, 20 sends a turn
poll_records_max = 500  # records per consume() call
poll_timeout_s = 0.05  # a consumer process's turn over its consumers
connect_timeout_s = 30.0  # clients have metadata (and consumers a group assignment) before start
kafka_python_unassigned_s = 5.0  # a kafka-python member holding nothing asks to rejoin (worker.py)
committed_timeout_s = 5.0  # a drain's ask for committed offsets (worker.py positions)
stats_interval_s = 1.0  # a worker's stats line and history flush
gc_thresholds = (50_000, 20, 100)  # a worker's cyclic GC (worker.py ready()); default 700/10/10

# The run (scenarios/runner.py).
worker_ready_timeout_s = 45.0  # a worker process made its clients
finish_timeout_s = 60.0  # producers wait for what is in flight when the workload ends
drain_timeout_s = 60.0  # consumers read to the end offsets after the workload, at most
worker_exit_timeout_s = 90.0  # a worker that did not end by then is killed
node_start_timeout_s = 60.0  # a node's /v1/status/ready after start (recovery included)
node_stop_timeout_s = 30.0  # SIGTERM, then SIGKILL of its process group
condition_poll_s = 0.05  # how often an `after:` condition is looked at
history_ops_max = 20_000_000  # a history larger than this is refused (memory at check time)

# A cluster's checks (scenarios/replicas.py, scenarios/chaos.py).
node_watch_s = 0.5  # how often the runner looks for a node process that exited by itself
exit_evidence_bytes = 1 << 20  # of a node's log's end, read for why it died
exit_evidence_lines_max = 20  # lines of it kept in the report
replicas_converge_timeout_s = 60.0  # after the load: every replica the same, on disk and by
# its node's word, within this
power_loss_catch_up_s = 30.0  # a node back from a power loss: its replicas at their leaders'
# high watermarks within this, before the next fault
admin_timeout_s = 3.0  # one node's /v1/partitions answer
