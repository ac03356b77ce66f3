"""Text-script tests of the Raft machine, in the manner of etcd-io/raft's testdata/*.txt.

A script is a list of commands, each followed by `----` and the output it must print (no
blank line inside an output; a blank line ends it; `#` lines before a command are comments):

    campaign 1
    ----
    ok

With KRILL_RAFT_REWRITE=1 the runner writes every actual output back into the file instead
of comparing (then read the diff). Commands (node ids are 1..n):

    add-nodes N [prevote=B] [checkquorum=B] [election=T] [heartbeat=T] [inflight=N]
              [inflight-bytes=N] [append-bytes=N] [reader=B] [index=K] [quiesce=B]
              [learners=L]
                                  K: every node starts with offsets 0..K-1 of term 1, synced
                                  L: the last L nodes are learners (they never vote)
    campaign N | propose N RECORDS | transfer-leader N TO | report-unreachable N PEER
    propose-membership N voters=A,B,.. [outgoing=..] [learners=..]
                                  N (the leader) appends a membership change
    process-ready N...            handle each node's Ready (print it; flush nothing)
    fail-appends N                handle N's Ready, the disk refusing its appends; the
                                  machine is told where the log ends (log_write_failed)
    deliver-msgs [N...] [drop=(N...)]   deliver (or drop) messages queued to the nodes
    flush N... [upto=OFFSET]      sync each node's log and report it to its machine
    flush-begin N | flush-end N   the same in two steps: a sync begins, then completes
    stabilize [N...] [noflush]    Readies, syncs and deliveries until nothing moves
    tick N [COUNT] | tick-election N | tick-heartbeat N | set-election-timeout N TICKS
    isolate N | heal              drop every message to or from N (queued ones too) / stop
    crash N | restart N           lose what is not synced / start from what is
    set-log-start N OFFSET        retention: the log starts at OFFSET (a batch boundary)
    set-log N start=S prev=T runs=O@T,... last=L [commit=C] [term=T]
                                  restart N from this synced log (LogState(S, T, runs, L):
                                  one batch a run), commit offset and hard-state term
    wake N [lost]                 end a quiesced node's quiet (`lost`: the host lost touch)
    status N | raft-log N
    ... quiet                     (after any command) run it, print only "ok"
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.raft import (
    LEADER_CHANGE,
    AdvanceStart,
    Append,
    HardState,
    InstallStart,
    Membership,
    Message,
    MsgType,
    Ready,
    TruncateAfter,
)
from tests.raft.cluster import Batch, ModelLog, Node, make_config

REWRITE_ENV = "KRILL_RAFT_REWRITE"
STABILIZE_ROUNDS_MAX = 1000  # a script that does not settle in this many rounds is a bug


def format_message(m: Message) -> str:
    t = m.type
    s = f"{m.sender}->{m.to} {t} Term:{m.term}"
    if t in (MsgType.MsgVote, MsgType.MsgPreVote):
        s += f" Last:{m.offset}/{m.log_term}" + (" transfer" if m.transfer else "")
    elif t == MsgType.MsgApp:
        s += f" Prev:{m.offset}/{m.log_term} Commit:{m.commit}"
        if m.ranges:
            s += " Ranges:[" + " ".join(f"{r.base}-{r.last}@{r.term}" for r in m.ranges) + "]"
    elif t == MsgType.MsgAppResp:
        if m.reject:
            s += f" Rejected:{m.offset} Hint:{m.hint}/{m.log_term}"
        else:
            s += f" Ack:{m.offset}"
    elif t == MsgType.MsgHeartbeat:
        s += f" Commit:{m.commit}" + (" quiesce" if m.quiesce else "")
    elif t == MsgType.MsgSnap:
        s += f" Start:{m.offset + 1} Prev:{m.offset}/{m.log_term} Commit:{m.commit}"
    if m.reject and t != MsgType.MsgAppResp:
        s += " Rejected"
    if m.log_start > 0:  # a log start retention or DeleteRecords moved (0: none did)
        s += f" LogStart:{m.log_start}"
    return s


def format_ready(rd: Ready) -> list[str]:
    out = ["Ready:"]
    if rd.soft_state is not None:
        out.append(f"State:{rd.soft_state.role} Leader:{rd.soft_state.leader}")
    if rd.hard_state is not None:
        out.append(f"HardState Term:{rd.hard_state.term} Vote:{rd.hard_state.vote}")
    for w in rd.log_writes:
        if isinstance(w, Append):
            ranges = " ".join(f"{r.base}-{r.last}@{r.term}" for r in w.ranges)
            what = ("LEADER_CHANGE" if w.payload is LEADER_CHANGE else
                    "from MsgApp" if isinstance(w.payload, tuple) else f"payload={w.payload}")
            out.append(f"Append [{ranges}] {what}")
        elif isinstance(w, TruncateAfter):
            out.append(f"TruncateAfter {w.offset}")
        elif isinstance(w, InstallStart):
            out.append(f"InstallStart {w.log_start} Prev:{w.prev_term}")
        elif isinstance(w, AdvanceStart):
            out.append(f"AdvanceStart {w.offset}")
    if rd.committed is not None:
        out.append(f"Committed:{rd.committed}")
    if rd.messages:
        out.append("Messages:")
        out.extend(format_message(m) for m in rd.messages)
    return out


def _flag(v: str) -> bool:
    assert v in ("true", "false"), v
    return v == "true"


class Env:
    """The nodes of one script, their inboxes and the links cut between them."""

    def __init__(self) -> None:
        self.nodes: dict[Any, Node] = {}
        self.inbox: dict[Any, list[Message]] = {}
        self.isolated: set[int] = set()
        self.proposals = 0

    # ------------------------------------------------------------------ running

    def run(self, command: str) -> str:
        words = command.split()
        quiet = words[-1] == "quiet"
        name, args = words[0], words[1:len(words) - quiet]
        handler: Callable[[list[str]], list[str]] = getattr(self, "cmd_" + name.replace("-", "_"))
        lines = handler(args)
        return "\n".join(lines) if lines and not quiet else "ok"

    def node(self, s: str) -> Node:
        return self.nodes[int(s)]

    def _send(self, msgs: list[Message]) -> None:
        for m in msgs:
            if m.to in self.isolated or m.sender in self.isolated:
                continue
            self.inbox[m.to].append(m)

    def _process_ready(self, n: Node, fail_appends: bool = False) -> list[str]:
        rd = n.machine.ready()
        lines = format_ready(rd)
        self._send(n.handle_ready(rd, fail_appends))
        n.check_view()
        return lines

    def _deliver(self, to: int, drop: bool = False) -> list[str]:
        msgs, self.inbox[to] = self.inbox[to], []
        lines = []
        for m in msgs:
            if drop:
                lines.append("dropped: " + format_message(m))
                continue
            lines.append(format_message(m))
            if self.nodes[to].up:
                self.nodes[to].machine.step(m)
        return lines

    # ------------------------------------------------------------------ commands

    def cmd_add_nodes(self, args: list[str]) -> list[str]:
        n = int(args[0])
        opts = dict(a.split("=") for a in args[1:])
        kw: dict[str, Any] = {}
        for key, field, conv in (("prevote", "pre_vote", _flag),
                                 ("checkquorum", "check_quorum", _flag),
                                 ("election", "election_ticks", int),
                                 ("heartbeat", "heartbeat_ticks", int),
                                 ("inflight", "inflight_messages_max", int),
                                 ("inflight-bytes", "inflight_bytes_max", int),
                                 ("append-bytes", "append_bytes_max", int),
                                 ("quiesce", "quiesce", _flag),
                                 ("learners", "learners", int)):
            if key in opts:
                kw[field] = conv(opts[key])
        index = int(opts.get("index", 0))
        use_reader = _flag(opts.get("reader", "true"))
        for i in range(1, n + 1):
            log = ModelLog()
            hard, commit = HardState(0, None), -1
            if index:
                log.append(Batch(0, index - 1, 1, "init"))
                hard, commit = HardState(1, None), index - 1
            self.nodes[i] = Node(make_config(i, n, **kw), seed=i, log=log, hard_state=hard,
                                 committed=commit, use_reader=use_reader)
            self.inbox[i] = []
        return []

    def cmd_campaign(self, args: list[str]) -> list[str]:
        self.node(args[0]).machine.campaign()
        return []

    def cmd_propose(self, args: list[str]) -> list[str]:
        self.proposals += 1
        r = self.node(args[0]).machine.propose(int(args[1]), f"p{self.proposals}")
        return [f"refused (p{self.proposals})" if r is None
                else f"p{self.proposals}: {r.base}-{r.last}@{r.term}"]

    def cmd_propose_membership(self, args: list[str]) -> list[str]:
        opts = dict(a.split("=") for a in args[1:])

        def ids(key: str) -> frozenset[int]:
            return frozenset(int(x) for x in opts.get(key, "").split(",") if x)

        new = Membership(ids("voters"), ids("outgoing"), ids("learners"))
        r = self.node(args[0]).machine.propose_membership(new)
        return [f"refused ({new.describe()})" if r is None
                else f"{new.describe()}: {r.base}@{r.term}"]

    def cmd_transfer_leader(self, args: list[str]) -> list[str]:
        self.node(args[0]).machine.transfer_leader(int(args[1]))
        return []

    def cmd_report_unreachable(self, args: list[str]) -> list[str]:
        self.node(args[0]).machine.report_unreachable(int(args[1]))
        return []

    def cmd_process_ready(self, args: list[str]) -> list[str]:
        lines = []
        for a in args:
            n = self.node(a)
            if len(args) > 1:
                lines.append(f"> {a} handling Ready")
            if not n.machine.has_ready():
                lines.append("(no Ready)")
                continue
            lines.extend(self._process_ready(n))
        return lines

    def cmd_fail_appends(self, args: list[str]) -> list[str]:
        n = self.node(args[0])
        lines = self._process_ready(n, fail_appends=True)
        return [*lines, f"appends refused: the log ends at {n.written.last_offset}"]

    def cmd_deliver_msgs(self, args: list[str]) -> list[str]:
        drop: set[int] = set()
        ids = []
        for a in args:
            if a.startswith("drop="):
                drop = {int(x) for x in re.findall(r"\d+", a)}
            else:
                ids.append(int(a))
        lines = []
        for i in sorted(set(ids) | drop) if (ids or drop) else list(self.nodes):
            lines.extend(self._deliver(i, drop=i in drop))
        return lines or ["(no messages)"]

    def cmd_flush(self, args: list[str]) -> list[str]:
        upto = None
        lines = []
        for a in args:
            if a.startswith("upto="):
                upto = int(a[5:])
        for a in args:
            if not a.startswith("upto="):
                n = self.node(a)
                before = len(n.machine.msgs)
                offset, term = n.flush(upto)
                lines.append(f"{a} flushed {offset}/{term}" + _ignored(n, offset))
                lines.extend("  " + format_message(m) for m in n.machine.msgs[before:])
        return lines

    def cmd_flush_begin(self, args: list[str]) -> list[str]:
        offset, term = self.node(args[0]).flush_begin()
        return [f"{args[0]} syncing up to {offset}/{term}"]

    def cmd_flush_end(self, args: list[str]) -> list[str]:
        n = self.node(args[0])
        before = len(n.machine.msgs)
        offset, term = n.flush_end()
        lines = [f"{args[0]} flushed {offset}/{term}" + _ignored(n, offset)]
        lines.extend("  " + format_message(m) for m in n.machine.msgs[before:])
        return lines

    def cmd_stabilize(self, args: list[str]) -> list[str]:
        ids = [int(a) for a in args if a.isdigit()] or list(self.nodes)
        flush = "noflush" not in args
        lines: list[str] = []
        for _ in range(STABILIZE_ROUNDS_MAX):
            moved = False
            for i in ids:
                n = self.nodes[i]
                if n.up and n.machine.has_ready():
                    lines.append(f"> {i} handling Ready")
                    lines.extend("  " + s for s in self._process_ready(n))
                    moved = True
            for i in ids:
                n = self.nodes[i]
                if flush and n.up and n.unflushed():
                    offset, term = n.flush()
                    lines.append(f"> {i} flushed {offset}/{term}")
                    moved = True
            for i in ids:
                if self.inbox[i]:
                    lines.append(f"> {i} receiving messages")
                    lines.extend("  " + s for s in self._deliver(i))
                    moved = True
            if not moved:
                return lines
        raise AssertionError("stabilize did not settle")

    def cmd_tick(self, args: list[str]) -> list[str]:
        n = self.node(args[0])
        for _ in range(int(args[1]) if len(args) > 1 else 1):
            n.machine.tick()
        return []

    def cmd_tick_election(self, args: list[str]) -> list[str]:
        n = self.node(args[0])
        return self.cmd_tick([args[0], str(n.config.election_ticks)])

    def cmd_tick_heartbeat(self, args: list[str]) -> list[str]:
        n = self.node(args[0])
        return self.cmd_tick([args[0], str(n.config.heartbeat_ticks)])

    def cmd_set_election_timeout(self, args: list[str]) -> list[str]:
        self.node(args[0]).machine.randomized_election_ticks = int(args[1])
        return []

    def cmd_isolate(self, args: list[str]) -> list[str]:
        i = int(args[0])
        self.isolated.add(i)
        for box in self.inbox.values():
            box[:] = [m for m in box if m.sender != i and m.to != i]
        return []

    def cmd_heal(self, args: list[str]) -> list[str]:
        self.isolated.clear()
        return []

    def cmd_crash(self, args: list[str]) -> list[str]:
        n = self.node(args[0])
        n.crash()
        self.inbox[n.id] = []
        return [f"durable: {_log_line(n.durable)} {n.durable_hard}"]

    def cmd_restart(self, args: list[str]) -> list[str]:
        self.node(args[0]).restart()
        return []

    def cmd_set_log_start(self, args: list[str]) -> list[str]:
        n, offset = self.node(args[0]), int(args[1])
        n.machine.set_log_start(offset)
        n.written.set_start(offset)
        n.durable.set_start(max(offset, n.durable.start))
        n.check_view()
        return []

    def cmd_set_log(self, args: list[str]) -> list[str]:
        old = self.node(args[0])
        opts = dict(a.split("=") for a in args[1:])
        last = int(opts["last"])
        runs = [tuple(int(x) for x in run.split("@")) for run in opts.get("runs", "").split(",")
                if run]
        log = ModelLog(int(opts["start"]), int(opts["prev"]))
        for i, (base, term) in enumerate(runs):
            end = runs[i + 1][0] - 1 if i + 1 < len(runs) else last
            log.append(Batch(base, end, term, "init"))
        assert log.last_offset == last, (log.state(), last)
        hard = HardState(int(opts.get("term", 0)), None)
        self.nodes[old.id] = Node(old.config, seed=int(args[0]), log=log, hard_state=hard,
                                  committed=int(opts.get("commit", -1)),
                                  use_reader=old.use_reader)
        self.inbox[old.id] = []
        state = log.state()
        return [f"LogState(log_start={state.log_start}, prev_term={state.prev_term}, "
                f"runs={state.runs}, last_offset={state.last_offset})"]

    def cmd_status(self, args: list[str]) -> list[str]:
        s = self.node(args[0]).machine.status()
        lines = [f"{s.role} term={s.term} vote={s.vote} leader={s.leader} commit={s.commit} "
                 f"log={s.log_start}..{s.last_offset} flushed={s.flushed_offset}"
                 + (f" transferee={s.transferee}" if s.transferee is not None else "")
                 + (" quiesced" if self.node(args[0]).machine.quiesced else "")]
        machine = self.node(args[0]).machine
        if machine.log.confs()[1:] or machine.log.membership != Membership(
                frozenset(machine.config.peers), learners=frozenset(machine.config.learners)):
            changes = ", ".join(f"{o} {m.describe()}" for o, m in machine.log.confs()[1:])
            lines.append(f"membership {machine.membership.describe()}"
                         + (f" (changes at {changes})" if changes else ""))
        progress = self.node(args[0]).machine.progress
        lines.extend(f"{p}: {d}" + (f" start={progress[p].log_start}"
                                    if progress[p].log_start > 0 else "")
                     for p, d in s.progress.items())
        return lines

    def cmd_wake(self, args: list[str]) -> list[str]:
        self.node(args[0]).machine.wake(lost_touch=args[1:] == ["lost"])
        return []

    def cmd_raft_log(self, args: list[str]) -> list[str]:
        n = self.node(args[0])
        view = n.machine.log
        return [f"start={view.log_start} last={view.last_offset} "
                f"flushed={view.flushed_offset} runs={view.runs()}",
                _log_line(n.written)]

    def deliver_all(self) -> None:
        for i in self.nodes:
            self._deliver(i)


def _ignored(n: Node, offset: int) -> str:
    return "" if n.machine.log.flushed_offset == offset else " (ignored)"


def _log_line(log: ModelLog) -> str:
    return f"start {log.start}: " + (" ".join(
        f"{b.base}-{b.last}@{b.term}" for b in log.batches) or "(empty)")


# ---------------------------------------------------------------------- the file format

def parse(text: str) -> list[tuple[list[str], str, str]]:
    """(comment lines, command, expected output) of each block."""
    blocks = []
    lines = text.split("\n")
    i = 0
    comments: list[str] = []
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            comments.append(line)
            i += 1
            continue
        assert i + 1 < len(lines) and lines[i + 1] == "----", f"line {i + 1}: no ---- after"
        j = i + 2
        while j < len(lines) and lines[j].strip():
            j += 1
        blocks.append((comments, line, "\n".join(lines[i + 2:j])))
        comments = []
        i = j
    if comments and any(c.strip() for c in comments):
        blocks.append((comments, "", ""))
    return blocks


def run_script(path: Path) -> tuple[str, str]:
    """(the file's text, the text with the actual outputs)."""
    text = path.read_text()
    env = Env()
    out: list[str] = []
    for comments, command, _expected in parse(text):
        out.extend(comments)
        if command:
            out += [command, "----", env.run(command)]
    while out and not out[-1].strip():
        out.pop()
    return text, "\n".join(out) + "\n"


def check_script(path: Path) -> None:
    text, actual = run_script(path)
    if os.environ.get(REWRITE_ENV) == "1":
        if actual != text:
            path.write_text(actual)
        return
    if actual != text:
        diff = "".join(difflib.unified_diff(text.splitlines(True), actual.splitlines(True),
                                            str(path), "actual"))
        raise AssertionError(f"{path.name} differs (rerun with {REWRITE_ENV}=1):\n{diff}")
