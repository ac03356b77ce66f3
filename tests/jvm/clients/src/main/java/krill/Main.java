package krill;

import java.util.Arrays;
import java.util.Map;

/**
 * One scenario against a Krill node or cluster: {@code krill.Main <scenario> <bootstrap> ...}.
 *
 * <p>The scenario's result is one JSON object, the last line of stdout; exit code 0. A failure
 * is one line on stderr, {@code KRILL-JVM-FAIL <scenario>: <what>}, and exit code 1. The whole
 * run is bounded: past {@code -Dkrill.deadline.s} (default 120) the JVM halts with exit code 3
 * and says so on stderr. The client logs to stderr at WARN (slf4j-simple).
 */
public final class Main {
    private Main() {}

    public static void main(String[] args) {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
        if (args.length < 2) {
            fail("usage", "krill.Main <scenario> <bootstrap> [args...]");
        }
        String scenario = args[0];
        String[] rest = Arrays.copyOfRange(args, 1, args.length);
        startWatchdog(scenario, Long.getLong("krill.deadline.s", 120L));
        Map<String, Object> result;
        try {
            result = switch (scenario) {
                case "produce" -> IdempotentProduce.run(rest);
                case "transactions" -> Transactions.run(rest);
                case "group" -> Group.run(rest);
                case "admin" -> Admin.run(rest);
                case "describe" -> Admin.describe(rest);
                case "timequery" -> Admin.timeQuery(rest);
                case "kip848" -> Kip848.run(rest);
                default -> throw new IllegalArgumentException("unknown scenario " + scenario);
            };
        } catch (Throwable e) {
            fail(scenario, Clients.describe(e));
            return;
        }
        result.put("client_version", org.apache.kafka.common.utils.AppInfoParser.getVersion());
        System.out.println(Json.write(result));
        System.out.flush();
        System.exit(0);
    }

    static void fail(String scenario, String what) {
        System.out.flush();
        System.err.println("KRILL-JVM-FAIL " + scenario + ": " + what.replace('\n', ' '));
        System.err.flush();
        System.exit(1);
    }

    private static void startWatchdog(String scenario, long deadlineS) {
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(deadlineS * 1000);
            } catch (InterruptedException e) {
                return;
            }
            System.err.println("KRILL-JVM-FAIL " + scenario + ": not done within " + deadlineS + "s");
            System.err.flush();
            Runtime.getRuntime().halt(3);
        }, "krill-watchdog");
        watchdog.setDaemon(true);
        watchdog.start();
    }
}
